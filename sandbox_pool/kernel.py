"""Linux primitives of the sandbox's own processes, standard library only: libc calls, a PID namespace
per fork, cgroup counters, and killing every process of a uid. supervisor.py and isolation.py use them."""
import ctypes
import os
import resource
import shutil
import signal

from confine import CLONE as SYS_CLONE, CLONE_NEWPID
from protocol import SANDBOX_GID, SANDBOX_UID

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
PR_SET_PDEATHSIG = 1


libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def _argv_area() -> tuple[int, int] | None:
    """Where this process's command line lies in its memory (/proc/self/stat's arg_start and
    arg_end): what /proc/PID/cmdline shows, the same in every fork of it."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return int(fields[45]), int(fields[46])  # fields 48 and 49, counted from the pid's 1
    except (OSError, IndexError, ValueError):
        return None


ARGV_AREA = _argv_area()  # read at start, while /proc is the host's


def set_command_line(args: list[str]) -> None:
    """Make /proc/self/cmdline read `args` (and NULs to the old one's length): a forked process
    shows its own command line, not the server's it was forked from. Too long an `args` is cut."""
    if ARGV_AREA is None:
        return
    start, end = ARGV_AREA
    data = b"\0".join(arg.encode() for arg in args)[: end - start - 1]
    ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)


def check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def fork_new_pid_namespace(flags: int = 0) -> int:
    """fork(), with the child the init of a new PID namespace: clone(CLONE_NEWPID | flags | SIGCHLD).
    (unshare(CLONE_NEWPID) would work once per process; a C++ run needs one namespace per test.)
    Python's at-fork handlers do not run; the supervisor is single-threaded, so none are needed."""
    pid = libc.syscall(SYS_CLONE, CLONE_NEWPID | flags | signal.SIGCHLD, 0, 0, 0, 0)
    if pid < 0:
        error = ctypes.get_errno()
        raise OSError(error, f"clone(CLONE_NEWPID): {os.strerror(error)}")
    return pid


def enter_root(root: str, mount_proc: bool = True) -> None:
    """In a sandboxed process, still root: with `mount_proc` (the first process of a new PID
    namespace, in the run's mount namespace or one of its own) a /proc at the root's that shows
    only this namespace's processes; then the prepared root as / (chroot: what lies outside it
    stays out of reach, as the process loses CAP_SYS_CHROOT with its uid and the syscall filter
    refuses chroot, mount and pivot_root; and it holds no descriptor from outside once common_setup
    has closed them)."""
    if mount_proc:  # hidepid=2: of the namespace's processes, only those of one's own uid
        check(libc.mount(b"proc", f"{root}/proc".encode(), b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"hidepid=2"),
              "mount /proc")
    os.chroot(root)
    os.chdir("/")


def oom_kills(cgroup: str) -> int | None:
    """The out-of-memory kills a memory cgroup has counted (v2 memory.events, v1 memory.oom_control),
    or None where it has no such counter."""
    for name in ("memory.events", "memory.oom_control"):
        try:
            with open(os.path.join(cgroup, name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except OSError:
            pass
    return None


def write(directory: str, name: str, value: str, missing_ok: bool = False) -> None:
    try:
        with open(os.path.join(directory, name), "w") as f:
            f.write(value)
    except FileNotFoundError:
        if not missing_ok:
            raise


class SandboxKiller:
    """kill(-1, SIGKILL) as the sandbox uid, from a process forked before the run started: a fork
    bomb may have taken every pid the container allows, and then the supervisor could not fork a
    killer. It stays root (out of the program's reach) until its first kill; that kill ends every
    process of the uid at once, so none is left to reach it afterwards."""

    def __init__(self):
        requests_r, self.requests = os.pipe()
        self.acks, acks_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.closerange(3, min(requests_r, acks_w))
                os.closerange(max(requests_r, acks_w) + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
                for fd in range(min(requests_r, acks_w) + 1, max(requests_r, acks_w)):
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
                dropped = False
                while os.read(requests_r, 1):
                    if not dropped:
                        os.setgroups([])
                        os.setgid(SANDBOX_GID)
                        os.setuid(SANDBOX_UID)
                        dropped = True
                    try:
                        os.kill(-1, signal.SIGKILL)
                    except ProcessLookupError:
                        pass  # none left
                    os.write(acks_w, b"k")
            finally:
                os._exit(0)
        os.close(requests_r)
        os.close(acks_w)

    def kill(self) -> None:
        try:
            os.write(self.requests, b"k")
            if os.read(self.acks, 1):
                return
        except OSError:
            pass
        kill_all_of(SANDBOX_UID)  # the killer is gone: fork one after all

    def close(self) -> None:
        os.close(self.requests)
        os.close(self.acks)
        os.waitpid(self.pid, 0)


def kill_all_of(uid: int) -> None:
    """kill(-1, SIGKILL) as `uid`: every process of that uid, atomically (a fork bomb cannot outrun it)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        except BaseException:
            pass
        os._exit(0)
    os.waitpid(pid, 0)


def processes_of(uids) -> list[int]:
    """Live (not zombie) processes owned by one of `uids`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(fields["Uid"].split()[0]) in uids and not fields["State"].strip().startswith(("Z", "X")):
            found.append(int(entry))
    return found


def remove(path: str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass
