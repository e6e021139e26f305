"""Process sandbox: programs forked from a warm fork server, isolated with what Linux offers a root
process for free (namespaces, rlimits, an unprivileged uid); no Docker needed.

Each run gets a new session, a new PID namespace (nothing the program starts outlives it), no
network (the fork server's network namespace, unshared once, has nothing but a loopback that is
down), rlimits on CPU, address space, file size and processes, uid/gid 65534 when we are root,
and a fresh working directory that is removed afterwards. fork_server.py says how. What this does
not isolate: the file system beyond Unix permissions (the program can read what "nobody" can
read) and, since all runs share uid 65534, the process limit, which concurrent runs on one
machine share. Runs forked from one server also share its hash seed (set iteration order).

This module is the executor's side: `ForkServer` (the server process, restarted when it dies,
and the client of its protocol), the module-level `execute` on a default server per process, and
the meaning of the server's reports. Neither raises for a run that went wrong: the sandbox's own
failures come back as Status.infra_error, so callers can retry them instead of rewarding or
punishing the program.
"""
from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

from sandbox_pool.results import ExecutionRequest, ExecutionResult, Limits, Status, TestOutcome

FORK_SERVER = str(Path(__file__).with_name("fork_server.py"))
SANDBOX_UID = SANDBOX_GID = 65534  # "nobody"
# Not this process's environment: it may hold credentials.
SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
# How long past its wall-clock limit a run may go unanswered before it counts as lost: the
# supervisor needs a moment to kill, drain and clean up, and a fresh server to start.
ANSWER_MARGIN_S = 10.0


_fork_servers: dict[str | None, ForkServer] = {}  # the module-level `execute`'s, by interpreter


class SandboxUnavailable(Exception):
    """The sandbox machinery, not the program, failed; the message says how."""


async def execute(request: ExecutionRequest, interpreter: str | None = None) -> ExecutionResult:
    """Run `request.program` and its tests in a fresh sandbox, forked by this process's fork
    server for `interpreter` (see `ForkServer`), which the first call starts."""
    if interpreter not in _fork_servers:
        _fork_servers[interpreter] = ForkServer(interpreter)
    return await _fork_servers[interpreter].execute(request)


class ForkServer:
    """A fork_server.py process, started on first use and restarted when it dies, and the client
    side of its protocol.

    Each run gets its own socketpair: one end travels (SCM_RIGHTS over the control socket) to the
    server and on to the run's supervisor, which reads the request from it and answers with its
    report. Runs share no stream, so any number are in flight at once, and a server that dies
    only loses the runs it had not yet forked: their sockets close unanswered (an infra_error).

    `interpreter` is the Python that runs the server and so the programs; by default this
    process's own, or a system one of the same version when the sandbox user cannot run ours
    (see `sandbox_interpreter`).
    """

    def __init__(self, interpreter: str | None = None):
        self.interpreter = interpreter
        self._process: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._log: IO[bytes] | None = None  # the server's stderr: why it died, if it did

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        """Run `request.program` and its tests in a fresh sandbox forked by this server."""
        started = time.monotonic()
        try:
            timeout_s = request.limits.wall_timeout_s + ANSWER_MARGIN_S
            report = await self._run(request.model_dump_json().encode(), timeout_s)
            status, detail, tests = _classify(report, request.limits)
        except SandboxUnavailable as e:
            return _result(request, started, Status.infra_error, str(e))
        except Exception as e:
            return _result(request, started, Status.infra_error, f"sandbox backend failed: {type(e).__name__}: {e}")
        stdout, stderr = report.get("stdout", ""), report.get("stderr", "")
        if status is Status.infra_error and stderr.strip():
            detail += "; stderr ends with: " + stderr.strip().splitlines()[-1]
        return _result(request, started, status, detail, tests, stdout, stderr)

    def close(self) -> None:
        """Stop the server; runs it already forked finish and answer. The next run starts a new one."""
        if self._process is None:
            return
        self._process.kill()
        self._process.wait()
        self._control.close()
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
        if not reply:
            raise SandboxUnavailable(await _silence(process, log))
        return json.loads(reply)

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
            ours.shutdown(socket.SHUT_WR)
            while chunk := await loop.sock_recv(ours, 65536):
                chunks.append(chunk)
        except ConnectionError:
            return process, log, b""  # closed unanswered
        return process, log, b"".join(chunks)

    async def _hand_over(self, theirs: socket.socket) -> tuple[subprocess.Popen, IO[bytes]]:
        """Pass the run's socket to the server, starting one if there is none or it is gone.
        Nothing has run yet, so a server found dead costs a restart, not the run."""
        restarted = False
        while True:
            if self._process is not None and self._process.poll() is not None:
                self.close()
            if self._process is None:
                self._start()
            try:
                socket.send_fds(self._control, [b"r"], [theirs.fileno()])
                return self._process, self._log
            except BlockingIOError:
                await asyncio.sleep(0.001)  # its queue is full; it takes a message in well under a millisecond
            except OSError as e:
                self.close()
                if restarted:  # a new server that is gone at once will not do better the next time
                    raise SandboxUnavailable(f"the sandbox fork server is gone: {e}") from e
                restarted = True

    def _start(self) -> None:
        control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        log = tempfile.TemporaryFile()
        try:
            interpreter = self.interpreter or sandbox_interpreter()
            process = subprocess.Popen(
                [interpreter, "-I", "-S", FORK_SERVER, str(theirs.fileno()), tempfile.gettempdir()],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                pass_fds=(theirs.fileno(),), cwd="/", env=SANDBOX_ENV,
                start_new_session=True,  # out of reach of a Ctrl-C meant for us
            )
        except BaseException:
            control.close()
            log.close()
            raise
        finally:
            theirs.close()
        control.setblocking(False)
        self._process, self._control, self._log = process, control, log


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


def _classify(report: dict, limits: Limits) -> tuple[Status, str, list[TestOutcome]]:
    if "error" in report:
        return Status.infra_error, report["error"], []
    if report["outlived"]:
        return Status.infra_error, "a process of the program outlived the run", []
    # The program could write to the records fd too, so nothing there is trusted beyond being
    # JSON: a record the classification does not understand makes an infra_error.
    records = [json.loads(line) for line in report["records"].splitlines() if line.strip()]
    outcome = next((r for r in records if "status" in r), None)
    if outcome is not None:  # the tests finished, even if the clock ran out right after
        tests = [TestOutcome.model_validate(test) for test in outcome["tests"]]
        return Status(outcome["status"]), outcome["detail"], tests
    if report["timed_out"]:
        return Status.timeout, f"exceeded the wall-clock limit of {limits.wall_timeout_s:g} s", []
    sig, cpu_s = report["signal"], report["cpu_s"]
    if sig == signal.SIGKILL and cpu_s >= limits.cpu_time_s:
        return Status.timeout, f"exceeded the CPU time limit of {limits.cpu_time_s} s", []
    if sig == signal.SIGKILL:
        # Under the CPU limit, not the wall-clock kill, and nothing in its own namespace can
        # SIGKILL a namespace's init: that leaves the kernel's out-of-memory killer.
        return Status.memory_exceeded, "killed by SIGKILL under the CPU limit: out of memory", []
    if sig is not None:
        return Status.runtime_error, f"the program was killed by {_signal_name(sig)}", []
    return Status.runtime_error, f"the program exited with code {report['exit_code']} before its tests finished", []


def _signal_name(number: int) -> str:
    try:
        return f"{signal.Signals(number).name} (signal {number})"
    except ValueError:
        return f"signal {number}"


def _result(
    request: ExecutionRequest,
    started: float,
    status: Status,
    detail: str,
    tests: list[TestOutcome] | None = None,
    stdout: str = "",
    stderr: str = "",
) -> ExecutionResult:
    return ExecutionResult(
        status=status,
        tests=tests or [],
        num_tests=len(request.tests),
        duration_s=time.monotonic() - started,
        stdout=stdout,
        stderr=stderr,
        detail=detail,
    )


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
