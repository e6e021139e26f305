"""The fork server: one long-lived process that forks a fresh sandbox for every program.
Standard library only. process_backend starts it, as root, as

    python -I -S fork_server.py CONTROL_FD WORK_ROOT

At start it unshares a network namespace (without root: inside a new user namespace), once:
every sandbox inherits it, so none has a network (its loopback is down) at no cost per run.
Then it waits on CONTROL_FD, a SOCK_SEQPACKET unix socket. Each message carries one connected
socket (SCM_RIGHTS) for one run; the server forks a supervisor for it and goes straight back to
waiting, so any number of runs are in flight at once. When the executor closes its end, it exits.

Each run is two forks away from the server:

    fork server ── supervisor (root, outside the sandbox) ── sandbox (pid 1 of a new PID namespace)

The supervisor reads the request (JSON, up to EOF) from its socket, makes a working directory,
unshares a PID namespace and forks the sandbox, which puts itself in a new session, sets
rlimits, drops to uid 65534 and becomes the program (runner.run_and_report). As its namespace's
init, its exit kills and reaps everything the program started, including processes that left
with setsid(): the supervisor's wait4 returns only once the whole namespace is gone, and it
gives the exit status and CPU time, which no program can forge. The wall-clock limit is a
SIGKILL from the supervisor. The supervisor answers on the socket with one JSON report (see
`watch`) and removes the directory; should the executor hang up first, it kills the sandbox
and answers nothing.

Programs share the server's network namespace and uid: concurrent programs could talk over
abstract unix sockets, as they could already through the file system.
"""
import ctypes
import gc
import json
import os
import resource
import select
import shutil
import signal
import socket
import sys
import time

# -I leaves this folder out of sys.path; put it back for one import only, so that programs
# cannot import the sandbox's modules by accident.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runner  # noqa: E402

del sys.path[0]

SANDBOX_UID = SANDBOX_GID = 65534  # "nobody"
RECORDS_FD = 3  # in the sandbox, after stdin (/dev/null, the server's own), stdout and stderr
OUTPUT_TAIL_BYTES = 4096
RECORDS_MAX_BYTES = 2**20
STOP_GRACE_S = 2.0  # after the sandbox ended, for its output pipes to reach EOF
SOCKET_TIMEOUT_S = 30.0  # for the executor to send the request and take the report

CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1

libc = ctypes.CDLL(None, use_errno=True)


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    work_root = sys.argv[2]
    drop_privileges = os.geteuid() == 0  # decided before a user namespace would map us to "nobody"
    unshare_network()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the supervisors
    gc.freeze()  # forks then share the modules' objects instead of copying the pages the collector visits
    serve(control, work_root, drop_privileges)


def unshare_network() -> None:
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


def serve(control: socket.socket, work_root: str, drop_privileges: bool) -> None:
    while True:
        message, fds, _, _ = socket.recv_fds(control, 1, 1)
        if not message:
            return  # the executor closed its end: it is gone
        if not fds:
            continue
        try:
            pid = os.fork()
        except OSError:
            pid = -1  # the run's socket closes unanswered, which the executor reports as an infra_error
        if pid == 0:
            try:
                control.close()
                supervise(socket.socket(fileno=fds[0]), work_root, drop_privileges)
            finally:
                os._exit(0)
        os.close(fds[0])


def supervise(conn: socket.socket, work_root: str, drop_privileges: bool) -> None:
    """One run, in its own child of the server: the request in, the report out."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # this process waits for its sandbox itself
    conn.settimeout(SOCKET_TIMEOUT_S)
    try:
        request = json.loads(receive_all(conn))
        workdir = os.path.join(work_root, "sandbox-" + os.urandom(8).hex())
        os.mkdir(workdir, 0o700)
        try:
            if drop_privileges:
                os.chown(workdir, SANDBOX_UID, SANDBOX_GID)
            report = run_sandbox(request, workdir, conn, drop_privileges)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    except Exception as e:
        report = {"error": f"the sandbox supervisor failed: {type(e).__name__}: {e}"}
    if report is not None:
        try:
            conn.sendall(json.dumps(report).encode())
        except OSError:
            pass  # the executor gave up on this run


def receive_all(conn: socket.socket) -> bytes:
    chunks = []
    while chunk := conn.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def run_sandbox(request: dict, workdir: str, conn: socket.socket, drop_privileges: bool) -> dict | None:
    """Start the program in its sandbox and watch it; the report, or None if the executor hung up."""
    deadline = time.monotonic() + request["limits"]["wall_timeout_s"]
    (stdout, stdout_w), (stderr, stderr_w), (records, records_w) = os.pipe(), os.pipe(), os.pipe()
    supervisor = os.pidfd_open(os.getpid())  # lets the sandbox check that this process is still there
    if libc.unshare(CLONE_NEWPID) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"unshare(CLONE_NEWPID): {os.strerror(error)}")
    pid = os.fork()
    if pid == 0:
        try:
            enter_sandbox(request, workdir, stdout_w, stderr_w, records_w, supervisor, drop_privileges)
        finally:
            os._exit(1)  # never back into the supervisor's code
    for fd in (stdout_w, stderr_w, records_w, supervisor):
        os.close(fd)
    # The other descriptors close when this process exits, right after the report.
    return watch(pid, deadline, stdout, stderr, records, conn)


def enter_sandbox(
    request: dict, workdir: str, stdout: int, stderr: int, records: int, supervisor: int, drop_privileges: bool
) -> None:
    """In the sandbox's first process, pid 1 of its namespace: set up, then become the program."""
    limits = request["limits"]
    try:
        for target, fd in ((1, stdout), (2, stderr), (RECORDS_FD, records)):
            if fd != target:  # in this order, no later source is an earlier target (pipes are above 2)
                # The program's own subprocesses get its stdout and stderr, not the records.
                os.dup2(fd, target, inheritable=target != RECORDS_FD)
        os.setsid()
        os.chdir(workdir)
        os.environ["HOME"] = os.environ["TMPDIR"] = workdir  # beside the server's PATH and LANG
        for which, value in [
            # The program is its namespace's init, which ignores SIGXCPU; the kernel's SIGKILL at
            # the hard limit ends it. A second of margin tells that kill apart from others by CPU used.
            (resource.RLIMIT_CPU, (limits["cpu_time_s"], limits["cpu_time_s"] + 1)),
            (resource.RLIMIT_AS, (limits["memory_mb"] * 2**20,) * 2),
            (resource.RLIMIT_FSIZE, (limits["file_size_mb"] * 2**20,) * 2),
            (resource.RLIMIT_NPROC, (limits["max_processes"],) * 2),
            (resource.RLIMIT_CORE, (0, 0)),
        ]:
            resource.setrlimit(which, value)
        if drop_privileges:
            # Root ignores RLIMIT_NPROC; an ordinary uid cannot fork past it.
            os.setgroups([])
            os.setgid(SANDBOX_GID)
            os.setuid(SANDBOX_UID)
        # After the uid change, which resets it (and leaves this process undumpable: other
        # programs, also uid 65534, cannot read its memory through /proc).
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # should the supervisor die, take the namespace down
        if select.select([supervisor], [], [], 0)[0]:
            os._exit(1)  # it died before the line above
        os.closerange(RECORDS_FD + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    except BaseException as e:
        detail = f"sandbox set-up failed: {type(e).__name__}: {e}"
        runner.write_record(records, runner.outcome("infra_error", [], detail))
        raise
    runner.run_and_report(request, RECORDS_FD)


def watch(pid: int, deadline: float, stdout: int, stderr: int, records: int, conn: socket.socket) -> dict | None:
    sandbox = os.pidfd_open(pid)  # this process is its parent and reaps it below: the pid stays valid
    poller = select.poll()
    poller.register(sandbox, select.POLLIN)
    poller.register(conn, 0)  # POLLHUP, always reported: the executor closed the run's socket
    kept = {stdout: b"", stderr: b"", records: b""}
    for fd in kept:
        poller.register(fd, select.POLLIN)
    open_pipes = set(kept)
    status = usage = drain_deadline = None
    timed_out = False
    while status is None or open_pipes:
        now = time.monotonic()
        if status is None and not timed_out and now >= deadline:
            os.kill(pid, signal.SIGKILL)  # the namespace's init: the kernel kills everything in it
            timed_out = True
        if status is not None and now >= drain_deadline:
            break  # only a process outside the namespace holding a pipe's write end gets here
        wake = drain_deadline if status is not None else None if timed_out else deadline
        for fd, _ in poller.poll(None if wake is None else max(0.0, wake - now) * 1000):
            if fd == sandbox:
                _, status, usage = os.wait4(pid, 0)
                poller.unregister(sandbox)
                drain_deadline = time.monotonic() + STOP_GRACE_S
            elif fd == conn.fileno():
                if status is None:
                    os.kill(pid, signal.SIGKILL)
                    os.wait4(pid, 0)
                return None
            elif chunk := os.read(fd, 65536):
                if fd != records:
                    kept[fd] = (kept[fd] + chunk)[-OUTPUT_TAIL_BYTES:]
                elif len(kept[fd]) < RECORDS_MAX_BYTES:  # the program can write there too
                    kept[fd] += chunk
            else:
                poller.unregister(fd)
                open_pipes.discard(fd)
    return {
        "records": kept[records].decode("utf-8", "replace"),  # JSON lines, see runner.py
        "stdout": kept[stdout].decode("utf-8", "replace"),  # tails
        "stderr": kept[stderr].decode("utf-8", "replace"),
        "timed_out": timed_out,  # the supervisor killed it for the wall-clock limit
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "outlived": bool(open_pipes),  # a process of the program kept its output open past the end
    }


if __name__ == "__main__":
    main()
