"""The one task format every task set is converted to, and its JSONL file form."""
from __future__ import annotations

import datetime
import gzip
import json
import math
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sandbox_pool.results import ExecutionRequest, Limits, OutputMatch, Test, check_tests_fit, test_kind


class Task(BaseModel):
    """A programming task with executable tests of one kind: Python statements (usually asserts,
    MBPP/HumanEval style), stdin/stdout cases (competitive programming), or call-based cases (a
    function or LeetCode `class Solution` method, arguments and the expected value)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, description="Unique id, e.g. 'mbpp/11' or 'synthetic/add_const/3'.")
    prompt: str = Field(min_length=1, description="Text given to the model.")
    tests: list[Test] = Field(
        min_length=1, description="One kind per task: Python snippets, each run separately after the program; "
        "{stdin, stdout} cases; or {args, accepted} call cases of the entry point.")
    entry_point: str | None = Field(
        None, min_length=1, description="Name of the function under test (for call cases: the function, or the "
        "method of `class Solution`); None for stdin/stdout tasks.")
    reference: str = Field(description="A reference solution: the full program (prompt included when prompt_is_code).")
    difficulty: int = Field(ge=1, le=5, description="1 (easiest) to 5.")
    source: str = Field(min_length=1, description="Where the task comes from: synthetic, mbpp, humaneval, ...")
    prompt_is_code: bool = Field(
        description="True when the completion continues the prompt's code (program = prompt + completion); "
        "False when the completion must contain the whole program (prose prompt)."
    )
    test_setup: str = Field(default="", description="Code run after the program and before the tests (MBPP).")
    split: str = Field(
        default="test", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="Which split of its source the task belongs to: train, heldout, test, validation, fewshot, or "
        "for a competitive-programming file whose name names none, the file's name (problems.jsonl: problems).",
    )
    language: Literal["python", "cpp", "javascript"] = Field("python", description="The language of the program.")
    match: OutputMatch = Field(default_factory=OutputMatch, description="How outputs and call results are compared.")
    public_tests: int = Field(
        0, ge=0, description="The first this many tests are shown: the statement's examples (a contest's public cases, "
        "MBPP's quoted assert, EvalPlus's base inputs), which feedback may quote. The rest are held: no prompt or "
        "feedback quotes them. Every test, shown and held, counts in the verdict, the reward and every evaluation, "
        "as the benchmarks' own graders count them.")
    time_limit_s: float | None = Field(None, gt=0, description="The problem's time limit per case, if it has one.")
    memory_mb: int | None = Field(None, gt=0, description="The problem's memory limit, if it has one.")
    run_time_s: float | None = Field(
        None, gt=0, description="The time its benchmark's grader allows the whole run, if it sets one (EvalPlus: each "
        "input group min(60 s, the sum of its inputs' limits) + 2 s): the run's wall-clock and CPU limits are raised to "
        "it, up to the limits' max_wall_s.")
    level: str | None = Field(
        None, min_length=1, description="The source's own difficulty name (APPS 'interview', LiveCodeBench 'hard', "
        "CodeContests 'A'), which evaluation reports pass@k by.")
    date: datetime.date | None = Field(None, description="When the problem was published (LiveCodeBench's "
                                       "contest_date), for evaluation windows after a model's cut-off.")

    @model_validator(mode="after")
    def _tests_fit(self) -> "Task":
        if self.public_tests > len(self.tests):
            raise ValueError(f"public_tests is {self.public_tests} but the task has {len(self.tests)} tests")
        # the sandbox's own rules: a task that passes here cannot make a request the sandbox refuses
        check_tests_fit(self.tests, self.language, self.request_entry_point, self.test_setup)
        return self

    @property
    def request_entry_point(self) -> str | None:
        """The entry point its sandbox requests name (none for C++: a stdin/stdout program's main)."""
        return self.entry_point if self.language != "cpp" else None

    @property
    def shown(self) -> list[Test]:
        """The tests feedback may quote (the first `public_tests`)."""
        return self.tests[: self.public_tests]

    @property
    def held(self) -> list[Test]:
        """The tests no prompt or feedback quotes (they count in the verdict as the shown ones do)."""
        return self.tests[self.public_tests:]

    def examples(self) -> "Task | None":
        """The task judged by its shown tests alone (what feedback may be made from), None when it
        shows none."""
        return self.model_copy(update={"tests": self.shown, "public_tests": 0}) if self.public_tests else None

    @property
    def test_kind(self) -> Literal["assert", "stdio", "call"]:
        return test_kind(self.tests)

    @property
    def family(self) -> str:
        """What kind of task it is: 'synthetic/add_const' for a synthetic task, else its source ('mbpp')."""
        return self.id.rsplit("/", 1)[0] if self.source == "synthetic" else self.source

    def program(self, code: str) -> str:
        """The program that is executed for a completion's extracted code."""
        return self.prompt + code if self.prompt_is_code else code

    def run_limits(self, limits: Limits) -> Limits:
        """`limits` with this task's own time limits (per case, and the whole run's) and memory limit,
        never below `limits`'."""
        overrides = {}
        if self.time_limit_s is not None:
            overrides["case_timeout_s"] = self.time_limit_s
        if self.run_time_s is not None:
            run = min(limits.max_wall_s, self.run_time_s)
            overrides["wall_timeout_s"] = max(limits.wall_timeout_s, run)
            overrides["cpu_time_s"] = max(limits.cpu_time_s, math.ceil(run))
        if self.memory_mb is not None:
            overrides["memory_mb"] = max(limits.memory_mb, self.memory_mb)
        return limits.model_copy(update=overrides) if overrides else limits

    def execution_request(self, program: str, limits: Limits, coverage: bool = False) -> ExecutionRequest:
        """The sandbox request that runs `program` against all this task's tests, shown and held, in
        order (`coverage`: recording the program's lines that run, where the sandbox measures them)."""
        return ExecutionRequest(program=program, tests=self.tests, test_setup=self.test_setup,
                                entry_point=self.request_entry_point, language=self.language, match=self.match,
                                limits=self.run_limits(limits), coverage=coverage and self.measures_coverage)

    @property
    def measures_coverage(self) -> bool:
        """Whether the sandbox records which lines of a program ran: Python's, whatever its tests."""
        return self.language == "python"


Record = dict[str, Any]


class TaskFileError(ValueError):
    """A task file that cannot be read; the message names the file, the line and the reason."""


def jsonl_records(path: Path) -> Iterator[tuple[str, Any]]:
    """(location, record) for each non-blank line of a JSONL file, gzip-compressed when it ends in .gz."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise TaskFileError(f"{path}:{lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
                yield f"{path}:{lineno}", record
    except (gzip.BadGzipFile, EOFError) as e:
        raise TaskFileError(f"{path}: not a complete gzip file: {e}") from None



def build_tasks(
    path: Path,
    records: Iterable[tuple[str, Any]],
    fields: dict[str, type],
    make_task: Callable[[Record], Task | None],
) -> list[Task]:
    """Check each record's fields (a `list` field must hold strings), build its Task, reject duplicates.
    `make_task` returns None for a record its loader leaves out (one it documents)."""
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    for where, record in records:
        if not isinstance(record, dict):
            raise TaskFileError(f"{where}: expected a JSON object, got {type(record).__name__}")
        for name, kind in fields.items():
            if name not in record:
                raise TaskFileError(f"{where}: missing field {name!r}")
            value = record[name]
            if not isinstance(value, kind) or isinstance(value, bool) or (
                kind is list and not all(isinstance(item, str) for item in value)
            ):
                expected = "a list of strings" if kind is list else kind.__name__
                raise TaskFileError(f"{where}: field {name!r} should be {expected}, got {value!r:.80}")
        try:
            task = make_task(record)
        except ValidationError as e:
            reasons = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'record'}: {err['msg']}" for err in e.errors()
            )
            raise TaskFileError(f"{where}: invalid task: {reasons}") from None
        except ValueError as e:
            raise TaskFileError(f"{where}: {e}") from None
        if task is None:
            continue
        if task.id in seen:
            raise TaskFileError(f"{where}: duplicate task id {task.id!r} (first at {seen[task.id]})")
        seen[task.id] = where
        tasks.append(task)
    if not tasks:
        raise TaskFileError(f"{path}: no tasks in file")
    return tasks


def load_jsonl(path: str | Path) -> list[Task]:
    """Tasks from a JSONL file in the one task format (gzip-compressed when it ends in .gz)."""
    path = Path(path)
    return build_tasks(path, jsonl_records(path), {}, Task.model_validate)


def save_jsonl(tasks: Iterable[Task], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for task in tasks:
            f.write(task.model_dump_json() + "\n")
