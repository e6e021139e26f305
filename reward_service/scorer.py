"""Turning completions into rewards: extract the program, check syntax and lint, run the tests in
the pool, time it against the reference, ask the plugged-in components, weigh them all."""
from __future__ import annotations

import re
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from reward_service.components import ComponentSpec, PluggedComponents, Score, Scored
from reward_service.extract import Extraction, extract, never_answered, sanitize
from reward_service.lint import ruff_check, syntax_error
from reward_service.schemas import Components, Diagnostic, ItemReward
from reward_service.tasks import Task
from reward_service.weights import RewardWeights
from sandbox_pool import ExecutionResult, IOTest, Limits, SandboxPool, Status

FEEDBACK_CHARS = 1_000  # the most execution feedback one reward carries (a client may cut it shorter)
# Of the detail, of a failing test's source, of its error and of the end of stderr: all of them
# together fit in FEEDBACK_CHARS, so the cut at the end never takes the last lines of stderr.
FEEDBACK_PART_CHARS = 200
STDERR_LINES = 5  # the last lines of the program's stderr that feedback quotes


class SandboxInfraError(RuntimeError):
    """The sandbox itself failed (not the program under test)."""


@dataclass(frozen=True)
class Analysis:
    """What is known of a completion before it runs."""

    extraction: Extraction
    program: str
    syntax_error: Diagnostic | None


# An answer without code (a <think> that never closed, or an empty answer to a prose prompt) runs
# nothing: it is scored as a program that does not compile, without going to the sandbox. (An empty
# continuation of a code prompt leaves the prompt's own stub, which runs as it always has.)
NO_CODE = Diagnostic(code="syntax", message="no code in the answer", row=1, column=1, end_row=1, end_column=2)


def analyse(task: Task, completion: str) -> Analysis:
    extraction = extract(completion, task.prompt_is_code, task.entry_point, task.language)
    whole = not task.prompt_is_code and task.language == "python" and task.entry_point  # a chat answer to a function task
    program = task.program(sanitize(extraction.code, task.entry_point) if whole else extraction.code)
    if never_answered(completion) or (not extraction.code.strip() and not task.prompt_is_code):
        return Analysis(extraction, program, NO_CODE)
    # Only Python is checked here; the sandbox compiles C++ and reports its errors, and Node reports
    # a JavaScript syntax error as the program's.
    return Analysis(extraction, program, syntax_error(program) if task.language == "python" else None)


def execution_feedback(task: Task, result: ExecutionResult, limits: Limits) -> str:
    """What a programmer reads after a run that did not pass, for a model to fix its code from:
    why the run ended (a sentence per status, naming the request's `limits`), the first failing
    test and the tester's error for it, and the end of the program's stderr. Only the program's and
    the tests' own words: the sandbox's (an infra_error's detail, its paths, its log lines) are no
    part of what a model should learn from. Empty when the run passed."""
    if result.status == Status.passed:
        return ""
    lines = [why_it_ended(result, limits)]
    failing = next((i for i, t in enumerate(result.tests) if not t.passed), None)
    if failing is not None:
        lines += [f"first failing test: {cut(test_text(task.tests[failing]))}",
                  cut(result.tests[failing].error or "it did not pass")]
    if result.status in (Status.syntax_error, Status.runtime_error):
        tail = stderr_tail(result.stderr)
        if tail:
            lines += ["the program's stderr ends with:", tail]
    return "\n".join(lines)[:FEEDBACK_CHARS]


# The only forms of `ExecutionResult.detail` feedback repeats: the program's own error as the
# sandbox's runner describes it (runner.serve_program, runner.run_tests), this module's
# `did_not_compile`, and the kernel's facts about how the program ended (sandbox_pool.verdict). A
# detail of any other form is left out, whatever the sandbox comes to write there.
PROGRAM_DETAILS = {
    Status.syntax_error: re.compile(r"(SyntaxError|IndentationError|TabError|ValueError): .+", re.DOTALL),
    Status.runtime_error: re.compile(
        r"the (program|test setup) raised \w+(: .+)?"
        r"|the program was killed by (SIG[A-Z0-9]+ \(signal \d+\)|signal \d+)"
        r"|the program exited with code -?\d+ before its tests finished"
        r"|the program stopped answering its tests"
        r"|the program wrote more than \d+ MiB of output"
        # a case's end, as the supervisor judged it from how the program's process ended
        r"|case \d+: (the program (exited with code -?\d+|was killed by signal \d+)(: .+)?|wrote more than \d+ MiB"
        r" of output|the program's process stopped answering)( \(\d+ of \d+ cases failed\))?",
        re.DOTALL,
    ),
}


def test_text(test) -> str:
    """A test as a programmer reads it: its source, a case's input and expected output, a call."""
    if isinstance(test, str):
        return test.strip()
    if isinstance(test, IOTest):
        return f"input {test.stdin.strip()!r}, expected output {test.stdout.strip()!r}"
    return f"arguments {', '.join(map(repr, test.args))}, expected {test.accepted[0]!r}"


def why_it_ended(result: ExecutionResult, limits: Limits) -> str:
    said = PROGRAM_DETAILS.get(result.status)
    detail = cut(result.detail) if said is not None and said.fullmatch(result.detail) else None
    match result.status:
        case Status.failed:
            return f"Failed: {sum(not t.passed for t in result.tests)} of {result.num_tests} tests did not pass"
        case Status.syntax_error:
            return f"Does not compile: {detail or 'the program has a syntax error'}"
        case Status.runtime_error:
            return f"Runtime error: {detail or 'the program crashed or exited before its tests finished'}"
        case Status.timeout:
            if limits.case_timeout_s is not None:  # the task's own limit, each case's (a contest's)
                return f"Timed out: a test exceeded its time limit of {limits.case_timeout_s:g} s"
            return (f"Timed out: the program exceeded its time limit ({limits.wall_timeout_s:g} s of wall-clock "
                    f"time, {limits.cpu_time_s} s of CPU time)")
        case Status.memory_exceeded:
            return f"Out of memory: the program exceeded its memory limit of {limits.memory_mb} MiB"
        case _:  # infra_error: nothing of it is the program's
            return "Not run: the sandbox failed; this says nothing about the program"


def cut(text: str) -> str:
    return text if len(text) <= FEEDBACK_PART_CHARS else text[:FEEDBACK_PART_CHARS] + " [...]"


def stderr_tail(stderr: str) -> str:
    """The last lines of the program's stderr (where a traceback or a crash says what went wrong).
    A line of the supervisor's own (a sandboxed process that failed to start writes one to the
    same descriptor) is left out."""
    lines = [line for line in stderr.splitlines() if line.strip() and "sandbox set-up failed:" not in line]
    return "\n".join(lines[-STDERR_LINES:])[-FEEDBACK_PART_CHARS:]


def executable_lines(code) -> set[int]:
    """The lines of `code` (a compiled program) and of every function, class and comprehension in it
    that hold an instruction: what a line tracer can see run."""
    lines = {line for _, _, line in code.co_lines() if line}
    for const in code.co_consts:
        if hasattr(const, "co_lines"):
            lines |= executable_lines(const)
    return lines


def coverage(program: str, executed: list[int] | None) -> Score | None:
    """The share of `program`'s executable lines in `executed` (None: not measured), its uncovered
    lines blamed (dense rewards put the shortfall on the tokens that wrote them)."""
    if executed is None:
        return None
    try:
        lines = executable_lines(compile(program, "<program>", "exec", dont_inherit=True))
    except (SyntaxError, ValueError):
        return None
    if not lines:
        return None
    text = program.splitlines()
    missed = sorted(lines - set(executed))
    blame = []
    for n in missed:
        line = text[n - 1] if n <= len(text) else " "
        blame.append(Diagnostic(code="coverage", message="no test ran this line", row=n,
                                column=len(line) - len(line.lstrip()) + 1, end_row=n, end_column=len(line.rstrip()) + 1))
    return Score(1.0 - len(missed) / len(lines), blame)


def did_not_compile(task: Task, error: Diagnostic) -> ExecutionResult:
    """The sandbox's answer to a program that does not compile, given without running it: the
    sandbox's first step is the same `compile`, and its tests never run after a failed one."""
    return ExecutionResult.build(len(task.tests), Status.syntax_error,
                                 f"SyntaxError: {error.message} (line {error.row}, column {error.column})")


class RewardScorer:
    def __init__(self, pool: SandboxPool, limits: Limits, weights: RewardWeights, components: list[ComponentSpec] = ()):
        self.pool = pool
        self.limits = limits
        self.weights = weights
        self.components = PluggedComponents(list(components))
        self._reference_s: dict[str, float] = {}  # task id -> run time of its passing reference solution
        # Ruff runs as a subprocess per program; threads overlap them with each other and with the pool.
        self._lint_threads = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ruff")

    def submit(self, tasks: list[Task], programs: list[str]) -> list[Future]:
        """Start executing each (task, program) pair; returns one future per pair.

        Identical programs of one task run once: a sharpening policy repeats itself often.
        """
        unique: dict[tuple[str, str], int] = {}
        requests, index = [], []
        for task, program in zip(tasks, programs, strict=True):
            key = (task.id, program)
            if key not in unique:
                unique[key] = len(requests)
                requests.append(task.execution_request(program, self.limits, coverage=self.weights.coverage > 0))
            index.append(unique[key])
        futures = self.pool.submit(requests)
        return [futures[i] for i in index]

    def _lint(self, tasks: list[Task], analyses: list[Analysis]) -> list[list[Diagnostic] | None]:
        if self.weights.lint == 0:
            return [None] * len(analyses)
        unique = list(dict.fromkeys(a.program for t, a in zip(tasks, analyses)
                                    if a.syntax_error is None and t.language == "python"))
        found = dict(zip(unique, self._lint_threads.map(lambda p: ruff_check(p, self.weights.lint_rules), unique)))
        # A program that does not parse gets no lint rules (Ruff reports only its syntax error).
        return [found.get(a.program, []) for a in analyses]

    def _time_references(self, tasks: list[Task]) -> list[tuple[str, Future]]:
        """Start running the reference solution of each task not timed yet (once per task)."""
        if self.weights.performance == 0:
            return []
        todo = list({t.id: t for t in tasks if t.id not in self._reference_s and t.reference.strip()}.values())
        requests = [t.execution_request(t.reference, self.limits) for t in todo]
        return list(zip([t.id for t in todo], self.pool.submit(requests)))

    def performance(self, task: Task, result: ExecutionResult) -> float | None:
        """Only a passing program is timed against the reference: fast wrong code earns nothing."""
        reference = self._reference_s.get(task.id)
        if self.weights.performance == 0 or reference is None:
            return None
        if result.status != Status.passed:
            return 0.0
        return min(1.0, reference / max(result.duration_s, 1e-6))

    def reward(
        self, task: Task, analysis: Analysis, result: ExecutionResult, diagnostics: list[Diagnostic] | None,
        domain: dict[str, Score | None] | None = None,
    ) -> ItemReward:
        w = self.weights
        domain = domain or {}
        performance = self.performance(task, result)
        syntax = 0.0 if analysis.syntax_error else 1.0
        functionality = result.fraction_passed
        lint = None if diagnostics is None else min(len(diagnostics), w.lint_saturation) / w.lint_saturation
        covered = coverage(analysis.program, result.lines_executed) if w.coverage else None
        shaping = {"coverage": covered, **domain}
        weights = {"coverage": w.coverage, **{spec.name: spec.weight for spec in self.components.specs}}
        total = 0.0 if w.constant else (
            w.syntax * syntax + w.functionality * functionality - w.lint * (lint or 0.0) + w.performance * (performance or 0.0)
            + sum(weights[name] * s.value for name, s in shaping.items() if s is not None)
        )
        return ItemReward(
            components=Components(syntax=syntax, functionality=functionality, lint=lint, performance=performance,
                                  coverage=covered.value if covered else None,
                                  domain={name: None if s is None else s.value for name, s in domain.items()}),
            blame={name: s.blame for name, s in shaping.items() if s is not None and s.blame},
            total=total, passed=result.status == Status.passed, status=result.status,
            diagnostics=([analysis.syntax_error] if analysis.syntax_error else []) + (diagnostics or []),
            feedback=execution_feedback(task, result, task.run_limits(self.limits)), token_rewards=None,
        )

    def score(self, tasks: list[Task], completions: list[str]) -> list[ItemReward]:
        """Rewards of each pair. A sandbox failure raises (the pool has already run the request
        again on another executor): scoring a broken sandbox's results as failed programs would
        silently train the policy on noise."""
        analyses = [analyse(t, c) for t, c in zip(tasks, completions, strict=True)]
        # A program that does not compile cannot pass: it is answered here, not sent to the pool
        # (early in training most samples are such programs).
        results: list[ExecutionResult | None] = [did_not_compile(t, a.syntax_error) if a.syntax_error else None
                                                 for t, a in zip(tasks, analyses)]
        runnable = [i for i, r in enumerate(results) if r is None]
        futures = self.submit([tasks[i] for i in runnable], [analyses[i].program for i in runnable])
        references = self._time_references(tasks)
        diagnostics = self._lint(tasks, analyses)  # while the pool runs the programs
        for i, future in zip(runnable, futures):
            results[i] = future.result()
        for task_id, future in references:
            timed = future.result()
            if timed.status == Status.passed:  # a reference that fails its own tests gives no yardstick
                self._reference_s[task_id] = timed.duration_s
        broken = [i for i, r in enumerate(results) if r.status == Status.infra_error]
        if broken:
            raise SandboxInfraError(
                f"{len(broken)} of {len(results)} programs hit a sandbox failure; "
                f"first: task {tasks[broken[0]].id}: {results[broken[0]].detail}"
            )
        # after the sandbox: a component sees how the run ended (and the sandbox's failures raised first)
        domain = self.components.score([Scored(t, c, a.extraction.code, a.program, r)
                                        for t, c, a, r in zip(tasks, completions, analyses, results)])
        return [self.reward(t, a, r, d, s) for t, a, r, d, s in zip(tasks, analyses, results, diagnostics, domain)]
