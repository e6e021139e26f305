"""The executor inside a sandbox container (the Docker backend's image runs it under tini).
Standard library only.

The host keeps the container's stdin and stdout attached for the container's whole life: each
run is two request frames in and one report frame out (protocol.py's framing; supervisor.py says
what is in them). Nothing is started per run but a fork: this loop forks a supervisor, which
reads the next request itself, so the loop's own memory never holds a request (and the
processes forked from it never inherit one). One run at a time: after each, the supervisor kills
every process of the sandbox uids (kill(-1) as that uid) and empties /tmp and /dev/shm. The
container is the program's PID namespace and root; supervisor.py adds the rest of the
confinement (no capabilities, no new privileges, the syscall filter: confine.py). The loop
ends when the host closes stdin; the container (started with --rm) goes with it.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import confine  # noqa: E402
import kernel  # noqa: E402
import supervisor  # noqa: E402
from protocol import send_frame  # noqa: E402

del sys.path[0]

ISOLATION = supervisor.Isolation(
    drop_privileges=True,
    pid_namespace=False,  # no CAP_SYS_ADMIN in the container: the container is the namespace
    mount_namespace=False,
    work_root="/tmp",
    cgroup_roots={},  # the container's own cgroup limits the one run it holds at a time
    kill_by_uid=True,
    run_bounds_processes=True,  # the container's pids limit, and it holds one run at a time
    # The container's own memory cgroup (v2, or v1's memory controller): its one run at a time
    # makes the change in its out-of-memory kill count that run's.
    memory_cgroup=next((path for path in ("/sys/fs/cgroup", "/sys/fs/cgroup/memory")
                        if kernel.oom_kills(path) is not None), None),
)
END_OF_INPUT = 3


def main() -> None:
    try:  # the supervisor watches its processes through pidfds
        os.close(os.pidfd_open(os.getpid()))
    except OSError as e:
        send_frame(1, {"ready": False, "error": f"this kernel or container runtime does not implement pidfd_open "
                       f"({e.strerror}), which the sandbox's supervisor needs (gVisor's runsc before 2023 lacks it)"})
        return
    confine.drop_bounding_set()  # for every process it forks (its own capabilities stay): needs SETPCAP
    send_frame(1, {"ready": True, "uid": os.geteuid()})
    while True:
        pid = os.fork()
        if pid == 0:
            try:
                supervisor.supervise(0, lambda report: send_frame(1, report), ISOLATION)
            except EOFError:
                os._exit(END_OF_INPUT)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == END_OF_INPUT:
            return


if __name__ == "__main__":
    main()
