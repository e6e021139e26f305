"""The sandbox's border types: what to run, under which limits, and what came of it."""
from __future__ import annotations

import time
from enum import Enum
from typing import Literal

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

    wall_timeout_s: float = Field(5.0, gt=0, description="wall-clock time for the whole run, start-up included")
    cpu_time_s: int = Field(5, gt=0, description="CPU seconds (RLIMIT_CPU) of each process of the program")
    memory_mb: int = Field(512, gt=0, description="address space (RLIMIT_AS) of each process, in MiB")
    file_size_mb: int = Field(16, gt=0, description="largest file the program may write (RLIMIT_FSIZE), in MiB")
    max_processes: int = Field(
        64, gt=0, description="processes and threads of the sandbox user (RLIMIT_NPROC, and the run's pids cgroup)"
    )
    output_mb: int = Field(8, gt=0, description="stdout and stderr together; more ends the run as a runtime_error")
    scratch_mb: int = Field(64, gt=0, description="size of the run's private /tmp, /var/tmp and /dev/shm (tmpfs)")
    output_tail_kb: int = Field(
        4, gt=0, le=1024, description="how much of the end of stdout and of stderr a result carries, in KiB"
    )


class IOTest(BaseModel):
    """A test of a program that reads stdin and writes stdout (C++): the output is compared,
    outside the sandbox, token by token (whitespace-insensitive) with `stdout`."""

    model_config = ConfigDict(extra="forbid")
    __test__ = False

    stdin: str = ""
    stdout: str


class ExecutionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    program: str
    tests: list[str | IOTest] = Field(
        description="python: statements run one by one after the program, usually asserts; "
        "cpp: {stdin, stdout} cases for the compiled program"
    )
    test_setup: str = Field("", description="python: run after the program and before the tests, e.g. imports")
    entry_point: str | None = Field(
        None, description="python: the name under test, the one program name that may shadow a builtin in the "
        "tests (MBPP 126 tests its own `sum`); any other builtin the tests use stays the tester's"
    )
    language: Literal["python", "cpp"] = "python"
    limits: Limits = Field(default_factory=Limits)

    @model_validator(mode="after")
    def _tests_fit_the_language(self) -> "ExecutionRequest":
        kind = str if self.language == "python" else IOTest
        wrong = [i for i, t in enumerate(self.tests) if not isinstance(t, kind)]
        if wrong:
            expected = "strings of Python code" if kind is str else "{stdin, stdout} objects"
            raise ValueError(f"tests{wrong[:5]} of a {self.language} request must be {expected}")
        if self.language == "cpp" and (self.test_setup or self.entry_point):
            raise ValueError("test_setup and entry_point are for python requests only")
        return self


class ExecutionResult(BaseModel):
    status: Status
    tests: list[TestOutcome] = Field(description="one per test; empty when the program never got to the tests")
    num_tests: int = Field(description="how many tests the request had")
    duration_s: float
    stdout: str = Field("", description="the tail of the program's stdout")
    stderr: str = Field("", description="the tail of the program's stderr")
    detail: str = Field("", description="why the status is what it is, for humans")

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
