"""sandbox_pool/confine.py on the real kernel: a forked child drops to uid 65534 the way the
supervisor's children do, confines itself, tries things and reports back as JSON through a pipe.

The probes pass arguments the kernel alone answers with something other than EPERM (EBADF,
EFAULT, a success, ...); a control child runs them without lock_down to show it, so an EPERM from
the confined child is the filter's. These tests need root (to change uid) and x86_64 (the filter).
"""
import ctypes
import errno
import json
import mmap
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from sandbox_pool import confine

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3.11"  # runnable by uid 65534, unlike the project's venv
UNISTD_64 = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
libc = ctypes.CDLL(None, use_errno=True)

# Raw numbers and flags the probes need that os does not export.
SYS_GETPID = 39
PTRACE_TRACEME = 0
KEYCTL_GET_KEYRING_ID = 0
KEY_SPEC_PROCESS_KEYRING = -2
KCMP_FILE = 0
UFFD_USER_MODE_ONLY = 1
# i386 getpid through int 0x80: mov eax, 20; int 0x80; ret
I386_GETPID = b"\xb8\x14\x00\x00\x00\xcd\x80\xc3"

# Probes the kernel refuses to uid 65534 with EPERM by itself (no CAP_SYS_ADMIN).
KERNEL_REFUSES_TOO = {"unshare_net"}


@pytest.fixture(scope="module", autouse=True)
def root_on_x86_64():
    if os.geteuid() != 0:
        pytest.fail("tests/test_confine.py must run as root: its children change uid to 65534")
    if platform.machine() != "x86_64":
        pytest.fail(f"tests/test_confine.py needs x86_64 for the seccomp filter, not {platform.machine()}")


@pytest.fixture(scope="module")
def nobody_dir():
    """A directory uid 65534 can write, outside pytest's root-only tmp_path."""
    path = tempfile.mkdtemp(prefix="confine-")
    os.chown(path, NOBODY, NOBODY)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def syscall(number: int, *args: int) -> int:
    """A raw system call: its result, or minus its errno."""
    result = libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in args))
    return result if result != -1 else -ctypes.get_errno()


def status() -> dict:
    with open("/proc/self/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def in_grandchild(body) -> int:
    """Run body() in a fork; its wait status (exit code body()'s result)."""
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(body())
        finally:
            os._exit(99)
    return os.waitpid(pid, 0)[1]


def i386_getpid_status() -> int:
    """In a fork, a getpid through the i386 ABI (int 0x80): exits 0 if it returned the pid."""
    memory = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    memory.write(I386_GETPID)
    code = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(memory)))
    return in_grandchild(lambda: 0 if code() == os.getpid() else 3)


def clone_new_user() -> int:
    """A raw clone (not glibc's fork) asking for a new user namespace."""
    result = syscall(56, confine.CLONE_NEWUSER | signal.SIGCHLD, 0, 0, 0, 0)
    if result == 0:
        os._exit(0)  # the clone's child, should one be made
    if result > 0:
        os.waitpid(result, 0)
    return result


def user_and_mount_namespace_then_chroot(directory: str) -> dict:
    """The classic way out: a user namespace gives back CAP_SYS_CHROOT and CAP_SYS_ADMIN."""
    unshared = syscall(272, confine.CLONE_NEWUSER | confine.CLONE_NEWNS)
    try:
        os.chroot(directory)
        chrooted = 0
    except OSError as e:
        chrooted = -e.errno
    return {"unshare": unshared, "chroot": chrooted}


PROBES = {
    "unshare_net": lambda: syscall(272, confine.CLONE_NEWNET),
    "clone_newuser": clone_new_user,
    "setns": lambda: syscall(308, -1, 0),
    "mount": lambda: syscall(165, 0, 0, 0, 0, 0),
    "bpf": lambda: syscall(321, 0, 0, 0),
    "keyctl": lambda: syscall(250, KEYCTL_GET_KEYRING_ID, KEY_SPEC_PROCESS_KEYRING, 0),
    "perf_event_open": lambda: syscall(298, 0, 0, -1, -1, 0),
    "userfaultfd": lambda: syscall(323, UFFD_USER_MODE_ONLY),
    "process_vm_readv": lambda: syscall(310, os.getppid(), 0, 0, 0, 0, 0),
    "kcmp": lambda: syscall(312, os.getpid(), os.getpid(), KCMP_FILE, 0, 0),
    "io_uring_setup": lambda: syscall(425, 1, 0),
    "x32_getpid": lambda: syscall(confine.X32_SYSCALL_BIT | SYS_GETPID),
    "clone3": lambda: syscall(435, 0, 0),
}


def ordinary_work(directory: str) -> dict:
    """What a test program does, each step's result (True where it worked)."""
    done = {}
    done["fork"] = in_grandchild(lambda: 0) == 0

    ran = []
    thread = threading.Thread(target=lambda: ran.append(1))
    thread.start()
    thread.join()
    done["thread"] = ran == [1]

    command = [SYSTEM_PYTHON, "-I", "-S", "-c", "print(1)"]
    env = {"PATH": "/usr/bin"}
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=10, check=False)
    done["subprocess"] = (run.returncode, run.stdout, run.stderr) == (0, "1\n", "")

    path = os.path.join(directory, "file.txt")
    with open(path, "w") as f:
        f.write("hello")
    with open(path) as f:
        done["file"] = f.read() == "hello"

    a, b = socket.socketpair()
    a.sendall(b"ping")
    done["socketpair"] = b.recv(4) == b"ping"

    memory = mmap.mmap(-1, 1 << 20)
    memory[:4] = b"data"
    done["mmap"] = memory[:4] == b"data"

    done["sched_getaffinity"] = len(os.sched_getaffinity(0)) > 0
    start = time.monotonic()
    time.sleep(0.01)
    done["sleep"] = time.monotonic() - start >= 0.01

    caught = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: caught.append(signum))
    os.kill(os.getpid(), signal.SIGUSR1)
    done["signal"] = caught == [signal.SIGUSR1]
    return done


def grandchild_status() -> dict:
    """/proc/self/status of a fork of the confined child, through a pipe of its own."""
    r, w = os.pipe()

    def report():
        os.write(w, json.dumps(status()).encode())
        return 0

    code = in_grandchild(report)
    os.close(w)
    with os.fdopen(r) as f:
        return {"code": code, "status": json.loads(f.read() or "{}")}


def confined_report(directory: str) -> dict:
    return {
        "status": status(),
        "namespace": user_and_mount_namespace_then_chroot(directory),
        "probes": {name: probe() for name, probe in PROBES.items()},
        "ptrace_traceme": syscall(101, PTRACE_TRACEME, 0, 0, 0),
        "i386_getpid": i386_getpid_status(),
        "work": ordinary_work(directory),
        "grandchild": grandchild_status(),
    }


def control_report(directory: str) -> dict:
    probes = {name: probe() for name, probe in PROBES.items()}
    return {
        "status": status(),
        "probes": probes,
        "i386_getpid": i386_getpid_status(),
        # last: it leaves this process in the new namespaces
        "namespace": user_and_mount_namespace_then_chroot(directory),
    }


def fill_inheritable_set() -> None:
    """Copy the permitted set into the inheritable one (root may), which the uid change keeps:
    it is then lock_down's to clear."""
    header = (ctypes.c_uint32 * 2)(confine._LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # two words of (effective, permitted, inheritable)
    assert libc.capget(header, data) == 0
    data[2], data[5] = data[1], data[4]
    assert libc.capset(header, data) == 0, os.strerror(ctypes.get_errno())


def in_child(directory: str, body, lock: bool = True) -> dict:
    """Fork; in the child drop to uid 65534 as the supervisor does, lock down (or not), and
    send back body(directory) as JSON."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # not pytest-timeout's handler
            signal.alarm(20)  # a hung probe kills the child, not the test run
            os.chdir(directory)
            fill_inheritable_set()
            confine.drop_bounding_set()
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            if lock:
                confine.lock_down()
            result = body(directory)
        except BaseException as e:  # noqa: BLE001 - the forked child must never return into pytest
            result = {"error": repr(e)}
        os.write(w, json.dumps(result).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    _, wait_status = os.waitpid(pid, 0)
    assert wait_status == 0 and data, f"child ended with wait status {wait_status}, sent {data!r}"
    result = json.loads(data)
    assert "error" not in result, result["error"]
    return result


@pytest.fixture(scope="module")
def confined(nobody_dir):
    return in_child(nobody_dir, confined_report)


@pytest.fixture(scope="module")
def control(nobody_dir):
    return in_child(nobody_dir, control_report, lock=False)


def test_lock_down_leaves_no_capabilities_and_a_filter(confined):
    s = confined["status"]
    assert (s["Seccomp"], s["NoNewPrivs"]) == ("2", "1")
    for field in ("CapBnd", "CapAmb", "CapInh", "CapPrm", "CapEff"):
        assert int(s[field], 16) == 0, (field, s[field])
    assert (s["Uid"].split(), s["Gid"].split(), s["Groups"].strip()) == (["65534"] * 4, ["65534"] * 4, "")


def test_no_user_namespace_and_no_chroot(confined, control):
    assert confined["namespace"] == {"unshare": -errno.EPERM, "chroot": -errno.EPERM}
    # the hole being closed: without lock_down uid 65534 gets both on this machine
    assert control["namespace"] == {"unshare": 0, "chroot": 0}


def test_the_denied_calls_are_refused_with_eperm(confined):
    expected = {name: -errno.EPERM for name in PROBES}
    expected["clone3"] = -errno.ENOSYS  # glibc then falls back to clone
    assert confined["probes"] == expected
    assert confined["ptrace_traceme"] == -errno.EPERM


def test_without_the_filter_the_kernel_answers_those_probes_otherwise(control):
    assert control["status"]["Seccomp"] == "0"
    refused = {name for name, result in control["probes"].items() if result == -errno.EPERM}
    assert refused == KERNEL_REFUSES_TOO, control["probes"]
    assert control["probes"]["clone3"] != -errno.ENOSYS


def test_a_call_through_the_i386_abi_kills_the_process(confined, control):
    assert os.WIFEXITED(control["i386_getpid"]) and os.WEXITSTATUS(control["i386_getpid"]) == 0
    assert os.WIFSIGNALED(confined["i386_getpid"]) and os.WTERMSIG(confined["i386_getpid"]) == signal.SIGSYS


def test_ordinary_work_still_runs(confined):
    steps = ["fork", "thread", "subprocess", "file", "socketpair", "mmap", "sched_getaffinity"]
    steps += ["sleep", "signal"]
    assert confined["work"] == dict.fromkeys(steps, True)


def test_without_lock_down_the_inheritable_set_survives_the_uid_change(control):
    assert int(control["status"]["CapInh"], 16) != 0
    assert int(control["status"]["CapBnd"], 16) == 0  # drop_bounding_set ran


def test_children_inherit_the_lock_down(confined):
    grandchild = confined["grandchild"]
    assert grandchild["code"] == 0
    s = grandchild["status"]
    assert (s["Seccomp"], s["NoNewPrivs"], int(s["CapBnd"], 16), int(s["CapInh"], 16)) == ("2", "1", 0, 0)


def test_drop_bounding_set_needs_cap_setpcap(nobody_dir):
    def after_setuid(directory):
        try:
            confine.drop_bounding_set()
        except OSError as e:
            return {"errno": e.errno, "message": str(e)}
        return {"errno": 0}

    # drop_bounding_set runs in in_child before setuid; here it runs again after
    result = in_child(nobody_dir, after_setuid, lock=False)
    assert result["errno"] == errno.EPERM and "PR_CAPBSET_DROP" in result["message"], result


def test_it_imports_as_a_sibling_module_under_the_system_python():
    folder = Path(confine.__file__).parent
    code = f"import sys; sys.path.insert(0, {str(folder)!r}); import confine; print(confine.SYSCALL_FILTER)"
    run = subprocess.run([SYSTEM_PYTHON, "-I", "-S", "-c", code], capture_output=True, text=True, check=False)
    assert (run.returncode, run.stdout) == (0, "True\n"), run.stderr


def test_every_jump_of_the_filter_is_short():
    program = confine.filter_program()
    assert all(jt <= 1 and jf <= 4 for _, jt, jf, _ in program)
    assert len(program) == 13 + 2 * len(confine.DENIED) + 1 < 4096  # BPF_MAXINSNS
    assert program[-1] == (confine.BPF_RET_K, 0, 0, confine.SECCOMP_RET_ALLOW)


def test_the_numbers_match_the_kernel_header():
    if not UNISTD_64.exists():
        pytest.skip(f"{UNISTD_64} not installed")
    header = dict(re.findall(r"^#define __NR_(\w+) (\d+)$", UNISTD_64.read_text(), re.MULTILINE))
    numbers = {**confine.DENIED, "clone": confine.CLONE, "clone3": confine.CLONE3}
    assert {name: int(header[name]) for name in numbers} == numbers
    for kept in ("personality", "mbind", "set_mempolicy", "clone", "clone3"):
        assert kept not in confine.DENIED
