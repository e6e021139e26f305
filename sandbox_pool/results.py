"""The sandbox's border types: what to run, under which limits, and what came of it."""
from __future__ import annotations

import math
import re
import time
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Status(str, Enum):
    passed = "passed"  # every test passed
    failed = "failed"  # the program ran, at least one test did not pass
    syntax_error = "syntax_error"  # the program does not compile
    runtime_error = "runtime_error"  # the program raised, crashed or exited before the tests finished
    timeout = "timeout"  # wall-clock or CPU time limit
    memory_exceeded = "memory_exceeded"  # MemoryError, or killed for memory
    infra_error = "infra_error"  # the sandbox failed, not the program: retry, don't reward


class TestOutcome(BaseModel):
    __test__ = False  # not a pytest test class, despite the name

    passed: bool
    error: str | None = Field(None, description="exception type and message (truncated) when the test did not pass")


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    wall_timeout_s: float = Field(
        5.0, gt=0, description="wall-clock time for the whole run, start-up included; with case_timeout_s, each "
        "stdin/stdout or call case adds its own limit to it, up to max_wall_s"
    )
    cpu_time_s: int = Field(
        5, gt=0, description="CPU seconds (RLIMIT_CPU) of each process of the program; with case_timeout_s, each "
        "case (its own process, or its call in the one process of call cases) gets at least the case's limit"
    )
    memory_mb: int = Field(512, gt=0, description="address space (RLIMIT_AS) of each process, in MiB")
    file_size_mb: int = Field(16, gt=0, description="largest file the program may write (RLIMIT_FSIZE), in MiB")
    max_processes: int = Field(
        64, gt=0, description="processes and threads of the sandbox user (RLIMIT_NPROC, and the run's pids cgroup)"
    )
    output_mb: int = Field(8, gt=0, description="stdout and stderr together; more ends the run as a runtime_error")
    scratch_mb: int = Field(64, gt=0, description="size of the run's private /tmp, /var/tmp and /dev/shm (tmpfs)")
    output_tail_kb: int = Field(
        4, gt=0, le=64 * 1024, description="how much of the end of stdout and of stderr a result carries, in KiB (at "
        "output_mb's size or more: all of it)"
    )
    case_timeout_s: float | None = Field(
        None, gt=0, description="wall-clock time of one stdin/stdout or call case (a contest's time limit); "
        "None: only the run's wall_timeout_s, which bounds all cases together"
    )
    max_wall_s: float = Field(
        120.0, gt=0, description="the most wall-clock time a run whose cases add their own limits may take, "
        "however many cases it has: a task cannot hold an executor longer"
    )


class IOTest(BaseModel):
    """A case of a program that reads stdin and writes stdout: the output is compared outside the
    sandbox with `stdout` by the request's `OutputMatch`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    __test__ = False

    stdin: str = ""
    stdout: str


class CallTest(BaseModel):
    """A call-based case: the entry point (a top-level function, or a method of LeetCode's
    `class Solution` when the program defines no such function) called with `args`; it passes when
    the result equals one of `accepted` (JSON values: a bool only a bool; a tuple equals the list of
    its items; floats within the request's float tolerance). The call and the comparison happen in the tester."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    __test__ = False

    args: list[Any] = Field(default_factory=list, description="positional arguments, JSON values")
    accepted: list[Any] = Field(
        min_length=1, description="the results that pass (APPS accepts its expected list or that list's first item)"
    )


class OutputMatch(BaseModel):
    """How a case's output is compared with the expected one (outside the program's process)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["tokens", "lines", "exact"] = Field(
        "tokens", description="tokens: the tokens between ASCII whitespace equal (APPS, LiveCodeBench, CodeContests); "
        "lines: each line equal after removing trailing whitespace, trailing blank lines ignored; exact: byte for byte"
    )
    float_tolerance: float | None = Field(
        1e-6, ge=0, description="tokens mode and call results: two numbers match when |a - b| <= tolerance * "
        "max(1, |b|); None: numbers are compared as text"
    )


Test = str | IOTest | CallTest
JS_NAME = re.compile(r"[A-Za-z_$][\w$]*")  # an entry point call_harness.js puts in the program's scope


class ExecutionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    program: str
    tests: list[Test] = Field(
        description="one kind per request: Python statements run one by one after the program (usually asserts; "
        "python only); {stdin, stdout} cases; {args, accepted} call cases of the entry point"
    )
    test_setup: str = Field("", description="python: run after the program and before the tests, e.g. imports")
    entry_point: str | None = Field(
        None, description="python: the name under test, the one program name that may shadow a builtin in the "
        "tests (MBPP 126 tests its own `sum`); any other builtin the tests use stays the tester's"
    )
    language: Literal["python", "cpp", "javascript"] = "python"
    match: OutputMatch = Field(default_factory=OutputMatch, description="how outputs and call results are compared")
    limits: Limits = Field(default_factory=Limits)
    coverage: bool = Field(False, description="python: record the lines of the program the run executed, over all its "
                           "tests (ExecutionResult.lines_executed), for the coverage reward term; off: no tracer runs")

    @property
    def test_kind(self) -> Literal["assert", "stdio", "call"]:
        return test_kind(self.tests)

    @property
    def effective_limits(self) -> Limits:
        """The limits the run is held to. With a per-case limit (stdin/stdout and call cases), as a
        judge gives each case its own: the run's wall-clock limit is the start-up's plus each case's,
        up to `max_wall_s` (LiveCodeBench's grader allows its cases' limits plus a margin too), and
        no case's CPU limit is below its time limit."""
        limits = self.limits
        if limits.case_timeout_s is None or self.test_kind == "assert":
            return limits
        wall = limits.wall_timeout_s + len(self.tests) * limits.case_timeout_s
        return limits.model_copy(update={
            "wall_timeout_s": max(limits.wall_timeout_s, min(limits.max_wall_s, wall)),
            "cpu_time_s": max(limits.cpu_time_s, math.ceil(limits.case_timeout_s)),
        })

    @model_validator(mode="after")
    def _tests_fit_the_language(self) -> "ExecutionRequest":
        check_tests_fit(self.tests, self.language, self.entry_point, self.test_setup)
        return self


def check_tests_fit(tests: list, language: str, entry_point: str | None, test_setup: str) -> None:
    """The rules a request's tests keep with its language, entry point and test_setup (a ValueError
    names the one broken); tasks are held to them when they are read."""
    kind = test_kind(tests)
    if kind == "assert" and language != "python":
        raise ValueError(f"tests of a {language} request must be {{stdin, stdout}} or {{args, accepted}} "
                         "cases (statements are Python)")
    if kind == "call" and language == "cpp":
        raise ValueError("cpp requests take {stdin, stdout} cases only")
    if kind == "call" and not entry_point:
        raise ValueError("call cases need the entry_point to call")
    if kind != "assert" and test_setup:
        raise ValueError("test_setup goes with statement tests only")
    if language == "cpp" and entry_point:
        raise ValueError("entry_point is for python and javascript requests only")
    if language == "javascript" and entry_point and not JS_NAME.fullmatch(entry_point):
        raise ValueError(f"entry_point {entry_point!r} is not a JavaScript identifier")


def test_kind(tests: list) -> Literal["assert", "stdio", "call"]:
    """The one kind of a list of tests; a ValueError names the first test of another kind."""
    kinds = [("assert" if isinstance(t, str) else "stdio" if isinstance(t, IOTest) else "call") for t in tests]
    first = kinds[0] if kinds else "assert"
    other = next((i for i, k in enumerate(kinds) if k != first), None)
    if other is not None:
        raise ValueError(f"tests[{other}] is a {kinds[other]} test in a list of {first} tests: one kind per task")
    return first


class ExecutionResult(BaseModel):
    status: Status
    tests: list[TestOutcome] = Field(description="one per test; empty when the program never got to the tests")
    num_tests: int = Field(description="how many tests the request had")
    duration_s: float
    stdout: str = Field("", description="the tail of the program's stdout")
    stderr: str = Field("", description="the tail of the program's stderr")
    detail: str = Field("", description="why the status is what it is, for humans")
    lines_executed: list[int] | None = Field(
        None, description="with coverage: the program's lines its run executed, as its own process reported them "
        "(it could claim more); null when not measured")
    isolation_missing: list[str] = Field(
        default_factory=list, description="layers of isolation the run went without, which the pool's config "
        "accepted (the process backend's weaker_isolation); empty: all of them")

    @classmethod
    def build(cls, num_tests: int, status: Status, detail: str, *, started: float | None = None,
              tests: list[TestOutcome] | None = None, stdout: str = "", stderr: str = "") -> ExecutionResult:
        """`started`: time.monotonic() when the run began; None for an answer given without running
        anything (duration 0)."""
        duration_s = 0.0 if started is None else time.monotonic() - started
        return cls(status=status, tests=tests or [], num_tests=num_tests, duration_s=duration_s, stdout=stdout,
                   stderr=stderr, detail=detail)

    @property
    def num_passed(self) -> int:
        return sum(test.passed for test in self.tests)

    @property
    def fraction_passed(self) -> float:
        return self.num_passed / self.num_tests if self.num_tests else 0.0
