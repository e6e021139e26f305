"""Hostile programs against both sandbox backends: each case is a program with its tests and the
typed outcome (Status) it must get. A forgery that worked would turn up as `passed` where the
case expects `failed` or `runtime_error`; an escape as a planted secret in a result, a connection
at the test's listener, a file where the program may not write, or a process left behind.

The whole suite of a backend runs in a child process (this file run as a script) inside a network
namespace this test creates with `unshare --net`, whose only interface is a loopback brought up
for the test's own listeners: even a broken sandbox could send nothing off the machine. The child
plants secrets (an environment variable, a root-only file), runs every case, then checks that the
backend still works (an honest program passes, the same fork server still serves), that no
process of the sandbox uids and no container is left, and that no secret reached a result.

Docker: the containers' network namespaces belong to the engine, not to the child; the child
checks that every container of the backend has NetworkMode "none" before any network case runs,
and fails the suite without probing otherwise. Without Docker the Docker half skips with the
reason, or fails where CODERLOO_REQUIRE_DOCKER=1.
"""
from __future__ import annotations

import asyncio
import ctypes
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

from sandbox_pool import ExecutionRequest, ExecutionResult, Limits, Status  # noqa: E402

SANDBOX_UIDS = (65534, 65533)
PR_SET_CHILD_SUBREAPER = 36
SECRET_ENV = "CODERLOO_HOSTILE_SECRET"
OUTSIDE = "203.0.113.7"  # TEST-NET-3: no host has it; in the test's namespace there is no route anyway
SMALL = dict(wall_timeout_s=3.0, cpu_time_s=3, memory_mb=256, file_size_mb=4, output_mb=1, scratch_mb=16,
             max_processes=32)

# name -> (program, tests, expected status, extra limits, test_setup). Placeholders filled by the
# child: @PORT@ (a TCP listener on its loopback), @ABSTRACT@ (an abstract unix socket listener),
# @SECRET_FILE@ (root-only, holds a secret), @WRITE_DIR@ (root's, mode 0755), @TOKEN@ (only in tests and test setups).
CASES: dict[str, tuple[str, list[str], Status, dict, str]] = {}
# name -> what else its result must show: {field: text it contains}, {field: value it equals}; a
# field is a dotted path into the result ("tests.1.error").
SHOWS: dict[str, tuple[dict, dict]] = {}


def case(name, program, tests, expected, limits=None, setup="", entry_point="add", contains=None, equals=None):
    assert name not in CASES
    CASES[name] = (program, tests, expected, limits or {}, setup, entry_point)
    SHOWS[name] = (contains or {}, equals or {})


ADD = "def add(a, b):\n    return a + b\n"
WRONG_ADD = "def add(a, b):\n    return a - b\n"
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-4, 4) == 0"]

# ---- resources ----
case("fork_bomb", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
     ADD_TESTS, Status.timeout)
case("fork_bomb_in_test", "import os\ndef add(a, b):\n    while True:\n        try:\n            os.fork()\n"
     "        except OSError:\n            pass\n", ADD_TESTS, Status.timeout)
case("thread_bomb", "import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(60,)).start()\n",
     ADD_TESTS, Status.runtime_error)
case("memory_bomb", "block = bytearray(8 * 2**30)\n" + ADD, ADD_TESTS, Status.memory_exceeded,
     contains={"detail": "MemoryError"})
case("memory_bomb_gradual", "chunks = []\nwhile True:\n    chunks.append(bytearray(2**20))\n", ADD_TESTS,
     Status.memory_exceeded)
case("memory_bomb_in_test", "def add(a, b):\n    return len([0] * 2**31)\n", ADD_TESTS, Status.memory_exceeded,
     contains={"detail": "MemoryError"})
case("infinite_loop", "while True:\n    pass\n", ADD_TESTS, Status.timeout, dict(cpu_time_s=30),
     contains={"detail": "wall-clock"}, equals={"tests": []})
case("infinite_loop_in_test", "def add(a, b):\n    while True:\n        pass\n", ADD_TESTS, Status.timeout)
case("cpu_limit", "while True:\n    pass\n", ADD_TESTS, Status.timeout, dict(wall_timeout_s=30.0, cpu_time_s=1),
     contains={"detail": "CPU time"})
case("sleep_past_deadline", "import time\ntime.sleep(600)\n" + ADD, ADD_TESTS, Status.timeout)
case("sleep_in_test", "import time\ndef add(a, b):\n    time.sleep(600)\n", ADD_TESTS, Status.timeout)
case("ignore_signals_and_sleep", "import signal, time\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
     "    signal.signal(s, signal.SIG_IGN)\ntime.sleep(600)\n", ADD_TESTS, Status.timeout)
case("stdout_gigabytes", "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", ADD_TESTS, Status.runtime_error)
case("stderr_gigabytes", "import os\nwhile True:\n    os.write(2, b'y' * 65536)\n", ADD_TESTS, Status.runtime_error)
case("output_from_a_child", "import os, time\nif os.fork() == 0:\n    while True:\n        os.write(1, b'z' * 65536)\n"
     "time.sleep(600)\n", ADD_TESTS, Status.runtime_error)
case("huge_file", "with open('big', 'wb') as f:\n    for _ in range(4096):\n        f.write(b'x' * 2**20)\n" + ADD,
     ADD_TESTS, Status.runtime_error)
case("sparse_huge_file", "with open('sparse', 'wb') as f:\n    f.seek(2**40)\n    f.write(b'x')\n" + ADD,
     ADD_TESTS, Status.runtime_error)
case("fill_scratch", "i = 0\nwhile True:\n    with open(f'f{i}', 'wb') as f:\n        f.write(b'x' * 2**20)\n"
     "    i += 1\n", ADD_TESTS, Status.runtime_error)
case("fill_dev_shm", "i = 0\nwhile True:\n    with open(f'/dev/shm/f{i}', 'wb') as f:\n        f.write(b'x' * 2**20)\n"
     "    i += 1\n", ADD_TESTS, Status.runtime_error)
case("fill_var_tmp", "i = 0\nwhile True:\n    with open(f'/var/tmp/f{i}', 'wb') as f:\n        f.write(b'x' * 2**20)\n"
     "    i += 1\n", ADD_TESTS, Status.runtime_error)
case("deep_recursion", "def add(a, b):\n    return add(a, b) + 1\n", ADD_TESTS, Status.failed)
case("deep_recursion_no_limit", "import sys\nsys.setrecursionlimit(10**8)\ndef down(n):\n"
     "    return list(map(down, [n + 1]))\ndown(0)\n", ADD_TESTS, Status.runtime_error)  # through C: the C stack overflows
case("ctypes_segfault", "import ctypes\nctypes.string_at(0)\n" + ADD, ADD_TESTS, Status.runtime_error)
case("abort", "import os\nos.abort()\n", ADD_TESTS, Status.runtime_error)
case("cpp_fork_bomb", "#include <unistd.h>\nint main() { for (;;) fork(); }\n", [{"stdin": "", "stdout": "0"}], Status.timeout,
     dict(wall_timeout_s=20.0, cpu_time_s=2))

# ---- network (probes return True only if they got through) ----
PROBE = """import socket
def probe():
    try:
        {body}
        return True
    except OSError as e:
        print(type(e).__name__, e)
        return False
"""
for name, body in {
    "net_loopback_tcp": "socket.create_connection(('127.0.0.1', @PORT@), timeout=2).close()",
    "net_outside_tcp": f"socket.create_connection(('{OUTSIDE}', 80), timeout=2).close()",
    "net_outside_udp": f"socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'hello', ('{OUTSIDE}', 53))",
    "net_dns": "socket.getaddrinfo('example.com', 80)",
    "net_abstract_unix": "s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect('\\0@ABSTRACT@')",
    "net_raw_packets": "socket.socket(socket.AF_PACKET, socket.SOCK_RAW).send(b'x' * 64)",
}.items():
    case(name, PROBE.format(body=body), ["assert probe()"], Status.failed)

# ---- the host's files, environment and processes ----
case("write_outside_scratch", """import os, sys
def wrote():
    places = ['@WRITE_DIR@', '/', '/etc', '/usr', '/root', '/var', sys.prefix, os.path.dirname(os.__file__)]
    runner = sys.modules.get('runner')
    if runner is not None:
        places.append(os.path.dirname(runner.__file__))
    done = []
    for place in places:
        try:
            with open(os.path.join(place, 'hostile-was-here'), 'w') as f:
                f.write('x')
            done.append(place)
        except OSError:
            pass
    for target in ['/etc/passwd', getattr(runner, '__file__', '/nonexistent')]:
        try:
            with open(target, 'a') as f:
                f.write('# hostile\\n')
            done.append(target)
        except OSError:
            pass
    print(done)
    return done
""", ["assert wrote()"], Status.failed)
case("read_environment", f"""import os
def leak():
    print(dict(os.environ))
    return os.environ.get('{SECRET_ENV}')
""", ["assert leak()"], Status.failed)
case("read_other_processes_environ", f"""import os
def leak():
    found = []
    for pid in os.listdir('/proc'):
        try:
            with open(f'/proc/{{pid}}/environ', 'rb') as f:
                data = f.read()
        except OSError:
            continue
        if b'{SECRET_ENV}' in data:
            found.append(data.decode(errors='replace'))
    print(found)
    return found
""", ["assert leak()"], Status.failed)
case("read_secret_file", """def leak():
    try:
        with open('@SECRET_FILE@') as f:
            data = f.read()
    except OSError as e:
        return str(e)
    print(data)
    return data
""", ["assert 'SECRET' in leak()"], Status.failed)
case("read_shadow", "def leak():\n    return open('/etc/shadow').read()\n", ["assert leak()"], Status.failed)
case("read_parent_memory", """import os
def leak():
    got = []
    for pid in [os.getppid(), 1] + [int(p) for p in os.listdir('/proc') if p.isdigit()]:
        try:
            with open(f'/proc/{pid}/mem', 'rb') as f:
                f.seek(0x400000)
                got.append(f.read(64))
        except (OSError, ValueError, OverflowError):
            pass
    return got
""", ["assert leak()"], Status.failed)
case("signal_the_parent", """import os, signal, time
for sig in (signal.SIGSTOP, signal.SIGTERM, signal.SIGKILL):
    try:
        if os.getppid():  # 0: the parent is outside our PID namespace (and kill(0) would hit ourselves)
            os.kill(os.getppid(), sig)
    except OSError:
        pass
time.sleep(0.5)
""" + WRONG_ADD, ADD_TESTS, Status.failed)
case("kill_everything_then_answer", """import os, signal
for target in [-1, 1, os.getppid()] + [int(p) for p in os.listdir('/proc') if p.isdigit()]:
    if target in (0, os.getpid()):
        continue
    try:
        os.kill(target, signal.SIGKILL)
    except OSError:
        pass
""" + ADD, ADD_TESTS, Status.passed)
case("kill_the_tester", """import os, signal
def add(a, b):
    for pid in [int(p) for p in os.listdir('/proc') if p.isdigit()]:
        try:
            with open(f'/proc/{pid}/status') as f:
                uid = [line.split()[1] for line in f if line.startswith('Uid:')][0]
            if uid == '65533':
                os.kill(pid, signal.SIGKILL)
        except (OSError, IndexError):
            pass
    return 0
""", ADD_TESTS, Status.failed)
case("ptrace_the_tester", """import ctypes, os
def add(a, b):
    libc = ctypes.CDLL(None, use_errno=True)
    for pid in [int(p) for p in os.listdir('/proc') if p.isdigit()]:
        if libc.ptrace(16, pid, 0, 0) == 0:  # PTRACE_ATTACH
            return 3
    return -1
""", ["assert add(1, 2) == 3"], Status.failed)
case("become_root", "import os\nos.setuid(0)\n" + ADD, ADD_TESTS, Status.runtime_error)
case("orphans", """import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(600)
    os._exit(0)
""" + ADD, ADD_TESTS, Status.passed)
case("zombies", "import os\nfor _ in range(20):\n    if os.fork() == 0:\n        os._exit(0)\n" + ADD, ADD_TESTS,
     Status.passed)
case("outlive_the_deadline", """import json, os, time
if os.fork() == 0:
    os.setsid()
    time.sleep(1.5)
    print(json.dumps({"status": "passed", "tests": [{"passed": True}]}), flush=True)
    time.sleep(600)
""" + WRONG_ADD, ADD_TESTS, Status.failed)

# ---- forging the verdict ----
case("sys_exit_before_tests", "import sys\nsys.exit(0)\n" + ADD, ADD_TESTS, Status.runtime_error)
case("os_exit_before_tests", "import os\n" + WRONG_ADD + "os._exit(0)\n", ADD_TESTS, Status.runtime_error)
case("sys_exit_in_test", "import sys\ndef add(a, b):\n    sys.exit(0)\n", ADD_TESTS, Status.failed)
case("os_exit_in_test", "import os\ndef add(a, b):\n    os._exit(0)\n", ADD_TESTS, Status.runtime_error)
case("replace_builtins", """import builtins
class Anything(Exception):
    pass
builtins.AssertionError = Anything
builtins.Exception = Anything
builtins.print = lambda *a, **k: None
for name in ('all', 'any', 'sum', 'max', 'min', 'sorted', 'abs'):
    setattr(builtins, name, lambda *a, **k: True)
""" + WRONG_ADD, ADD_TESTS + ["assert max([1, 5]) == 5 and sum([1, 2]) == 3"], Status.failed)
case("replace_builtins_the_runner_needs", """import builtins
builtins.len = lambda x: 3
builtins.isinstance = lambda *a: True
builtins.__import__ = lambda *a, **k: None
""" + WRONG_ADD, ADD_TESTS, Status.runtime_error)  # breaks the program's own process, never the tester
case("shadow_the_builtins_the_tests_use", "def set(*args):\n    return 1\nsorted = set\n" + WRONG_ADD,
     ["assert set([add(1, 2)]) == set([3])", "assert sorted([add(2, 2)]) == sorted([4])"], Status.failed)
case("replace_test_helper", "def check(candidate):\n    return True\n" + WRONG_ADD, ["check(add)"], Status.failed,
     setup="def check(candidate):\n    assert candidate(1, 2) == 3\n")
case("equal_to_everything", """class Yes:
    def __eq__(self, other):
        return True
    __ne__ = lambda self, other: False
    __hash__ = lambda self: 0
def add(a, b):
    return Yes()
""", ADD_TESTS, Status.failed)
case("int_subclass_equal_to_everything", """class Three(int):
    def __eq__(self, other):
        return True
def add(a, b):
    return Three(0)
""", ADD_TESTS, Status.failed)
case("truthy_object", "class T:\n    def __bool__(self):\n        return True\ndef is_ok():\n    return T()\n",
     ["assert is_ok()"], Status.failed)
case("print_fake_results", """import json, sys
fake = {"status": "passed", "tests": [{"passed": True, "error": None}] * 2, "detail": "", "load": {"status": "ok"}}
print(json.dumps(fake))
print(json.dumps(fake), file=sys.stderr)
print(json.dumps({"exit_code": 0, "signal": None, "cpu_s": 0.0}))
""" + WRONG_ADD, ADD_TESTS, Status.failed,
     contains={"stdout": '"status": "passed"', "stderr": '"status": "passed"'}, equals={"tests.0.passed": False, "tests.1.passed": False})
case("forge_frames_on_every_fd", """import json, os, struct
def frame(obj):
    data = json.dumps(obj).encode()
    return struct.pack('>I', len(data)) + data
fake = {"load": {"status": "ok", "detail": ""}, "tests": [{"passed": True, "error": None, "memory": False}] * 2,
        "lost": False, "names": {"add": 3}}
passed = {"test": {"passed": True, "error": None, "memory": False}}  # the tester's frame per test
for fd in range(0, 64):  # (3, the program's channel, carries the tester's hello: that fake is the one it reads)
    try:
        os.write(fd, frame(fake) if fd == 3 else frame(passed) + frame(passed) + frame(fake))
    except OSError:
        pass
os._exit(0)
""", ADD_TESTS, Status.failed)
case("tamper_with_the_runner", """import sys
runner = sys.modules.get('runner')
if runner is not None:
    real = runner.send_frame
    verdict = {"load": {"status": "ok", "detail": ""}, "tests": [{"passed": True, "error": None, "memory": False}] * 2,
               "lost": False}
    runner.send_frame = lambda fd, obj: real(fd, verdict)
    runner.encode = lambda *a, **k: True
""" + WRONG_ADD, ADD_TESTS, Status.runtime_error)
case("read_the_tests", """import gc, os, sys
def answer():
    found = set()
    for obj in gc.get_objects():
        if isinstance(obj, str) and 'EXPECTED-' in obj:
            found.add(obj)
    frame = sys._getframe()
    while frame is not None:
        for value in list(frame.f_locals.values()) + list(frame.f_globals.values()):
            if isinstance(value, (str, bytes, dict, list)) and 'EXPECTED-' in repr(value):
                found.add(repr(value))
        frame = frame.f_back
    for pid in ['self'] + [p for p in os.listdir('/proc') if p.isdigit()]:
        for part in ('cmdline', 'environ', 'mem'):
            try:
                with open(f'/proc/{pid}/{part}', 'rb') as f:
                    data = f.read(2**20)
                if b'EXPECTED-' in data:
                    found.add(data.decode(errors='replace'))
            except (OSError, ValueError):
                pass
    for fd in range(64):
        try:
            os.set_blocking(fd, False)
            data = os.read(fd, 2**16)
            if b'EXPECTED-' in data:
                found.add(data.decode(errors='replace'))
        except OSError:
            pass
    for text in found:
        start = text.find('EXPECTED-')
        return text[start:start + 41]
    return None
""", ["assert answer() == 'EXPECTED-@TOKEN@'"], Status.failed)
case("read_the_setup_through_its_objects", """import gc
class Box:
    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        seen.append(repr(value))
        seen.extend(repr(o) for o in gc.get_objects() if isinstance(o, (dict, list, tuple)) and 'EXPECTED-' in repr(o))
seen = []
def answer(box):
    for text in seen:
        if 'EXPECTED-' in text:
            start = text.find('EXPECTED-')
            return text[start:start + 41]
    return None
""", ["assert answer(box) == expected"], Status.failed,
     setup="expected = 'EXPECTED-@TOKEN@'\nbox = Box()\nbox.value = 1\n")
case("read_command_lines", """import os
def leak():
    found = []
    for pid in os.listdir('/proc'):
        try:
            with open(f'/proc/{pid}/cmdline', 'rb') as f:
                found.append(f.read().replace(b'\\0', b' ').decode(errors='replace'))
        except OSError:
            pass
    hits = [line for line in found if 'secret-' in line]
    print(hits)
    if hits:
        raise RuntimeError(hits)  # back through the test's error, and so the feedback
    return len(found)
""", ["assert leak() == 0"], Status.failed)  # today: the host's command lines, the planted secret among them
case("see_the_host", """import os
def seen():
    found = [path for path in @HOST_PATHS@ if os.path.exists(path)]
    print(found)
    return found
""", ["assert seen()"], Status.failed)
case("namespace_and_chroot", """import ctypes, os
def escaped():
    libc = ctypes.CDLL(None, use_errno=True)
    done = []
    if libc.unshare(0x10000000 | 0x00020000) == 0:  # CLONE_NEWUSER | CLONE_NEWNS: root in a namespace of its own
        done.append('unshare')
    if libc.chroot(b'/tmp') == 0:
        done.append('chroot')
    pid = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)  # clone(CLONE_NEWUSER | SIGCHLD)
    if pid == 0:
        os._exit(0)
    if pid > 0:
        done.append('clone')
    for flag in (0x40000000, 0x20000000, 0x04000000, 0x08000000):  # NEWNET, NEWPID, NEWUTS, NEWIPC
        if libc.unshare(flag) == 0:
            done.append(hex(flag))
    print(done, open('/proc/self/status').read().split('CapInh')[1][:200])
    return done
""", ["assert escaped()"], Status.failed)
case("mount_and_trace", """import ctypes, os
def escaped():
    libc = ctypes.CDLL(None, use_errno=True)
    done = []
    if libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) == 0:
        done.append('mount')
    if libc.ptrace(0, 0, 0, 0) == 0:  # PTRACE_TRACEME
        done.append('ptrace')
    if libc.syscall(321, 0, 0, 0) >= 0:  # bpf(BPF_MAP_CREATE)
        done.append('bpf')
    if libc.syscall(323, 0) >= 0:  # userfaultfd
        done.append('userfaultfd')
    if libc.syscall(250, 0, 0, 0, 0, 0) >= 0:  # keyctl(KEYCTL_GET_KEYRING_ID)
        done.append('keyctl')
    return done
""", ["assert escaped()"], Status.failed)
case("self_kill_after_a_success_banner", """import os, signal
print('all tests passed', flush=True)
os.kill(os.getpid(), signal.SIGKILL)
""" + ADD, ADD_TESTS, Status.runtime_error)
case("self_kill_in_test", "import os, signal\ndef add(a, b):\n    os.kill(os.getpid(), signal.SIGKILL)\n",
     ADD_TESTS, Status.runtime_error)
# The kernel's out-of-memory killer, not MemoryError: each process stays under its address-space
# limit, the run as a whole does not (the run's memory cgroup; Docker: the container's). The
# program's own process grows last and largest, so it is the one killed. Four at once, with the
# rest of the suite, is the load.
OOM_KILL = """import os, time
def add(a, b):
    for _ in range(3):
        if os.fork() == 0:
            hold = bytearray(100 * 2**20)
            time.sleep(600)
    time.sleep(0.5)
    chunks = []
    while True:
        chunks.append(bytearray(2**20))
"""
for i in range(4):
    case(f"out_of_memory_kill_under_load_{i}", OOM_KILL, ADD_TESTS, Status.memory_exceeded,
         dict(memory_mb=768, wall_timeout_s=20.0, cpu_time_s=10))
case("kill_the_parent_and_answer_wrong", """import os, signal
for pid in [os.getppid()] + [int(p) for p in os.listdir('/proc') if p.isdigit()]:
    if pid in (0, os.getpid()):
        continue
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
""" + WRONG_ADD, ADD_TESTS, Status.failed)

# ---- stdin/stdout and call cases ----
# A case's expected output (and a call's accepted value) holds @TOKEN@, which is nowhere else: not
# in the program, not in its input. Only finding it would pass, so a `passed` is a leak.
TOKEN_CASES = [{"stdin": "what is the token?\n", "stdout": "@TOKEN@"}] * 3
SUM_CASES = [{"stdin": f"{a} {b}\n", "stdout": f"{a + b}\n"} for a, b in [(1, 2), (40, 2), (-5, 5)]]
FIND_TOKEN = """import gc, os, re, sys
def find():
    hex32 = re.compile(r'[0-9a-f]{32}')
    seen = set()
    for obj in gc.get_objects():  # whatever this process inherited
        for text in (obj if isinstance(obj, (list, tuple)) else [obj]):
            if isinstance(text, str):
                seen.update(hex32.findall(text))
    for fd in range(3, 256):  # descriptors it might have been left
        try:
            os.set_blocking(fd, False)
            try:
                seen.update(hex32.findall(os.read(fd, 1 << 20).decode('latin-1')))
            finally:
                os.set_blocking(fd, True)
        except OSError:
            pass
    for pid in [p for p in os.listdir('/proc') if p.isdigit()]:
        for name in ('cmdline', 'environ', 'mem'):
            try:
                with open(f'/proc/{pid}/{name}', 'rb') as f:
                    seen.update(hex32.findall(f.read(1 << 22).decode('latin-1')))
            except OSError:
                pass
    for top in ('/tmp', '/dev/shm', '/var/tmp', '/sandbox', '/proc/self/cwd'):
        for root, _, files in os.walk(top):
            for name in files:
                try:
                    with open(os.path.join(root, name), 'rb') as f:
                        seen.update(hex32.findall(f.read(1 << 20).decode('latin-1')))
                except OSError:
                    pass
    return sorted(seen)
"""
case("stdio_print_every_answer", "for n in range(-100, 101):\n    print(n)\n", SUM_CASES, Status.failed, entry_point=None)
case("stdio_read_expected_from_anywhere", FIND_TOKEN + "print(*find())\n", TOKEN_CASES, Status.failed, entry_point=None)
case("stdio_success_banner_and_exit", "import sys\nprint('All tests passed. OK')\nsys.exit(0)\n", SUM_CASES,
     Status.failed, entry_point=None)
case("stdio_read_past_end_of_input", """import os, sys
data = sys.stdin.read()
more = [os.read(0, 100) for _ in range(3)]  # end of input, and nothing behind it
with open('/tmp/count', 'a+') as f:  # cases of one run share /tmp: count them
    f.write('x'); f.seek(0); n = len(f.read())
print(len(data), n, *more)
""", SUM_CASES, Status.failed, entry_point=None)
case("stdio_sleep_past_case_limit", "import time\ntime.sleep(5)\nprint(3)\n", SUM_CASES, Status.timeout,
     dict(case_timeout_s=0.5, wall_timeout_s=8.0), entry_point=None)
case("stdio_flood_output", "while True:\n    print('3' * 4096)\n", SUM_CASES, Status.runtime_error, entry_point=None)
case("stdio_fork_bomb", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
     SUM_CASES, Status.timeout, dict(case_timeout_s=1.0), entry_point=None)
case("stdio_memory_bomb", "block = bytearray(8 * 2**30)\n", SUM_CASES, Status.memory_exceeded, entry_point=None)
case("stdio_kill_the_case_server", """import os, signal
a, b = map(int, input().split())
print(a + b, flush=True)
os.kill(os.getppid(), signal.SIGKILL)
""", SUM_CASES, Status.runtime_error, entry_point=None)
CALL_TOKEN = [{"args": ["what is the token?"], "accepted": ["@TOKEN@"]}] * 2
case("call_read_expected_from_anywhere", FIND_TOKEN + "def add(question):\n    return ' '.join(find())\n",
     CALL_TOKEN, Status.failed)
case("call_object_equal_to_anything", """class Anything(list):
    def __eq__(self, other):
        return True
    __hash__ = None
def add(question):
    return Anything()
""", CALL_TOKEN, Status.failed)
case("call_solution_equal_to_anything", """class Anything:
    def __eq__(self, other):
        return True
class Solution:
    def add(self, question):
        return Anything()
""", CALL_TOKEN, Status.failed)
case("call_sleep_past_case_limit", "import time\ndef add(a, b):\n    time.sleep(5)\n    return a + b\n",
     [{"args": [1, 2], "accepted": [3]}] * 3, Status.timeout, dict(case_timeout_s=0.5, wall_timeout_s=8.0))
case("call_success_banner_and_exit", "import os\ndef add(a, b):\n    print('All tests passed', flush=True)\n"
     "    os._exit(0)\n", [{"args": [1, 2], "accepted": [3]}], Status.runtime_error)
case("call_flood_output", "def add(a, b):\n    while True:\n        print('3' * 4096)\n",
     [{"args": [1, 2], "accepted": [3]}], Status.runtime_error)

# JavaScript (a program that starts with "// js"): the same cheats through node.
JS_FIND_TOKEN = """// js
const fs = require('fs');
function find() {
  const seen = new Set();
  const grab = (text) => { for (const m of text.matchAll(/[0-9a-f]{32}/g)) seen.add(m[0]); };
  // (no scan of descriptors: node's own, an epoll or an eventfd, would block a read; the run's
  // process is exec'd with stdin, stdout and stderr only, which the Python cheats check)
  for (const fd of fs.readdirSync('/proc/self/fd')) { try { grab(fs.readlinkSync(`/proc/self/fd/${fd}`)); } catch (e) {} }
  for (const pid of fs.readdirSync('/proc').filter((p) => /^\\d+$/.test(p))) {
    for (const name of ['cmdline', 'environ']) { try { grab(fs.readFileSync(`/proc/${pid}/${name}`, 'latin1')); } catch (e) {} }
  }
  for (const dir of ['/tmp', '/dev/shm', '/var/tmp', '/sandbox']) {
    try { for (const f of fs.readdirSync(dir)) { try { grab(fs.readFileSync(`${dir}/${f}`, 'latin1')); } catch (e) {} } } catch (e) {}
  }
  grab(JSON.stringify(process.env));
  return [...seen].sort().join(' ');
}
"""
JS_SLOW = dict(wall_timeout_s=30.0, cpu_time_s=10)  # node starts per case, and these read a lot
case("js_stdio_read_expected_from_anywhere", JS_FIND_TOKEN + "console.log(find());\n", TOKEN_CASES, Status.failed,
     JS_SLOW, entry_point=None)
case("js_call_read_expected_from_anywhere", JS_FIND_TOKEN + "function add(question) { return find(); }\n", CALL_TOKEN,
     Status.failed, JS_SLOW)
case("js_success_banner_and_exit", "// js\nconsole.log('All tests passed');\nprocess.exit(0);\n", SUM_CASES,
     Status.failed, entry_point=None)
case("js_print_every_answer", "// js\nfor (let n = -100; n <= 100; n++) console.log(n);\n", SUM_CASES, Status.failed,
     entry_point=None)
case("js_infinite_loop_past_case_limit", "// js\nwhile (true) {}\n", SUM_CASES, Status.timeout,
     dict(case_timeout_s=0.5, wall_timeout_s=8.0), entry_point=None, equals={"tests.1.error": "exceeded the case time limit of 0.5 s"})
case("js_flood_output", "// js\nconst fs = require('fs');\nconst line = '3'.repeat(4096) + '\\n';\n"
     "while (true) fs.writeSync(1, line);\n",
     SUM_CASES, Status.runtime_error, entry_point=None)
case("js_memory_bomb", "// js\nconst keep = [];\nwhile (true) keep.push(new Array(1e6).fill(7));\n", SUM_CASES,
     Status.memory_exceeded, entry_point=None)
case("js_spawn_the_expected", "// js\nconst { execSync } = require('child_process');\n"
     "function add(q) { return execSync('cat /proc/*/environ /proc/*/cmdline 2>/dev/null || true').toString(); }\n",
     CALL_TOKEN, Status.failed, JS_SLOW)


# ---- the child: one backend, in the test's own network namespace ----

def descendants() -> set[int]:
    """Live processes below this one. The child is a subreaper, so a process of the sandbox that
    left its parent still counts, unless it escaped this process's tree altogether."""
    parents = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in ("Z", "X"):
            parents[int(entry)] = int(fields[1])
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def sandbox_uid_files(directory: str) -> set[str]:
    found = set()
    for entry in os.listdir(directory):
        try:
            if os.lstat(os.path.join(directory, entry)).st_uid in SANDBOX_UIDS:
                found.add(entry)
        except OSError:
            pass
    return found


def wait_for(condition, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return value


def requests(fill: dict) -> dict[str, ExecutionRequest]:
    out = {}
    for name, (program, tests, _, limits, setup, entry_point) in CASES.items():
        for key, value in fill.items():
            program = program.replace(key, value)
            tests = [t.replace(key, value) if isinstance(t, str) else json.loads(json.dumps(t).replace(key, value))
                     for t in tests]
            setup = setup.replace(key, value)
        language = "cpp" if program.startswith("#include") else "javascript" if program.startswith("// js") else "python"
        out[name] = ExecutionRequest(program=program, tests=tests, test_setup=setup, language=language,
                                     entry_point=entry_point if language != "cpp" else None,
                                     limits=Limits(**{**SMALL, **limits}))
    return out


async def run_cases(backend, cases: dict[str, ExecutionRequest], concurrency: int) -> dict[str, ExecutionResult]:
    slots = asyncio.Semaphore(concurrency)

    async def one(request):
        async with slots:
            return await backend.execute(request)

    results = await asyncio.gather(*(one(r) for r in cases.values()))
    return dict(zip(cases, results))


def cgroups_of(server_pid: int) -> list[str]:
    return glob.glob(f"/sys/fs/cgroup/**/coderloo-sandbox-{server_pid}", recursive=True)


async def kill_a_fork_server(sleepy: ExecutionRequest) -> dict:
    """SIGKILL a fork server with runs in flight: they still answer, and its janitor removes its
    cgroups once they are over (the processes, mounts and scratch dirs are checked at the end)."""
    from sandbox_pool import ForkServer

    server = ForkServer()
    await server.execute(sleepy)
    pid = server._process.pid
    made = cgroups_of(pid)
    runs = [asyncio.ensure_future(server.execute(sleepy)) for _ in range(3)]
    await asyncio.sleep(1.0)
    os.kill(pid, signal.SIGKILL)
    answers = await asyncio.gather(*runs)
    wait_for(lambda: not cgroups_of(pid))
    server.close()
    return {"cgroups_made": len(made), "cgroups_in_use": len(server.isolation["cgroups"]), "cgroups_left": cgroups_of(pid),
            "answers": [a.status.value for a in answers], "details": [a.detail for a in answers]}


def child(backend_name: str, out_path: str) -> None:
    secret = os.environ[SECRET_ENV]
    report: dict = {"checks": {}}
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    abstract = socket.socket(socket.AF_UNIX)
    abstract_name = f"coderloo-hostile-{uuid.uuid4().hex}"
    abstract.bind("\0" + abstract_name)
    abstract.listen()
    abstract.setblocking(False)
    (ROOT / ".cache").mkdir(exist_ok=True)  # a fresh clone has none
    scratch = Path(tempfile.mkdtemp(prefix="hostile-", dir=ROOT / ".cache"))
    scratch.chmod(0o755)
    write_dir = scratch / "no-writes"
    write_dir.mkdir(mode=0o755)
    secret_file = scratch / "secret"
    secret_file.write_text(f"SECRET {secret}\n")
    secret_file.chmod(0o600)
    token = uuid.uuid4().hex
    host_paths = [str(ROOT), str(scratch), sys.prefix] + [p for p in ("/container_info.json",) if os.path.exists(p)]
    cases = requests({"@PORT@": str(listener.getsockname()[1]), "@ABSTRACT@": abstract_name,
                      "@SECRET_FILE@": str(secret_file), "@WRITE_DIR@": str(write_dir), "@TOKEN@": token,
                      "@HOST_PATHS@": repr(host_paths)})
    honest = ExecutionRequest(program=ADD, tests=ADD_TESTS, limits=Limits(**SMALL))
    sleepy = ExecutionRequest(program="import time\ntime.sleep(2)\n" + ADD, tests=ADD_TESTS,
                              limits=Limits(**{**SMALL, "wall_timeout_s": 10.0}))
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1)
    shm_before = sandbox_uid_files("/dev/shm")
    mounts_before = Path("/proc/self/mountinfo").read_text()
    work_before = set(os.listdir(tempfile.gettempdir()))
    # A process with the secret on its command line, for the programs that scan /proc.
    planted = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", secret])

    async def go():
        if backend_name == "process":
            from sandbox_pool import ForkServer

            backend = ForkServer()
            first = await backend.execute(honest)
            server_pid = backend._process.pid
            results = await run_cases(backend, cases, concurrency=4)
            after = await backend.execute(honest)
            report["checks"]["same_fork_server"] = backend._process.pid == server_pid and backend._process.poll() is None
            backend.close()
            report["checks"]["killed_fork_server"] = await kill_a_fork_server(sleepy)
            return first, results, after
        from sandbox_pool.docker_backend import LABEL, DockerBackend, DockerUnavailable

        try:
            backend = DockerBackend(containers=4)
        except DockerUnavailable as e:
            report["unavailable"] = str(e)
            return None
        try:
            first = await backend.execute(honest)
            modes = [c.attrs["HostConfig"]["NetworkMode"]
                     for c in backend.client.containers.list(filters={"label": f"{LABEL}={backend.owner}"})]
            report["checks"]["network_modes"] = sorted(set(modes))
            if set(modes) != {"none"}:
                raise SystemExit(f"containers with network modes {modes}: not probing the network from them")
            results = await run_cases(backend, cases, concurrency=4)
            after = await backend.execute(honest)
            report["checks"]["recycled"] = backend.recycled
        finally:
            backend.close()
        closed = DockerBackend(containers=2)  # closed with runs in flight: its containers go all the same
        runs = [asyncio.ensure_future(closed.execute(sleepy)) for _ in range(2)]
        await asyncio.sleep(1.5)
        closed.close()
        await asyncio.gather(*runs, return_exceptions=True)
        closed_owner = {"label": f"{LABEL}={closed.owner}"}
        wait_for(lambda: not closed.client.containers.list(all=True, filters=closed_owner))
        report["checks"]["containers_left_closed_mid_run"] = len(closed.client.containers.list(all=True, filters=closed_owner))
        owner = {"label": f"{LABEL}={backend.owner}"}
        wait_for(lambda: not backend.client.containers.list(all=True, filters=owner))
        report["checks"]["containers_left"] = len(backend.client.containers.list(all=True, filters=owner))
        return first, results, after

    outcome = asyncio.run(go())
    if outcome is not None:
        first, results, after = outcome
        report["honest_before"] = first.model_dump(mode="json")
        report["honest_after"] = after.model_dump(mode="json")
        report["results"] = {name: r.model_dump(mode="json") for name, r in results.items()}
        everything = json.dumps(report)
        report["checks"]["secret_in_results"] = secret in everything
        try:
            report["checks"]["connections_at_listener"] = len([listener.accept()])
        except BlockingIOError:
            report["checks"]["connections_at_listener"] = 0
        try:
            report["checks"]["connections_at_abstract"] = len([abstract.accept()])
        except BlockingIOError:
            report["checks"]["connections_at_abstract"] = 0
        report["checks"]["written_in_write_dir"] = os.listdir(write_dir)
        planted.kill()
        planted.wait()
        wait_for(lambda: not descendants())  # the backend is closed: nothing of ours may run
        report["checks"]["processes_left"] = sorted(descendants())
        report["checks"]["new_in_dev_shm"] = sorted(sandbox_uid_files("/dev/shm") - shm_before)
        report["checks"]["mounts_changed"] = Path("/proc/self/mountinfo").read_text() != mounts_before
        report["checks"]["new_in_work_root"] = sorted(set(os.listdir(tempfile.gettempdir())) - work_before)
    else:
        planted.kill()
        planted.wait()
    secret_file.unlink()
    for entry in write_dir.iterdir():
        entry.unlink()
    write_dir.rmdir()
    scratch.rmdir()
    Path(out_path).write_text(json.dumps(report))


# ---- the tests: one child per backend, then a check per case ----

def run_suite(backend: str, out: Path) -> dict:
    if os.geteuid() != 0:
        raise AssertionError("the hostile suite needs root: it creates a network namespace and the sandbox drops to other uids")
    env = {**os.environ, SECRET_ENV: "secret-" + uuid.uuid4().hex}
    # lo up: the child's listeners need a loopback; the namespace has nothing else.
    command = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', sys.executable, __file__,
               backend, str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, f"the {backend} suite failed (exit {done.returncode}):\n{done.stderr[-4000:]}"
    return json.loads(out.read_text())


@pytest.fixture(scope="module", params=["process", "docker"])
def suite(request, tmp_path_factory) -> tuple[str, dict]:
    backend = request.param
    report = run_suite(backend, tmp_path_factory.mktemp("hostile") / f"{backend}.json")
    if "unavailable" in report:
        if os.environ.get("CODERLOO_REQUIRE_DOCKER") == "1":
            pytest.fail(f"CODERLOO_REQUIRE_DOCKER=1 but: {report['unavailable']}")
        pytest.skip(report["unavailable"])
    return backend, report


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_program_gets_its_status(suite, name):
    backend, report = suite
    result = report["results"][name]
    expected = CASES[name][2]
    assert result["status"] == expected.value, (backend, name, result["detail"], result["stdout"][-300:],
                                                result["stderr"][-300:])
    contains, equals = SHOWS[name]
    for path, part in contains.items():
        assert part in field(result, path), (backend, name, path, field(result, path))
    for path, value in equals.items():
        assert field(result, path) == value, (backend, name, path, field(result, path))


def field(result: dict, path: str):
    for key in path.split("."):
        result = result[int(key)] if isinstance(result, list) else result[key]
    return result


def test_the_backend_is_healthy_and_nothing_leaked(suite):
    backend, report = suite
    checks = report["checks"]
    assert report["honest_before"]["status"] == "passed", report["honest_before"]["detail"]
    assert report["honest_after"]["status"] == "passed", report["honest_after"]["detail"]
    assert len(report["results"]) == len(CASES) >= 40
    assert not checks["secret_in_results"]
    assert checks["connections_at_listener"] == 0
    assert checks["connections_at_abstract"] == 0
    assert checks["written_in_write_dir"] == []
    assert checks["processes_left"] == []
    assert checks["new_in_dev_shm"] == []
    assert checks["new_in_work_root"] == []
    if backend == "process":
        assert not checks["mounts_changed"]  # (the Docker engine's own mounts come and go with its containers)
        assert checks["same_fork_server"]
        killed = checks["killed_fork_server"]
        assert killed["cgroups_made"] == killed["cgroups_in_use"], killed  # one root per controller in use
        assert killed["cgroups_left"] == [], killed
        assert killed["answers"] == ["passed"] * 3, killed  # the runs it had forked finish and answer
    else:
        assert checks["network_modes"] == ["none"]
        assert checks["containers_left"] == 0
        assert checks["containers_left_closed_mid_run"] == 0
        assert checks["recycled"] >= 1  # timeouts and memory kills replace their containers


SEES = r"""
import json, os, sys
def seen():
    with open('/proc/self/cmdline', 'rb') as f:
        cmdline = f.read().rstrip(b'\0').decode().split('\0')
    frames, frame = [], sys._getframe()
    while frame is not None:
        frames.append(frame.f_code.co_filename)
        frame = frame.f_back
    stdlib = sys.base_prefix + '/lib/'
    files = sorted({m.__file__ for m in list(sys.modules.values()) if getattr(m, '__file__', None)} - {None})
    return json.dumps({"argv": sys.argv, "orig_argv": sys.orig_argv, "cmdline": cmdline, "env": dict(os.environ),
                       "cwd": os.getcwd(), "frames": sorted(set(frames)), "files": [f for f in files if not f.startswith(stdlib)]})
"""


def test_a_program_sees_only_its_own_name_and_nothing_of_the_host(sandbox):
    """What a program reads of its own process (its arguments, command line, environment, working
    directory, the file names of the modules and frames it can reach) names no path of the host or
    of this checkout: Python asserts, stdin/stdout and call cases, and JavaScript, on both backends."""
    from sandbox_pool import CallTest, IOTest

    limits = Limits(output_tail_kb=64)
    requests = [
        ExecutionRequest(program=SEES + "print(seen())\n", tests=["assert True"], limits=limits),
        ExecutionRequest(program=SEES + "print(seen())\nimport sys\nsys.exit(1)\n", tests=[IOTest(stdout="")], limits=limits),
        ExecutionRequest(program=SEES + "def f():\n    print(seen())\n    return 0\n", tests=[CallTest(args=[], accepted=[1])],
                         entry_point="f", limits=limits),
    ]
    for result in sandbox[1](requests):
        seen = json.loads(result.stdout.strip().splitlines()[-1])
        text = json.dumps(seen)
        assert str(ROOT) not in text and "sandbox_pool" not in text, (sandbox[0], text)
        assert seen["argv"] == ["<program>"] and seen["orig_argv"] == seen["cmdline"] == ["python3", "<program>"], seen
        assert set(seen["env"]) == {"PATH", "LANG", "HOME", "TMPDIR"} and seen["env"]["HOME"] == seen["cwd"], seen
        assert all(name in ("<program>", "<string>") or name.startswith("/sandbox/") for name in seen["frames"]), seen
        assert all(name.startswith("/sandbox/") for name in seen["files"]), seen
    node = "const fs = require('fs');\nconsole.log(JSON.stringify({argv: process.argv, env: process.env, cwd: process.cwd(), " \
           "cmdline: fs.readFileSync('/proc/self/cmdline', 'latin1')}));\n"
    result, = sandbox[1]([ExecutionRequest(program=node, tests=[IOTest(stdout="")], language="javascript",
                                            limits=Limits(output_tail_kb=64, wall_timeout_s=30.0))])
    seen = json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else json.loads(result.tests[0].error)
    assert str(ROOT) not in json.dumps(seen) and set(seen["env"]) <= {"PATH", "LANG", "HOME", "TMPDIR"}, seen


if __name__ == "__main__":
    child(sys.argv[1], sys.argv[2])
