"""The code interpreter: a program run with no tests, for what it prints and how it ended (a
multi-turn strategy shows it to the model as an observation).

A run is the sandbox's one stdin/stdout case whose output is not judged: the program runs as
`python prog.py < stdin` (or the compiled C++ binary, or `node prog.js`) under the task's
limits, and the case's own stdout and stderr come back. A Python program run with no tests at
all would not do: its stdin is empty, an exception's traceback is not on its stderr, exit(0)
counts as an error and the task's time limit (a case's) does not apply.
"""
from __future__ import annotations

import re
import signal

from reward_service.schemas import RunResult
from reward_service.scorer import SandboxInfraError
from reward_service.tasks import Task
from sandbox_pool import ExecutionRequest, ExecutionResult, IOTest, Limits, Status

# How the supervisor words a case's end (sandbox_pool.supervisor: Cases.judge for Python, Run.executable
# for C++ and JavaScript), with the line of stderr it quotes, if any.
EXIT_CODE = re.compile(r"the program (?:exited with|ended with exit) code (-?\d+)(?:: (.+))?")
KILLED = re.compile(r"the program (?:was killed by|ended with) signal (\d+)(?:: .+)?")
TIME_LIMIT = re.compile(r"exceeded the (case time|wall-clock|CPU time) limit of ([\d.]+) s")
TRACEBACK = "Traceback (most recent call last):"


def run_request(program: str, stdin: str, language: str, limits: Limits) -> ExecutionRequest:
    """The sandbox request that runs `program` once with `stdin` (the interpreter's runs, SandboxFusion's
    /run_code). The expected output is a placeholder: whatever the program prints, it is not judged."""
    return ExecutionRequest(program=program, tests=[IOTest(stdin=stdin, stdout="")], language=language, limits=limits)


def run_results(tasks: list[Task], results: list[ExecutionResult], limits: Limits) -> list[RunResult]:
    """What each run printed and how it ended. A run that ended on its own with code 0 is `passed`,
    whatever it printed (the sandbox's `failed` only says it differs from the placeholder). A
    sandbox failure raises, as in scoring: it says nothing of the program, so it is no observation."""
    broken = [i for i, r in enumerate(results) if r.status == Status.infra_error]
    if broken:
        raise SandboxInfraError(f"{len(broken)} of {len(results)} runs hit a sandbox failure; "
                                f"first: task {tasks[broken[0]].id}: {results[broken[0]].detail}")
    return [RunResult(status=Status.passed if r.status == Status.failed else r.status, stdout=r.stdout,
                      stderr=r.stderr, exit=how_it_ended(t, r, t.run_limits(limits)), duration_s=r.duration_s)
            for t, r in zip(tasks, results, strict=True)]


def how_it_ended(task: Task, result: ExecutionResult, limits: Limits) -> str:
    """A short sentence, as a programmer would say it: "exited normally", "raised ValueError: ...",
    "timed out after 2 s", "ran out of memory (512 MiB)", "exited with code 3"."""
    detail = result.detail
    match result.status:
        case Status.passed | Status.failed:
            return "exited normally"
        case Status.syntax_error:  # C++ and JavaScript: the sandbox's words say so already
            return f"did not compile: {detail}" if task.language == "python" else detail
        case Status.timeout:
            limit = TIME_LIMIT.search(detail)
            if limit is None:  # it never got to run: the run's wall-clock limit ended first (a long compile)
                return f"timed out after {limits.wall_timeout_s:g} s"
            if limit[1] == "CPU time":
                return f"timed out: used more than {limit[2]} s of CPU time"
            return f"timed out after {limit[2]} s"
        case Status.memory_exceeded:
            return f"ran out of memory ({limits.memory_mb} MiB)"
        case _:  # runtime_error
            ended = (result.tests[0].error or "") if result.tests else detail
            if code := EXIT_CODE.fullmatch(ended):
                if task.language == "python" and code[1] == "1" and TRACEBACK in result.stderr and code[2]:
                    return f"raised {code[2]}"  # the traceback's last line: the exception
                return f"exited with code {code[1]}" + (f": {code[2]}" if code[2] else "")
            if killed := KILLED.fullmatch(ended):
                name = signal.strsignal(int(killed[1]))
                return f"killed by signal {killed[1]}" + (f" ({name})" if name else "")
            return ended  # e.g. it wrote more than the output limit
