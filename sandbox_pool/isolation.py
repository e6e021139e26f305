"""The fork server's isolation, set up once when it starts: the network namespace every run
inherits, and what else the machine lets it isolate runs with (the executor image states its own:
container_executor.py). Standard library only, imported by fork_server.py as a sibling.

Each namespace is tried for real in a throwaway child, and the per-run cgroups get roots of the
server's own, made (and tried) here and removed when it exits.
"""
import ctypes
import os
import platform
import signal
import sys
import time

import confine
from confine import CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWUSER
from protocol import SANDBOX_GID, SANDBOX_UID, TESTER_GID, TESTER_UID
from kernel import (
    MS_BIND, MS_NODEV, MS_NOSUID, MS_PRIVATE, MS_RDONLY, MS_REC, MS_REMOUNT, check, enter_root, fork_new_pid_namespace, libc,
    write,
)
from supervisor import SCRATCH_DIRS, Isolation



def unshare_network() -> None:
    """A network namespace of our own, with only a loopback that is down (without root: inside a new
    user namespace)."""
    if libc.unshare(CLONE_NEWNET) == 0:
        return
    first = ctypes.get_errno()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        return
    second = ctypes.get_errno()
    raise OSError(
        second,
        f"cannot isolate the network: unshare(CLONE_NEWNET): {os.strerror(first)}; "
        f"with CLONE_NEWUSER: {os.strerror(second)}",
    )


# What programs, their tests and g++ run from, read-only (on a merged-/usr system the others are
# symlinks into /usr, and stay symlinks).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
DEVICES = ("null", "zero", "full", "random", "urandom")
ETC_FILES = ("ld.so.cache",)  # the dynamic linker's index of /usr/lib; nothing else of the host's /etc
ROOT_SIZE = "size=1m,mode=755"


def build_root(path: str) -> None:
    """Make the root every sandboxed process enters (supervisor.enter_root), at `path`, in a mount namespace of this
    process's own (the host never sees it; it goes when the server and its runs end): a tmpfs,
    read-only once built, holding the system's directories read-only and nosuid, this interpreter's
    (where it lives outside them), an /etc of a passwd and group for the sandbox users and the
    linker's cache, a /dev of the harmless devices, and empty mount points for /proc and the
    scratch dirs, which each run and each process mount for themselves (supervisor.py)."""
    check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    check(libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, ROOT_SIZE.encode()), f"mount tmpfs on {path}")
    bound = []
    for system in SYSTEM_DIRS:
        if os.path.islink(system):
            os.symlink(os.readlink(system), path + system)
        elif os.path.isdir(system):
            bind_read_only(system, path + system)
            bound.append(system)
    for needed in {sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}:
        if not any(needed == b or needed.startswith(b + "/") for b in bound):
            bind_read_only(needed, path + needed)
            bound.append(needed)
    if not os.path.exists(path + sys.executable):  # a virtual environment's link to the interpreter
        os.makedirs(os.path.dirname(path + sys.executable), exist_ok=True)
        os.symlink(os.path.realpath(sys.executable), path + sys.executable)
    os.mkdir(path + "/etc")
    with open(path + "/etc/passwd", "w") as f:
        f.write(f"root:x:0:0::/:/bin/false\nnobody:x:{SANDBOX_UID}:{SANDBOX_GID}::/tmp:/bin/false\n"
                f"tester:x:{TESTER_UID}:{TESTER_GID}::/:/bin/false\n")
    with open(path + "/etc/group", "w") as f:
        f.write(f"root:x:0:\nnogroup:x:{SANDBOX_GID}:\ntester:x:{TESTER_GID}:\n")
    for name in ETC_FILES:
        if os.path.isfile("/etc/" + name):
            bind_read_only("/etc/" + name, path + "/etc/" + name)
    os.mkdir(path + "/dev")
    for name in DEVICES:
        open(path + "/dev/" + name, "w").close()
        check(libc.mount(f"/dev/{name}".encode(), f"{path}/dev/{name}".encode(), None, MS_BIND, None), f"bind /dev/{name}")
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{fd}", f"{path}/dev/{name}")
    os.symlink("/proc/self/fd", path + "/dev/fd")
    for empty in ("/proc", "/var", *SCRATCH_DIRS):
        os.makedirs(path + empty, exist_ok=True)
    check(libc.mount(None, path.encode(), None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None), "remount the root read-only")


def bind_read_only(source: str, target: str) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        open(target, "w").close()  # a mount point for a file
    check(libc.mount(source.encode(), target.encode(), None, MS_BIND | MS_REC, None), f"bind {source}")
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
    check(libc.mount(None, target.encode(), None, flags, None), f"remount {source} read-only")


def probe(work_root: str) -> tuple[Isolation, dict]:
    """What this process may use, found by trying each in a throwaway child; and a summary of it."""
    root = os.geteuid() == 0

    def works(body) -> bool:
        pid = os.fork()
        if pid == 0:
            try:
                body()
                os._exit(0)
            except BaseException:
                os._exit(1)
        return os.waitpid(pid, 0)[1] == 0

    def mounts():
        check(libc.unshare(CLONE_NEWNS), "unshare")
        check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "private")
        check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m"), "tmpfs")

    def pid_namespace():
        for _ in range(2):
            pid = fork_new_pid_namespace()
            if pid == 0:
                os._exit(0 if os.getpid() == 1 else 1)
            if os.waitpid(pid, 0)[1] != 0:
                raise OSError("not pid 1")

    def enter():  # what a run and each of its processes do with the prepared root
        check(libc.unshare(CLONE_NEWNS), "unshare")
        check(libc.mount(b"tmpfs", f"{work_root}/tmp".encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m"), "tmpfs")
        pid = fork_new_pid_namespace(CLONE_NEWNS)
        if pid == 0:
            try:
                enter_root(work_root)
                alone = os.listdir("/proc/1") and not [p for p in os.listdir("/proc") if p.isdigit() and p != "1"]
                os._exit(0 if alone and not os.path.exists(work_root + "/etc") and os.path.isdir("/tmp") else 1)
            except BaseException:
                os._exit(1)
        if os.waitpid(pid, 0)[1] != 0:
            raise OSError("no private /proc or root")

    cgroup_roots, cgroup_reason = make_cgroup_roots() if root else ({}, "not root")
    has_pid_namespace = works(pid_namespace)
    has_mount_namespace = root and works(mounts)
    private_root, root_reason = None, "no mount and PID namespaces"
    if has_mount_namespace and has_pid_namespace:
        try:
            build_root(work_root)  # in this server's own mount namespace, for all its runs
            if works(enter):
                private_root, root_reason = work_root, ""
            else:
                root_reason = "entering the prepared root failed"
        except OSError as e:
            root_reason = f"cannot build the root: {e}"
    iso = Isolation(
        drop_privileges=root,
        pid_namespace=has_pid_namespace,
        mount_namespace=has_mount_namespace,
        work_root=work_root,
        cgroup_roots=cgroup_roots,
        kill_by_uid=root and not has_pid_namespace,
        run_bounds_processes="pids" in cgroup_roots,
        root=private_root,
    )
    summary = {
        "pid_namespace": iso.pid_namespace,
        "mount_namespace": iso.mount_namespace,
        "private_root": private_root is not None,
        "root_reason": root_reason,
        "syscall_filter": confine.SYSCALL_FILTER,
        "cgroups": sorted(cgroup_roots),
        "cgroup_reason": cgroup_reason,
        "uid": SANDBOX_UID if root else os.geteuid(),
    }
    # Each layer a run would go without, and why: the process backend refuses to run with any
    # (ForkServer) unless its config accepts weaker isolation.
    missing = {f"{controller} cgroup": cgroup_reason or "not made"
               for controller in CGROUP_CONTROLLERS if controller not in cgroup_roots}
    if not root:
        missing["sandbox users"] = f"not root: programs would run as uid {os.geteuid()}, the server's own"
    if not has_pid_namespace:
        missing["PID namespace"] = "clone(CLONE_NEWPID) failed"
    if private_root is None:
        missing["private root"] = root_reason
    if not confine.SYSCALL_FILTER:
        missing["syscall filter"] = f"no filter for {platform.machine()} (x86_64 only)"
    summary["missing"] = missing
    return iso, summary


# The controllers a run gets a cgroup of: its process count and memory bounded, and its CPU
# shared as one (equal shares per run, so a run of 32 processes gets no more than a run of one:
# a fork bomb next door does not starve a program into a timeout). Each with the files (v2, v1)
# whose presence in a child cgroup shows the controller works there.
CGROUP_CONTROLLERS = {"pids": ("pids.max",), "memory": ("memory.max", "memory.limit_in_bytes"),
                      "cpu": ("cpu.weight", "cpu.shares")}


def make_cgroup_roots() -> tuple[dict, str]:
    """A cgroup of this server's own for each of CGROUP_CONTROLLERS, under the cgroup it runs in.
    Tried for real (make a child, look for its files, remove it): not every machine lets us."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError as e:
        return {}, f"cannot read /proc/self/cgroup: {e}"
    roots, reasons = {}, []
    name = f"coderloo-sandbox-{os.getpid()}"
    prefix = "coderloo-sandbox-"
    for controller, files in CGROUP_CONTROLLERS.items():
        candidates = []
        for _, controllers, path in lines:
            if controller in controllers.split(","):
                candidates.append(os.path.join(f"/sys/fs/cgroup/{controller}", path.lstrip("/")))
            if controllers == "" and os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
                candidates.append(os.path.join("/sys/fs/cgroup", path.lstrip("/")))
        for base in candidates:
            sweep(base, prefix)
            path = os.path.join(base, name)
            try:
                os.makedirs(path, exist_ok=True)
                if os.path.exists(os.path.join(base, "cgroup.subtree_control")):
                    write(base, "cgroup.subtree_control", f"+{controller}")
                    write(path, "cgroup.subtree_control", f"+{controller}")
                probe = os.path.join(path, "probe")
                os.mkdir(probe)
                ok = any(os.path.exists(os.path.join(probe, file)) for file in files)
                os.rmdir(probe)
                if ok:
                    roots[controller] = path
                    break
                reasons.append(f"{controller}: no limit file under {base}")
            except OSError as e:
                reasons.append(f"{controller} at {base}: {e.strerror or e}")
                try:
                    os.rmdir(path)
                except OSError:
                    pass
        else:
            if not candidates:
                reasons.append(f"{controller}: controller not mounted")
    return roots, "; ".join(reasons)


def sweep(base: str, prefix: str) -> None:
    """Remove what servers that are gone left under `base` (a janitor killed along with its server):
    their roots and run cgroups, where empty; a run still going in one keeps it."""
    try:
        entries = [e for e in os.scandir(base) if e.name.startswith(prefix) and e.is_dir()]
    except OSError:
        return
    for entry in entries:
        pid = entry.name[len(prefix):]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            remove_cgroup_root(entry.path, kill=False)


def remove_cgroups(roots: dict, timeout_s: float = 30.0) -> None:
    """Remove each root and the run cgroups under it, killing what is still in them (a cgroup
    holding processes cannot go); a process on its way out may take a moment to leave."""
    deadline = time.monotonic() + timeout_s
    for root in roots.values():
        while not remove_cgroup_root(root, kill=True) and time.monotonic() < deadline:
            time.sleep(0.05)


def remove_cgroup_root(root: str, kill: bool) -> bool:
    """One try at removing a server's cgroup root and its run cgroups (with `kill`, killing what is
    still in them first); whether the root is gone."""
    try:
        runs = [entry.path for entry in os.scandir(root) if entry.is_dir()]
    except OSError:
        return not os.path.isdir(root)
    for run in runs:
        if kill:
            kill_members(run)
        try_rmdir(run)
    return try_rmdir(root)


def kill_members(cgroup: str) -> None:
    try:
        with open(os.path.join(cgroup, "cgroup.procs")) as f:
            pids = [int(line) for line in f if line.strip()]
    except OSError:
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def try_rmdir(path: str) -> bool:
    try:
        os.rmdir(path)
        return True
    except OSError:
        return False
