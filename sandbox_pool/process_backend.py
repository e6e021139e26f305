"""Process sandbox: programs forked from a warm fork server, isolated with what Linux offers a root
process for free (namespaces, rlimits, an unprivileged uid); no Docker needed.

Each run gets a new session, a new PID namespace with a /proc of its own (nothing the program
starts outlives it, and it sees no other process), the prepared root as / (the system's
directories read-only; none of the host's other files), no network (the fork server's network
namespace, unshared once, has nothing but a loopback that is down), rlimits on CPU, address
space, file size and processes, uid/gid 65534 when we are root, no capabilities, no new
privileges and a syscall filter (confine.py), a private mount namespace whose /tmp, /var/tmp and
/dev/shm are fresh size-limited tmpfs (gone with the run), and, where the machine lets us create
them, a cgroup per run for pids, memory and CPU (`ForkServer.isolation` says what is in use). The
tests run in a separate tester process (runner.py). fork_server.py and supervisor.py say how.
What this does not isolate: concurrent runs of one server share its network namespace (an
abstract unix socket of one is reachable from another), and without cgroups the process limit
(RLIMIT_NPROC) is shared by concurrent runs.

This module is the executor's side: `ForkServer`, the server process (started again for the next
run when it dies) and the client of its protocol. It does not raise for a run that went wrong:
the sandbox's own failures come back as Status.infra_error, which callers retry or refuse instead
of rewarding or punishing the program.
"""
from __future__ import annotations

import asyncio
import functools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

from sandbox_pool.protocol import SANDBOX_ENV, SANDBOX_GID, SANDBOX_UID, frame, split_frame
from sandbox_pool.results import ExecutionRequest, ExecutionResult, Status
from sandbox_pool.verdict import classify, executed_lines

# The fork server by the name the executor image gives it, run from its folder (fork_server.py).
SCRIPTS = str(Path(__file__).parent)
BOOT = ("exec(compile(open('fork_server.py').read(), '/sandbox/fork_server.py', 'exec'), "
        "{'__name__': '__main__', '__file__': '/sandbox/fork_server.py'})")
# How long past its wall-clock limit a run may go unanswered before it counts as lost: the
# supervisor needs a moment to kill, drain and clean up, and a fresh server to start.
ANSWER_MARGIN_S = 10.0
CLOSE_WAIT_S = 2.0  # for the fork server to exit on its own once its control socket is closed


class SandboxUnavailable(Exception):
    """The sandbox machinery, not the program, failed; the message says how."""


class ForkServer:
    """A fork_server.py process, started on first use and again for the next run when it dies, and
    the client side of its protocol.

    Each run gets its own socketpair: one end travels (SCM_RIGHTS over the control socket) to the
    server and on to the run's supervisor, which reads the request from it and answers with its
    report. Runs share no stream, so any number are in flight at once, and a server that dies
    only loses the runs it had not yet forked: their sockets close unanswered (an infra_error).

    `interpreter` is the Python that runs the server and so the programs; by default this
    process's own, or a system one of the same version when the sandbox user cannot run ours
    (see `sandbox_interpreter`).

    A server that cannot set up every layer of its isolation on this machine (isolation.probe:
    its cgroups, PID namespace, private root, sandbox users, syscall filter) refuses to run
    programs, naming what is missing and how to fix it, unless `weaker_isolation` accepts that:
    then every result lists what its run went without (`ExecutionResult.isolation_missing`).
    """

    def __init__(self, interpreter: str | None = None, weaker_isolation: bool = False):
        self.interpreter = interpreter
        self.weaker_isolation = weaker_isolation
        self._process: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._log: IO[bytes] | None = None  # the server's stderr: why it died, if it did
        # What the running server isolates with (see isolation.probe); {} before it starts.
        self.isolation: dict = {}

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        """Run `request.program` and its tests in a fresh sandbox forked by this server."""
        started = time.monotonic()
        try:
            timeout_s = request.effective_limits.wall_timeout_s + ANSWER_MARGIN_S
            report = await self._run(request_frames(request), timeout_s)
            status, detail, tests = classify(report, request)
        except Exception as e:
            detail = str(e) if isinstance(e, SandboxUnavailable) else f"sandbox backend failed: {type(e).__name__}: {e}"
            return ExecutionResult.build(len(request.tests), Status.infra_error, detail, started=started)
        stdout, stderr = report.get("stdout", ""), report.get("stderr", "")
        if status is Status.infra_error and stderr.strip():
            detail += "; stderr ends with: " + stderr.strip().splitlines()[-1]
        result = ExecutionResult.build(len(request.tests), status, detail, started=started, tests=tests, stdout=stdout,
                                       stderr=stderr)
        result.lines_executed = executed_lines(report, request)
        result.isolation_missing = sorted(self.isolation.get("missing", {}))
        return result

    def close(self) -> None:
        """Stop the server; runs it already forked finish and answer. The next run starts a new one.
        The end of its control socket tells it to exit; one that does not within CLOSE_WAIT_S (it
        hangs) is killed. Either way its janitor removes what it leaves (fork_server.py)."""
        if self._process is None:
            return
        self._control.close()
        try:
            self._process.wait(CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        # The log stays open for as long as a run that is explaining its failure holds it.
        self._process = self._control = self._log = None

    async def _run(self, request: bytes, timeout_s: float) -> dict:
        """Hand one request (JSON) to a supervisor and return its report."""
        ours, theirs = socket.socketpair()
        try:
            process, log, reply = await asyncio.wait_for(self._exchange(ours, theirs, request), timeout_s)
        except asyncio.TimeoutError:
            # The server may be what hangs: replace it. A supervisor that has the run sees us hang
            # up and kills it.
            self.close()
            raise SandboxUnavailable(f"the sandbox did not answer within {timeout_s:g} s") from None
        finally:
            ours.close()
            theirs.close()
        answered = split_frame(reply)
        if answered is None:
            raise SandboxUnavailable(await _silence(process, log))
        return answered[0]

    async def _exchange(
        self, ours: socket.socket, theirs: socket.socket, request: bytes
    ) -> tuple[subprocess.Popen, IO[bytes], bytes]:
        process, log = await self._hand_over(theirs)
        theirs.close()
        loop = asyncio.get_running_loop()
        ours.setblocking(False)
        chunks = []
        try:
            await loop.sock_sendall(ours, request)
            while chunk := await loop.sock_recv(ours, 65536):
                chunks.append(chunk)
        except ConnectionError:
            return process, log, b""  # closed unanswered
        return process, log, b"".join(chunks)

    async def _hand_over(self, theirs: socket.socket) -> tuple[subprocess.Popen, IO[bytes]]:
        """Pass the run's socket to the server, starting one if there is none or it has exited. A
        server that is gone by the time the socket is passed fails this run (an infra_error) and
        the next run starts a new one: a run is never handed over twice."""
        if self._process is not None and self._process.poll() is not None:
            self.close()
        if self._process is None:
            self._start()
        while True:
            try:
                socket.send_fds(self._control, [b"r"], [theirs.fileno()])
                return self._process, self._log
            except BlockingIOError:
                await asyncio.sleep(0.001)  # its queue is full; it takes a message in well under a millisecond
            except OSError as e:
                self.close()
                raise SandboxUnavailable(f"the sandbox fork server is gone: {e}") from e

    def _start(self) -> None:
        control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        log = tempfile.TemporaryFile()
        try:
            interpreter = self.interpreter or sandbox_interpreter()
            process = subprocess.Popen(
                [interpreter, "-I", "-S", "-c", BOOT, str(theirs.fileno()), tempfile.gettempdir()],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                pass_fds=(theirs.fileno(),), cwd=SCRIPTS, env=SANDBOX_ENV,
                start_new_session=True,  # out of reach of a Ctrl-C meant for us
            )
        except BaseException:
            control.close()
            log.close()
            raise
        finally:
            theirs.close()
        control.setblocking(False)
        summary = process.stdout.readline()  # one JSON line once it is ready (none if it failed to start)
        process.stdout.close()
        self.isolation = json.loads(summary) if summary.strip() else {}
        self._process, self._control, self._log = process, control, log
        missing = self.isolation.get("missing", {})
        if missing and not self.weaker_isolation:
            self.close()
            raise SandboxUnavailable(refusal(missing))


def refusal(missing: dict) -> str:
    """Why a process sandbox refuses to run, and the ways out."""
    what = "; ".join(f"{layer}: {why}" for layer, why in sorted(missing.items()))
    return ("the process sandbox refuses to run programs without its full isolation, and this machine does not "
            f"give it all: {what}. Run the executor as root on a machine whose cgroups (v2, or v1's pids, memory "
            "and cpu controllers) it may create and write, outside any tool that remounts /sys or /proc; or use "
            "the Docker backend (reward.pool.backend.type=docker); or accept weaker isolation "
            "(reward.pool.backend.weaker_isolation=true), and every result then lists what its run went without")


async def _silence(process: subprocess.Popen, log: IO[bytes]) -> str:
    """Why a run's socket closed unanswered. A supervisor answers even about its own failures,
    so it or the server died: say which, with the server's last words."""
    for _ in range(100):  # a server on its way out may not have exited yet
        if process.poll() is not None:
            break
        await asyncio.sleep(0.01)
    if process.returncode is None:
        return "the sandbox supervisor ended without an answer"
    # pread: the server may still write through the same open file, so leave its offset alone.
    size = os.fstat(log.fileno()).st_size
    lines = os.pread(log.fileno(), 4096, max(0, size - 4096)).decode("utf-8", "replace").strip().splitlines()
    return f"the sandbox fork server exited with code {process.returncode}" + (f": {lines[-1]}" if lines else "")


def request_frames(request: ExecutionRequest) -> bytes:
    """The two frames a supervisor reads: what the program may know, then the tests (see supervisor.py)."""
    head = {"language": request.language, "kind": request.test_kind, "program": request.program,
            "limits": request.effective_limits.model_dump(), "coverage": request.coverage}
    tail = {"tests": [t if isinstance(t, str) else t.model_dump() for t in request.tests], "test_setup": request.test_setup,
            "entry_point": request.entry_point, "match": request.match.model_dump()}
    return frame(head) + frame(tail)


@functools.cache
def sandbox_interpreter() -> str:
    """The Python to run the fork server with: ours, if the sandbox user can run it and its standard library.

    The server starts as root, but programs import modules and start `sys.executable` as uid
    65534. A Python installed under a private home (pyenv in /root) is out of that user's reach;
    then the system's python3.X of our version serves, since programs only get the standard library.
    """
    if os.geteuid() != 0:
        return sys.executable
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [sys.executable, f"/usr/local/bin/{version}", f"/usr/bin/{version}"]
    for candidate in candidates:
        probe = [candidate, "-I", "-S", "-c", "import json, ctypes"]
        try:
            subprocess.run(
                probe, user=SANDBOX_UID, group=SANDBOX_GID, extra_groups=[], cwd="/",
                capture_output=True, timeout=30, check=True,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        return candidate
    raise RuntimeError(f"uid {SANDBOX_UID} can run none of {candidates} (with the standard library)")
