"""The one judge of a case the supervisor runs and compares itself, outside the sandbox: a Python
stdin/stdout case (run by the case server, runner.serve_cases) or a C++ or JavaScript case (run
from the checked binary or source). Standard library only. What the program printed can only make
its case fail: a limit, a crash or a lost process is judged before its output is read."""
import json
import signal
from dataclasses import dataclass

import matching
import runner

# A case's stdout is compared whole, up to this size; a longer one fails (a tail compared alone could
# hide what came before it).
STDOUT_COMPARE_MAX_BYTES = 2**20
NODE_OUT_OF_MEMORY = b"JavaScript heap out of memory"  # V8's last words at the heap limit


@dataclass
class CaseSeen:
    """What the supervisor saw of one case's process."""

    language: str  # "python" (the case server ran it and said how it ended), "cpp" or "javascript"
    ended: dict  # exit_code, signal, cpu_s; {}: no one said how it ended (the case server stopped answering)
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    case_limit: bool = False  # the deadline that passed was the case's own, earlier than the run's
    oom: bool = False  # the kernel counted an out-of-memory kill while it ran
    output_exceeded: bool = False  # it wrote past the run's output limit (and was ended for it)
    output_bytes: int = 0  # what the case wrote on stdout (an executable's: stdout and stderr)


def judge_case(seen: CaseSeen, test: dict, match: dict, limits: dict, calls: bool = False) -> dict:
    """The case's outcome record: {"passed", "end", "error"}, `end` one of verdict.CASE_STATUS or "ok".
    A Python case's process reports its CPU time, exit code 120 for MemoryError and the output
    limit as its own; an executable's limits are read from the run as a whole (verdict.py)."""
    python = seen.language == "python"
    code, sig = seen.ended.get("exit_code"), seen.ended.get("signal")
    if seen.timed_out:
        if seen.case_limit:
            return _end("timeout", f"exceeded the case time limit of {limits['case_timeout_s']:g} s")
        return _end("timeout", f"exceeded the wall-clock limit of {limits['wall_timeout_s']:g} s")
    if python and (seen.oom or code == runner.MEMORY_EXIT):
        return _end("memory", "ran out of memory")
    if seen.language == "javascript" and NODE_OUT_OF_MEMORY in seen.stderr:
        # V8 ends the process itself at --max-old-space-size (SIGABRT), before any cgroup would
        return _end("memory", "ran out of memory (JavaScript heap)")
    # SIGXCPU at the soft limit; a program that ignores it gets the SIGKILL at the hard one.
    if python and (sig == signal.SIGXCPU or (sig == signal.SIGKILL and (seen.ended.get("cpu_s") or 0.0) >= limits["cpu_time_s"])):
        return _end("timeout", f"exceeded the CPU time limit of {limits['cpu_time_s']} s")
    if python and seen.output_exceeded:
        return _end("output", f"wrote more than {limits['output_mb']} MiB of output")
    if not seen.ended:
        return _end("lost", "the program's process stopped answering")
    if sig is not None or code != 0:
        return _end("crash", _crash(seen))
    if seen.output_exceeded or seen.output_bytes > STDOUT_COMPARE_MAX_BYTES:
        return _end("output", "output too long to compare")
    return _compare(seen.stdout.decode("utf-8", "replace"), test, match, calls)


def _end(end: str, error: str | None = None) -> dict:
    return {"passed": end == "ok", "end": end, "error": error}


def _crash(seen: CaseSeen) -> str:
    """How the program ended, with what it said last on stderr (an executable's: its last line naming an Error)."""
    code, sig = seen.ended.get("exit_code"), seen.ended.get("signal")
    stderr = seen.stderr.decode("utf-8", "replace").strip().splitlines()
    if seen.language == "python":
        last = f": {stderr[-1][:200]}" if stderr else ""
        return f"the program was killed by signal {sig}{last}" if sig is not None else f"the program exited with code {code}{last}"
    how = f"signal {sig}" if sig is not None else f"exit code {code}"
    said = next((line.strip() for line in reversed(stderr) if "Error" in line), stderr[-1] if stderr else "")
    return f"the program ended with {how}" + (f": {said[:200]}" if said else "")


def _compare(got: str, test: dict, match: dict, calls: bool) -> dict:
    """The output against the expected one (the match rule), or a call's printed JSON result against the accepted values."""
    if not calls:
        if matching.outputs_match(got, test["stdout"], match["mode"], match["float_tolerance"]):
            return _end("ok")
        return _end("wrong", f"wrong output: {got[:200]!r}")
    try:
        value = json.loads(got)
    except ValueError:
        return _end("wrong", f"no result: {got[:200]!r}")
    if any(matching.values_match(value, want, match["float_tolerance"]) for want in test["accepted"]):
        return _end("ok")
    return _end("wrong", f"wrong result: {got.strip()[:200]}")
