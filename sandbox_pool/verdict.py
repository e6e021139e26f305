"""From a supervisor's report to a typed result: the host side's reading of what happened.

What decides `passed` is the tester's record (Python: runner.run_tests, in a process the program
cannot reach) or the supervisor's own comparison of outputs (C++). The program can only make a
run look worse: its exit code, its output and anything it claims about itself never make a test
pass.
"""
from __future__ import annotations

import signal

from sandbox_pool.results import ExecutionRequest, Limits, Status, TestOutcome


def classify(report: dict, request: ExecutionRequest) -> tuple[Status, str, list[TestOutcome]]:
    if "error" in report:
        return Status.infra_error, report["error"], []
    if report["outlived"]:
        return Status.infra_error, "a process of the program outlived the run", []
    if "cases" in report:
        return _cases(report, request)
    limits = request.effective_limits
    if report["output_exceeded"]:
        return Status.runtime_error, f"the program wrote more than {limits.output_mb} MiB of output", []
    if request.language in ("cpp", "javascript"):
        return _executable(report, request)
    tester = report["tester"]
    if tester is None:
        if report["timed_out"]:
            return _ended(report, limits, [])
        return Status.infra_error, "the tester ended without a verdict", []
    load = tester["load"]
    tests = [TestOutcome(passed=t["passed"] is True, error=t["error"]) for t in tester["tests"]]
    if load["status"] in ("syntax_error", "runtime_error", "memory_exceeded"):
        return Status(load["status"]), load["detail"], []
    if load["status"] == "lost" or tester["lost"]:
        return _ended(report, limits, tests)  # the program's process ended before the tests did
    if tester.get("cut"):  # the run's deadline ended the tester: what it finished stands, the rest did not run
        if not report["timed_out"] or len(tests) > len(request.tests):
            return Status.infra_error, "the tester ended without a verdict", []
        tests += [TestOutcome(passed=False, error="not run: the run's wall-clock limit ended first")] * (
            len(request.tests) - len(tests))
        return _ended(report, limits, tests)
    if len(tests) != len(request.tests):
        return Status.infra_error, f"the tester reported {len(tests)} of {len(request.tests)} tests", []
    if all(t.passed for t in tests):
        return Status.passed, "", tests
    timed_out = next((i for i, t in enumerate(tester["tests"]) if t.get("timeout")), None)
    if timed_out is not None:
        return Status.timeout, f"case {timed_out}: {tests[timed_out].error}", tests
    if any(t.get("memory") for t in tester["tests"]):
        return Status.memory_exceeded, "a test raised MemoryError", tests
    failed = sum(not t.passed for t in tests)
    if request.test_kind == "call":
        first = next(i for i, t in enumerate(tests) if not t.passed)
        return Status.failed, f"case {first}: {tests[first].error} ({failed} of {len(tests)} cases failed)", tests
    return Status.failed, f"{failed} of {len(tests)} tests failed", tests


# How a case ended -> the status of a run whose first failing case ended so, as a judge gives the
# verdict of the first case that does not pass.
CASE_STATUS = {"wrong": Status.failed, "timeout": Status.timeout, "memory": Status.memory_exceeded,
               "crash": Status.runtime_error, "output": Status.runtime_error, "lost": Status.runtime_error}


def _cases(report: dict, request: ExecutionRequest) -> tuple[Status, str, list[TestOutcome]]:
    """Python stdin/stdout cases, each judged by the supervisor (judge.judge_case)."""
    load = report["load"]
    if load["status"] == "syntax_error":
        return Status.syntax_error, load["detail"], []
    if load["status"] != "ok":
        return _ended(report, request.effective_limits, [])
    return _judged(report["cases"], report, request)


def _judged(cases: list, report: dict, request: ExecutionRequest) -> tuple[Status, str, list[TestOutcome]]:
    """Cases the supervisor judged one by one: the run's status is the one of its first failing case
    (a wrong answer, a time limit, a crash), as a judge's verdict; cases the run's time limit left
    unrun fail as not run."""
    if len(cases) > len(request.tests) or any(c.get("end") not in CASE_STATUS and c.get("end") != "ok" for c in cases):
        return Status.infra_error, "the supervisor's case records do not fit the request", []
    tests = [TestOutcome(passed=c["passed"] is True and c["end"] == "ok", error=c["error"]) for c in cases]
    not_run = len(request.tests) - len(tests)
    if not_run:
        why = "the run's wall-clock limit ended first" if report["timed_out"] else "the program stopped answering"
        tests += [TestOutcome(passed=False, error=f"not run: {why}")] * not_run
    if all(t.passed for t in tests):
        return Status.passed, "", tests
    first = next(i for i, t in enumerate(tests) if not t.passed)
    if first >= len(cases):
        status = Status.timeout if report["timed_out"] else Status.runtime_error
        return status, f"case {first}: {tests[first].error}", tests
    failed = sum(not t.passed for t in tests)
    return CASE_STATUS[cases[first]["end"]], f"case {first}: {tests[first].error} ({failed} of {len(tests)} cases failed)", tests


def _executable(report: dict, request: ExecutionRequest) -> tuple[Status, str, list[TestOutcome]]:
    if report.get("compile_failed"):
        if report["timed_out"] or (report["program"] or {}).get("signal") is not None:
            return _ended(report, request.effective_limits, [])
        lines = report["stderr"].strip().splitlines()
        errors = [line for line in lines if "error" in line.lower()] or lines
        what = "compilation failed" if request.language == "cpp" else "the program does not parse"
        return Status.syntax_error, f"{what}: " + (errors[0] if errors else "no message"), []
    if report["oom_killed"]:
        tests = [TestOutcome(passed=t["passed"], error=t["error"]) for t in report["case_tests"]]
        return _ended(report, request.effective_limits, tests)
    return _judged(report["case_tests"], report, request)


def _ended(report: dict, limits: Limits, tests: list[TestOutcome]) -> tuple[Status, str, list[TestOutcome]]:
    """The program's process ended (or was ended) before its tests finished: how, from evidence,
    in this order: the kernel's count of out-of-memory kills in the run (whatever came after it:
    a program killed for memory may leave its tests waiting until the deadline), the deadline, the
    CPU time used against its limit, the supervisor's own kills; a signal alone decides nothing."""
    oom = report["oom_killed"]  # None: no memory cgroup to ask
    if oom:
        return Status.memory_exceeded, "killed by the kernel's out-of-memory killer", tests
    if report["timed_out"]:
        return Status.timeout, f"exceeded the wall-clock limit of {limits.wall_timeout_s:g} s", tests
    program = report["program"] or {}
    sig, cpu_s = program.get("signal"), program.get("cpu_s", 0.0)
    # SIGXCPU at the soft limit; a program that ignores it gets the SIGKILL at the hard one.
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_s >= limits.cpu_time_s):
        return Status.timeout, f"exceeded the CPU time limit of {limits.cpu_time_s} s", tests
    if program.get("killed"):
        # The tester ended first (it lost the program: a broken protocol) and the supervisor ended the program.
        return Status.runtime_error, "the program stopped answering its tests", tests
    if sig is not None:
        # Not the sandbox, not the CPU limit, and (where a cgroup can tell) not for memory: the
        # program itself, or something it started.
        unknown = " (no memory cgroup to tell an out-of-memory kill)" if oom is None else ""
        return Status.runtime_error, f"the program was killed by {_signal_name(sig)}{unknown}", tests
    code = program.get("exit_code")
    return Status.runtime_error, f"the program exited with code {code} before its tests finished", tests


def _signal_name(number: int) -> str:
    try:
        return f"{signal.Signals(number).name} (signal {number})"
    except ValueError:
        return f"signal {number}"


MAX_LINES = 100_000  # more line numbers than any program the service takes has lines


def executed_lines(report: dict, request: ExecutionRequest) -> list[int] | None:
    """With `request.coverage`, the program's lines its run executed, as its process told the
    tester or each case's run told the case server (runner.line_tracer). Those processes are the
    program's: a program that looked for the tracer's data could claim lines it never ran, so this
    is a shaping signal, never a verdict. None where it was not measured (coverage off, C++ and
    JavaScript, a run that ended before the tester asked, or an answer that is not a list of line
    numbers)."""
    lines = report.get("lines") if request.coverage else None
    if not isinstance(lines, list) or len(lines) > MAX_LINES or not all(type(n) is int and n > 0 for n in lines):
        return None
    return sorted(set(lines))
