"""Process sandbox: one short-lived interpreter per program, isolated with what Linux offers a root
process for free (namespaces, rlimits, an unprivileged uid); no Docker needed.

Each run gets a new session (so the whole process group can be killed), new network and PID
namespaces (no network at all, and nothing the program starts outlives it), rlimits on CPU,
address space, file size and processes, uid/gid 65534 when we are root, and a fresh working
directory that is removed afterwards. What this does not isolate: the file system beyond Unix
permissions (the program can read what "nobody" can read) and, since all runs share uid 65534,
the process limit, which concurrent runs on one machine share.

`execute` never raises for a run that went wrong: the sandbox's own failures come back as
Status.infra_error, so callers can retry them instead of rewarding or punishing the program.
"""
from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from sandbox_pool.results import ExecutionRequest, ExecutionResult, Limits, Status, TestOutcome

RUNNER = str(Path(__file__).with_name("runner.py"))
SANDBOX_UID = SANDBOX_GID = 65534  # "nobody"
OUTPUT_TAIL_BYTES = 4096
STOP_GRACE_S = 2.0  # to stop the program after a wall timeout, and to drain its output after the run

CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

_libc = ctypes.CDLL(None, use_errno=True)


async def execute(request: ExecutionRequest, interpreter: str | None = None) -> ExecutionResult:
    """Run `request.program` and its tests in a fresh sandbox.

    `interpreter` is the Python that runs the program; by default this process's own Python, or
    a system one of the same version when the sandbox user cannot run ours (see
    `sandbox_interpreter`).
    """
    started = time.monotonic()
    try:
        return await _execute(request, interpreter or sandbox_interpreter(), started)
    except Exception as e:
        return _result(request, started, Status.infra_error, f"sandbox backend failed: {type(e).__name__}: {e}")


async def _execute(request: ExecutionRequest, interpreter: str, started: float) -> ExecutionResult:
    limits = request.limits
    drop_privileges = os.geteuid() == 0
    payload = json.dumps(request.model_dump(include={"program", "test_setup", "tests"})).encode()

    with (
        tempfile.TemporaryDirectory(prefix="sandbox-", ignore_cleanup_errors=True) as workdir,
        tempfile.TemporaryFile() as records,
    ):
        if drop_privileges:
            os.chown(workdir, SANDBOX_UID, SANDBOX_GID)
        try:
            process = await asyncio.create_subprocess_exec(
                interpreter, "-I", "-S", RUNNER, str(records.fileno()),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                cwd=workdir,
                # Not this process's environment: it may hold credentials.
                env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"},
                start_new_session=True,
                pass_fds=(records.fileno(),),
                preexec_fn=_sandbox_setup(limits, records.fileno(), drop_privileges),
            )
        except (OSError, subprocess.SubprocessError) as e:
            # A failed _sandbox_setup explains itself in the records; the exception only says "preexec_fn".
            reasons = [r["detail"] for r in _read_records(records) if "detail" in r]
            detail = reasons[0] if reasons else f"cannot start the sandbox: {e}"
            return _result(request, started, Status.infra_error, detail)

        stdout = asyncio.create_task(_tail(process.stdout))
        stderr = asyncio.create_task(_tail(process.stderr))
        try:
            timed_out = not await _run_to_completion(process, payload, limits.wall_timeout_s)
        finally:
            # Even after a normal exit: nothing the program started may survive the run.
            _kill_group(process.pid)
            await process.wait()
        try:
            stdout_tail, stderr_tail = await asyncio.wait_for(asyncio.gather(stdout, stderr), STOP_GRACE_S)
        except asyncio.TimeoutError:
            # Only a process that escaped both the group and the PID namespace can hold the pipes open.
            return _result(request, started, Status.infra_error, "a process of the program outlived the run")
        status, detail, tests = _classify(_read_records(records), timed_out, process.returncode, limits)
        if status is Status.infra_error and stderr_tail.strip():
            detail += "; stderr ends with: " + stderr_tail.strip().splitlines()[-1]
        return _result(request, started, status, detail, tests, stdout_tail, stderr_tail)


def _sandbox_setup(limits: Limits, records_fd: int, drop_privileges: bool) -> Callable[[], None]:
    """The function the child runs between fork and exec, as root (or as the unprivileged caller)."""
    rlimits = [
        # The program is its PID namespace's init, which ignores SIGXCPU; the kernel's SIGKILL at
        # the hard limit ends it. A second of margin tells that kill apart from others by CPU used.
        (resource.RLIMIT_CPU, (limits.cpu_time_s, limits.cpu_time_s + 1)),
        (resource.RLIMIT_AS, (limits.memory_mb * 2**20,) * 2),
        (resource.RLIMIT_FSIZE, (limits.file_size_mb * 2**20,) * 2),
        (resource.RLIMIT_NPROC, (limits.max_processes,) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ]

    def setup() -> None:
        try:
            _unshare_network_and_pids()
            # After unshare: a new user namespace takes its parent's RLIMIT_NPROC as its ceiling.
            for which, value in rlimits:
                resource.setrlimit(which, value)
            if drop_privileges:
                # Root ignores RLIMIT_NPROC; an ordinary uid cannot fork past it.
                os.setgroups([])
                os.setgid(SANDBOX_GID)
                os.setuid(SANDBOX_UID)
        except BaseException as e:
            record = {"status": "infra_error", "detail": f"sandbox set-up failed: {type(e).__name__}: {e}"}
            os.write(records_fd, (json.dumps(record) + "\n").encode())
            raise

    return setup


def _unshare_network_and_pids() -> None:
    """New network and PID namespaces; without root, inside a new user namespace. Never neither."""
    if _libc.unshare(CLONE_NEWNET | CLONE_NEWPID) == 0:
        return
    first = ctypes.get_errno()
    if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID) == 0:
        return
    second = ctypes.get_errno()
    raise OSError(
        second,
        f"cannot isolate the network: unshare(CLONE_NEWNET|CLONE_NEWPID): {os.strerror(first)}; "
        f"with CLONE_NEWUSER: {os.strerror(second)}",
    )


async def _run_to_completion(process: asyncio.subprocess.Process, payload: bytes, timeout_s: float) -> bool:
    """Feed the request and wait for the runner; False when the wall clock ran out first."""
    try:
        await asyncio.wait_for(_feed_and_wait(process, payload), timeout_s)
        return True
    except asyncio.TimeoutError:
        # The runner kills the program on SIGTERM and reaps it; the caller's SIGKILL to the group
        # comes after, for a runner that does not answer.
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(process.wait(), STOP_GRACE_S)
        return False


async def _feed_and_wait(process: asyncio.subprocess.Process, payload: bytes) -> None:
    try:
        process.stdin.write(payload)
        await process.stdin.drain()
        process.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the runner died before reading; its exit status tells why
    await process.wait()


async def _tail(stream: asyncio.StreamReader) -> str:
    """Read a stream to its end, keeping only the last OUTPUT_TAIL_BYTES."""
    tail = b""
    while chunk := await stream.read(65536):
        tail = (tail + chunk)[-OUTPUT_TAIL_BYTES:]
    return tail.decode("utf-8", "replace")


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _read_records(records) -> list[dict]:
    """The runner's JSON lines. The program could write there too, so nothing here is trusted
    beyond being JSON: a record the classification does not understand makes an infra_error."""
    records.seek(0)
    return [json.loads(line) for line in records.read().splitlines() if line.strip()]


def _classify(
    records: list[dict], timed_out: bool, returncode: int, limits: Limits
) -> tuple[Status, str, list[TestOutcome]]:
    outcome = next((r for r in records if "status" in r), None)
    ended = next((r for r in records if "cpu_s" in r), None)
    if outcome is not None:  # the tests finished, even if the clock ran out right after
        tests = [TestOutcome.model_validate(test) for test in outcome["tests"]]
        return Status(outcome["status"]), outcome["detail"], tests
    if timed_out:
        return Status.timeout, f"exceeded the wall-clock limit of {limits.wall_timeout_s:g} s", []
    if ended is None:
        how = f"was killed by {_signal_name(-returncode)}" if returncode < 0 else f"exited with code {returncode}"
        return Status.infra_error, f"the sandbox runner {how} without a result", []
    sig, cpu_s = ended["signal"], ended["cpu_s"]
    if sig == signal.SIGKILL and cpu_s >= limits.cpu_time_s:
        return Status.timeout, f"exceeded the CPU time limit of {limits.cpu_time_s} s", []
    if sig == signal.SIGKILL:
        # Under the CPU limit, and nothing in its own namespace can SIGKILL a namespace's init:
        # that leaves the kernel's out-of-memory killer.
        return Status.memory_exceeded, "killed by SIGKILL under the CPU limit: out of memory", []
    if sig is not None:
        return Status.runtime_error, f"the program was killed by {_signal_name(sig)}", []
    return Status.runtime_error, f"the program exited with code {ended['exit_code']} before its tests finished", []


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
    """The Python to run programs with: ours, if the sandbox user can run it and its standard library.

    A Python installed under a private home (pyenv in /root) cannot be run by uid 65534; then the
    system's python3.X of our version serves, since programs only get the standard library.
    """
    if os.geteuid() != 0:
        return sys.executable
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [sys.executable, f"/usr/local/bin/{version}", f"/usr/bin/{version}"]
    for candidate in candidates:
        probe = [candidate, "-I", "-S", "-c", f"import json, ctypes; open({RUNNER!r}).close()"]
        try:
            subprocess.run(
                probe, user=SANDBOX_UID, group=SANDBOX_GID, extra_groups=[], cwd="/",
                capture_output=True, timeout=30, check=True,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        return candidate
    raise RuntimeError(f"uid {SANDBOX_UID} can run none of {candidates} (with {RUNNER} and the standard library)")
