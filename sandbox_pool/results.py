"""The sandbox's border types: what to run, under which limits, and what came of it."""
from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field


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
        64, gt=0, description="processes and threads of the sandbox user (RLIMIT_NPROC); stops fork bombs"
    )


class ExecutionRequest(BaseModel):
    program: str
    tests: list[str] = Field(description="statements run one by one after the program, usually asserts")
    test_setup: str = Field("", description="run after the program and before the tests, e.g. imports")
    limits: Limits = Field(default_factory=Limits)


class ExecutionResult(BaseModel):
    status: Status
    tests: list[TestOutcome] = Field(description="one per test; empty when the program never got to the tests")
    num_tests: int = Field(description="how many tests the request had")
    duration_s: float
    stdout: str = Field("", description="the tail of the program's stdout")
    stderr: str = Field("", description="the tail of the program's stderr")
    detail: str = Field("", description="why the status is what it is, for humans")

    @property
    def num_passed(self) -> int:
        return sum(test.passed for test in self.tests)

    @property
    def fraction_passed(self) -> float:
        return self.num_passed / self.num_tests if self.num_tests else 0.0
