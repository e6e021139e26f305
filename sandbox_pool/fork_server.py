"""The fork server: one long-lived process that forks a supervisor for every run. Standard library
only. process_backend starts it, as root, from this folder, by the name the executor image gives
it (process_backend.BOOT: `python -I -S -c BOOT CONTROL_FD WORK_ROOT`), and it loads its siblings
by theirs (/sandbox/NAME.py): what a program can read of the process it was forked from (its
modules' and frames' file names) names no path of the host. `python -I -S fork_server.py
CONTROL_FD WORK_ROOT` runs it too, under its own paths.

At start it sets up its isolation once (isolation.py): a network namespace that every sandbox
inherits, so none has a network at no cost per run, and what else the machine allows (PID and
mount namespaces, cgroups for pids and memory), which it prints as one JSON line on stdout. Then
it waits on CONTROL_FD, a SOCK_SEQPACKET unix socket. Each message carries one connected socket
(SCM_RIGHTS) for one run; the server forks a supervisor for it (supervisor.py) and goes straight
back to waiting, so any number of runs are in flight at once. The server itself never reads a
request, so no test is in the memory its forks inherit. When the executor closes its end, the
server exits; runs it forked finish and answer.

Nothing is left behind however the server ends (its executor closed it, or died, or it was
SIGKILLed): its mounts live in its own mount namespace, its runs' scratch dirs in theirs, and a
janitor forked at start waits for the server and every supervisor it forked to be gone (the end
of a pipe they all hold), then removes the cgroups they leave (`janitor`).

    fork server ── supervisor (root, outside the sandbox) ─┬─ tester (uid 65533, init of the run's PID namespace)
                                                           └─ program (uid 65534, in that namespace)

The supervisor reads the request from its socket (two frames), answers with one report frame,
and should the executor hang up first, kills the run and answers nothing.
"""
import gc
import importlib.util
import json
import os
import signal
import socket
import struct
import sys


class Siblings:
    """The sandbox's scripts in `folder`, imported as /sandbox/NAME.py, during this module's imports
    only (-I leaves the folder out of sys.path, so programs cannot import them by accident)."""

    def __init__(self, folder: str):
        self.folder = folder

    def find_spec(self, name, path=None, target=None):
        if path is not None or not os.path.isfile(os.path.join(self.folder, name + ".py")):
            return None
        spec = importlib.util.spec_from_loader(name, self, origin=f"/sandbox/{name}.py")
        spec.has_location = True  # (its __file__)
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        module.FOLDER = self.folder  # for the files it reads beside it (a module pops it)
        with open(os.path.join(self.folder, module.__name__ + ".py")) as f:
            exec(compile(f.read(), module.__spec__.origin, "exec"), module.__dict__)
        module.__dict__.pop("FOLDER", None)


_siblings = Siblings(os.getcwd() if __file__ == "/sandbox/fork_server.py" else os.path.dirname(os.path.abspath(__file__)))
sys.meta_path.insert(0, _siblings)
import confine  # noqa: E402
import isolation  # noqa: E402
import supervisor  # noqa: E402
from protocol import send_frame  # noqa: E402

sys.meta_path.remove(_siblings)
del _siblings
os.chdir("/")

SOCKET_TIMEOUT_S = 30  # for the executor to send the request


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    work_root = sys.argv[2]
    iso, summary = isolation.probe(work_root)  # before a user namespace would map us to "nobody"
    alive = janitor(iso.cgroup_roots)  # held by the server and every supervisor: the janitor waits for its end
    if iso.drop_privileges:
        confine.drop_bounding_set()  # for every process it forks: no capability comes back through exec
    isolation.unshare_network()
    print(json.dumps(summary), flush=True)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the supervisors
    gc.freeze()  # forks then share the modules' objects instead of copying the pages the collector visits
    serve(control, iso)
    os.close(alive)


def janitor(cgroup_roots: dict) -> int:
    """Fork the process that cleans up after this server, and return the write end of the pipe it
    waits on. Every supervisor inherits that end and the sandboxed processes close it, so the
    janitor reads its end of file once the server and all its runs are gone, however they ended.
    Then it removes the run cgroups they left (killing what is still in one: nothing should be)
    and the server's cgroup roots. It is forked twice (its first parent exits at once), so it is
    no descendant of the server or the executor: Ray kills a dead worker's descendants. And it
    starts a session of its own, out of reach of a kill of the server's process group."""
    alive_r, alive_w = os.pipe()
    middle = os.fork()
    if middle != 0:
        os.close(alive_r)
        os.waitpid(middle, 0)
        return alive_w
    try:
        if os.fork() != 0:
            os._exit(0)
        os.setsid()
        os.closerange(0, alive_r)
        os.closerange(alive_r + 1, 1 << 16)
        while os.read(alive_r, 1):
            pass
        isolation.remove_cgroups(cgroup_roots)
    finally:
        os._exit(0)


def serve(control: socket.socket, iso: supervisor.Isolation) -> None:
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
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the supervisor waits for its children itself
                conn = socket.socket(fileno=fds[0])
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", SOCKET_TIMEOUT_S, 0))
                supervisor.supervise(conn.fileno(), lambda report: send(conn, report), iso, hangup_fd=conn.fileno())
            finally:
                os._exit(0)
        os.close(fds[0])


def send(conn: socket.socket, report: dict) -> None:
    try:
        send_frame(conn.fileno(), report)
    except OSError:
        pass  # the executor gave up on this run


if __name__ == "__main__":
    main()
