"""The HTTP (and handle) border of the reward service: requests and responses."""
from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, model_validator

from common.config import Section

from reward_service.tasks import Task
from sandbox_pool import Status

MAX_COMPLETION_CHARS = 64_000
MAX_TOKENS = 32_768
MAX_STDIN_CHARS = 64 * 1024


class TaskItem(Section):
    """An item about one task: the task itself, or its id."""

    task: Task | None = Field(None, description="The full task; or give task_id.")
    task_id: str | None = Field(None, min_length=1, description="Id of a task in the task sets the service was configured with.")

    @model_validator(mode="after")
    def _one_task(self) -> "TaskItem":
        if (self.task is None) == (self.task_id is None):
            raise ValueError("give exactly one of task and task_id")
        return self


class RewardItem(TaskItem):
    completion: str = Field(max_length=MAX_COMPLETION_CHARS, description="The model's completion, as text.")
    completion_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, max_length=MAX_TOKENS, description="The completion's token ids; per-token rewards are returned when given."
    )


class RewardRequest(Section):
    items: list[RewardItem] = Field(min_length=1, description="Completions to score (at most the service's max_batch).")


class Components(BaseModel):
    syntax: float = Field(description="1 when the program parses and compiles, else 0.")
    functionality: float = Field(description="Fraction of the tests passed.")
    lint: float | None = Field(description="Lint penalty in [0, 1] before weighting; null when lint is off.")
    performance: float | None = Field(
        description="Reference run time over this run time, capped at 1 (0 when tests fail); "
        "null when off or when the reference fails."
    )
    coverage: float | None = Field(
        None, description="The share of the program's executable lines its tests ran; null when off or not measured "
        "(C++, JavaScript, a run that ended before it said).")
    domain: dict[str, float | None] = Field(
        default_factory=dict, description="Each plugged-in component's score in [0, 1] (reward.components), by name; "
        "null where it said nothing of the item.")

    def shaping(self) -> dict[str, float | None]:
        """The shaping terms by name: coverage and each plugged-in component."""
        return {"coverage": self.coverage, **self.domain}


class Diagnostic(BaseModel):
    """A problem at rows/columns of the program (1-based, columns in characters; end exclusive).
    Rows count the prompt's lines too when the completion continues it."""

    model_config = {"frozen": True}

    code: str = Field(description="Ruff's rule code, or 'syntax' for the error that stops the program compiling.")
    message: str
    row: int
    column: int
    end_row: int
    end_column: int


# The program's outcome in CodeRL's four classes (what the critic learns). A test that raises counts
# as a failed test (the program ran and a test did not pass); `runtime_error` is a program that
# raised or crashed before its tests finished, or ran out of time or memory.
OUTCOME_CLASS = {
    Status.syntax_error: "syntax_error", Status.runtime_error: "runtime_error", Status.timeout: "runtime_error",
    Status.memory_exceeded: "runtime_error", Status.failed: "failed", Status.passed: "passed",
}


class ItemReward(BaseModel):
    components: Components
    total: float = Field(description="The weighted sum of the components, the plugged-in ones' too (lint subtracted).")
    passed: bool
    status: Status
    diagnostics: list[Diagnostic]
    feedback: str = Field(
        "", description="Why the program did not pass, for a model to rewrite it from, in the program's and the "
        "tests' words only: why the run ended, the first failing test and its error, the end of the program's "
        "stderr; empty when it passed."
    )
    blame: dict[str, list[Diagnostic]] = Field(
        default_factory=dict, description="The spans of the program each plugged-in component blamed for the rest of its "
        "score (dense rewards put that share on the tokens that wrote them).")
    token_rewards: list[float] | None = Field(description="One per completion token id; null when no token ids were given.")
    token_penalties: list[float] | None = Field(
        None, description="The lint and syntax penalties within token_rewards, on the tokens that caused them (the "
        "rest of token_rewards is the outcome spread over the code); null when no token ids were given.")

    @property
    def outcome_class(self) -> str | None:
        """The outcome's class (OUTCOME_CLASS): syntax_error, runtime_error, failed or passed; None
        when the sandbox failed, not the program (infra_error)."""
        return OUTCOME_CLASS.get(self.status)


class RewardResponse(BaseModel):
    items: list[ItemReward]


class RunItem(TaskItem):
    """A program to run once, with no tests, in the task's language and under its limits."""

    program: str = Field(max_length=MAX_COMPLETION_CHARS, description="The whole program, as it is to run.")
    stdin: str = Field("", max_length=MAX_STDIN_CHARS, description="What the program reads on its standard input.")


class RunRequest(Section):
    items: list[RunItem] = Field(min_length=1, description="Programs to run (at most the service's max_batch).")


class RunResult(BaseModel):
    status: Status = Field(description="passed: it ended on its own with code 0 (what it printed is not judged); "
                           "else how the sandbox classed its end.")
    stdout: str = Field(description="The end of what the program wrote on stdout (the sandbox's tail).")
    stderr: str = Field(description="The end of what it wrote on stderr: a Python traceback, a compiler's errors.")
    exit: str = Field(description="How it ended, in a short sentence: 'exited normally', 'raised ValueError: bad', "
                      "'exited with code 3', 'timed out after 2 s', 'ran out of memory (512 MiB)'.")
    duration_s: float


class RunResponse(BaseModel):
    items: list[RunResult]
