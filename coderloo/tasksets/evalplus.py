"""HumanEval+ and MBPP+ (EvalPlus) as Tasks whose tests compare outputs with the canonical solution's.

The EvalPlus files hold inputs (`base_input`, `plus_input`), not expected outputs. Expected
outputs come from running each task's canonical solution on its inputs, once per data file: in
subprocesses with a timeout (never in this process), cached under ~/.cache/coderloo/evalplus/ by
the file's sha256 and the code's. Each input becomes one test, `_evalplus["check"](<entry point>, i)`, decided in the
sandbox's trusted tester by evalplus_oracle.py (EvalPlus's comparison rules, atol and special
oracles), whose source and the task's inputs and expected outputs are the task's `test_setup`:
they run in the tester, never in the program's process.

A task passes when every base and plus input passes, as EvalPlus's "plus" score (base tests
and extra tests). `plus=False` keeps the base inputs only (EvalPlus's "base" score). EvalPlus's
time limits hold too: each input within max(1 s, 4 x the canonical solution's time on it, as
measured here when the expected outputs are computed), and the run allowed what EvalPlus allows
each input group (`Task.run_time_s`), whatever lower limits the evaluation sets.

Two oddities of the MBPP+ v0.2.0 data:
- Mbpp/120: its `assertion` field calls math.isclose without importing math. EvalPlus (and this
  module) does not run `assertion`: the tests are the base and plus inputs with the canonical
  solution's outputs, and that solution runs without math. tests/test_evalplus.py checks that
  the assertions pass with `import math` in the test setup.
- Mbpp/793: `plus_input` is `{}`, read as no plus inputs.

Left out: inputs whose expected output is over evalplus_oracle.MAX_OUTPUT_BYTES (4 MiB) encoded,
since the program's output would have to cross the sandbox's plain-value channel and be held
by the tester. In these files: 5 plus inputs of Mbpp/255 (outputs of 27 MB to 1 GB), and 32
of HumanEval+ (21 of HumanEval/15, 1 of /100, 10 of /130). `left_out()` lists them.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from coderloo.tasksets import evalplus_oracle
from coderloo.tasksets.benchmarks import difficulty
from reward_service.tasks import Record, Task, TaskFileError, build_tasks, jsonl_records
from sandbox_pool.protocol import CALL_WITHIN

ORACLE_SOURCE = Path(evalplus_oracle.__file__).read_text(encoding="utf-8")
ORACLE_PATH = Path(evalplus_oracle.__file__)
# The cache is shared by every checkout of a user: its entries are named by the data file's
# sha256 and by the code that computes them (the oracle and this module's deserialization), so a
# change to either computes them again.
CODE_DIGEST = hashlib.sha256((ORACLE_SOURCE + Path(__file__).read_text(encoding="utf-8")).encode()).hexdigest()[:16]
EXPECTED_TIMEOUT_S = 1800.0  # computing all expected outputs of one file, per subprocess
# EvalPlus's time limits (evalplus 0.3.1: config.py's DEFAULT_MIN_TIME_LIMIT and
# DEFAULT_GT_TIME_LIMIT_FACTOR; eval/__init__.py's untrusted_check gives an input group's process
# min(EVALPLUS_TIMEOUT_PER_TASK = 60, the sum of its inputs' limits) + 1 s, and joins it 1 s more).
MIN_TIME_LIMIT_S, TIME_LIMIT_FACTOR, TIMEOUT_PER_GROUP_S, GROUP_MARGIN_S = 1.0, 4.0, 60.0, 2.0


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _tuples(inputs: list) -> list:
    """Each argument a tuple."""
    return [[tuple(lst) for lst in inp] for inp in inputs]


def _lists_of_tuples(inputs: list) -> list:
    """Each argument a list of tuples."""
    return [[[tuple(lst) for lst in lst_lst] for lst_lst in inp] for inp in inputs]


def _tuples_all_the_way(x):
    """Every list, at any depth, a tuple."""
    return tuple(_tuples_all_the_way(item) for item in x) if isinstance(x, list) else x


# EvalPlus's evalplus/data/mbpp.py `mbpp_deserialize_inputs`, as a table: task numbers, then how
# their inputs are turned back.
_MBPP_INPUTS = (
    ((2, 116, 132, 143, 222, 261, 273, 394, 399, 421, 424, 429, 470, 560, 579, 596, 616, 630, 726, 740, 744, 809), _tuples),
    ((63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780), _lists_of_tuples),
    ((75, 413, 444, 753), lambda inputs: [[[tuple(lst) for lst in inp[0]]] + [inp[1]] for inp in inputs]),
    ((106, 750), lambda inputs: [[inp[0]] + [tuple(inp[1])] for inp in inputs]),
    ((115,), lambda inputs: [[[set(item) if isinstance(item, list) and len(item) else {} for item in inp[0]]] for inp in inputs]),
    ((124,), lambda inputs: [(float(inp[0]), complex(inp[1])) for inp in inputs]),
    ((250, 405, 446, 617, 720, 763, 808), lambda inputs: [[tuple(inp[0])] + [inp[1]] for inp in inputs]),
    ((259, 401, 445), lambda inputs: _tuples(_lists_of_tuples(inputs))),
    ((278,), lambda inputs: _tuples([[[tuple(item) if isinstance(item, list) else item for item in inp[0]]] for inp in inputs])),
    ((307,), lambda inputs: [[tuple(inp[0])] + [inp[1], inp[2]] for inp in inputs]),
    ((722,), lambda inputs: [[{key: tuple(value) for key, value in inp[0].items()}] + inp[1:] for inp in inputs]),
    ((252,), lambda inputs: [[complex(inp[0])] for inp in inputs]),
    ((580, 615, 791), lambda inputs: [_tuples_all_the_way(inp) for inp in inputs]),
)
_MBPP_DESERIALIZE = {number: convert for numbers, convert in _MBPP_INPUTS for number in numbers}


def mbpp_deserialize_inputs(number: int, inputs: list) -> list:
    """MBPP+ stores tuples, sets and complex numbers as JSON lists and strings; EvalPlus's
    evalplus/data/mbpp.py `mbpp_deserialize_inputs` turns them back, task by task."""
    convert = _MBPP_DESERIALIZE.get(number)
    return convert(inputs) if convert else inputs


def _number(task_id: str) -> int:
    try:
        return int(task_id.rsplit("/", 1)[1])
    except (IndexError, ValueError):
        raise ValueError(f"task_id {task_id!r} does not end in /<number>") from None


def _read(path: Path) -> tuple[str, list[tuple[str, Record]]]:
    """The dataset ("humaneval" or "mbpp") and each record, checked and with inputs deserialized."""
    records, datasets = [], set()
    for where, record in jsonl_records(path):
        if not isinstance(record, dict):
            raise TaskFileError(f"{where}: expected a JSON object, got {type(record).__name__}")
        for name, kind in (("task_id", str), ("prompt", str), ("entry_point", str), ("canonical_solution", str),
                           ("base_input", list), ("plus_input", (list, dict)), ("atol", (int, float))):
            if name not in record:
                raise TaskFileError(f"{where}: missing field {name!r}")
            if not isinstance(record[name], kind) or isinstance(record[name], bool):
                raise TaskFileError(f"{where}: field {name!r} has the wrong type: {record[name]!r:.80}")
        if record["plus_input"] == {}:
            record["plus_input"] = []  # Mbpp/793 in v0.2.0: no plus inputs
        elif isinstance(record["plus_input"], dict):
            raise TaskFileError(f"{where}: field 'plus_input' should be a list, got {record['plus_input']!r:.80}")
        for name in ("base_input", "plus_input"):
            bad = [i for i, inp in enumerate(record[name]) if not isinstance(inp, list)]
            if bad:
                raise TaskFileError(f"{where}: {name}[{bad[0]}] should be a list of arguments, got {record[name][bad[0]]!r:.80}")
        dataset = "humaneval" if record["task_id"].startswith("HumanEval/") else "mbpp"
        datasets.add(dataset)
        try:
            number = _number(record["task_id"])
        except ValueError as e:
            raise TaskFileError(f"{where}: {e}") from None
        if dataset == "mbpp":
            try:
                for name in ("base_input", "plus_input"):
                    record[name] = mbpp_deserialize_inputs(number, record[name])
            except (TypeError, ValueError, IndexError, KeyError, AttributeError) as e:
                raise TaskFileError(f"{where}: cannot deserialize the inputs of {record['task_id']}: {e}") from None
        record["dataset"] = dataset
        record["program"] = record["prompt"] + record["canonical_solution"]
        records.append((where, record))
    if len(datasets) > 1:
        raise TaskFileError(f"{path}: mixes HumanEval and MBPP task ids")
    if not records:
        raise TaskFileError(f"{path}: no tasks in file")
    return datasets.pop(), records


def _run_canonical(jobs: list[dict], timeout_s: float) -> list[dict]:
    """Run evalplus_oracle.py as a script on `jobs` in a subprocess: one reply per job."""
    stdin = "".join(json.dumps(job) + "\n" for job in jobs)
    try:
        done = subprocess.run(
            [sys.executable, "-I", str(ORACLE_PATH)], input=stdin, capture_output=True, text=True,
            timeout=timeout_s, cwd="/",
        )
    except subprocess.TimeoutExpired:
        raise TaskFileError(
            f"computing expected outputs of {len(jobs)} canonical solutions ({jobs[0]['id']} ...) took over {timeout_s:g} s"
        ) from None
    replies = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    if len(replies) != len(jobs):
        raise TaskFileError(
            f"the canonical-solution runner ended after {len(replies)} of {len(jobs)} tasks "
            f"(exit code {done.returncode}): {done.stderr.strip()[-400:]}"
        )
    return replies


def expected_outputs(path: Path, records: list[tuple[str, Record]], cache_dir: Path) -> dict[str, dict[str, Any]]:
    """{task id: {"base", "plus" (encoded outputs), "base_time", "plus_time"}}, from the cache or computed."""
    cache = cache_dir / f"{file_sha256(path)}-{CODE_DIGEST}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    jobs = []
    for _, r in records:
        not_none = r["dataset"] == "mbpp" and r["entry_point"] in evalplus_oracle.MBPP_OUTPUT_NOT_NONE
        for group in ("base", "plus"):
            jobs.append({"id": r["task_id"], "group": group, "program": r["program"], "entry_point": r["entry_point"],
                         "inputs": evalplus_oracle.encode(r[f"{group}_input"]), "not_none": not_none})
    workers = max(1, min(4, os.cpu_count() or 1))
    chunks = [jobs[i::workers] for i in range(workers)]
    with ThreadPoolExecutor(workers) as pool:
        replies = [reply for part in pool.map(lambda c: _run_canonical(c, EXPECTED_TIMEOUT_S), chunks) for reply in part]
    where = {r["task_id"]: w for w, r in records}
    out: dict[str, dict[str, Any]] = {}
    for job, reply in zip([j for c in chunks for j in c], replies, strict=True):
        if "error" in reply:
            raise TaskFileError(f"{where[job['id']]}: the canonical solution of {job['id']} fails on its "
                                f"{job['group']} inputs: {reply['error']}")
        entry = out.setdefault(job["id"], {})
        entry[job["group"]], entry[f"{job['group']}_time"] = reply["outputs"], reply["times"]
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(out))
    partial.replace(cache)  # whole or absent, even with several loaders at once
    return out


def time_limit(canonical_s: float, factor: float = TIME_LIMIT_FACTOR) -> float:
    """EvalPlus's time limit of one input: max(1 s, 4 (`factor`) x the canonical solution's time on it)."""
    return max(MIN_TIME_LIMIT_S, factor * canonical_s)


def too_large(output) -> bool:
    return isinstance(output, dict) and "too_large" in output


def left_out(path: str | Path, cache_dir: str | Path | None = None) -> dict[str, list[int]]:
    """{task id: indices of plus inputs} whose expected outputs are too large to check (see MAX_OUTPUT_BYTES)."""
    from coderloo.runtime import USER_CACHE

    path = Path(path)
    _, records = _read(path)
    expected = expected_outputs(path, records, Path(cache_dir) if cache_dir else USER_CACHE / "evalplus")
    found = {task_id: [i for i, out in enumerate(e["plus"]) if too_large(out)] for task_id, e in expected.items()}
    return {task_id: indices for task_id, indices in found.items() if indices}


def subset(n: int, limit: int | None) -> list[int]:
    """At most `limit` of range(n), evenly spread and always the same."""
    if limit is None or n <= limit:
        return list(range(n))
    return sorted({round(j * (n - 1) / max(1, limit - 1)) for j in range(limit)}) if limit > 0 else []


def load_evalplus(
    path: str | Path, plus: bool = True, plus_limit: int | None = None, cache_dir: str | Path | None = None,
    time_limit_factor: float | None = None,
) -> list[Task]:
    """HumanEvalPlus-*.jsonl.gz or MbppPlus-*.jsonl.gz as Tasks (ids humaneval+/N, mbpp+/N; with
    plus=False, the base inputs only: humaneval+base/N, mbpp+base/N). With plus inputs, the base
    inputs are the shown tests (feedback may quote them) and the plus inputs the held ones; both
    decide the verdict, as EvalPlus's plus score does. Without, every base input is held.
    `plus_limit` keeps an evenly spread subset of each task's plus inputs (for quick checks);
    `time_limit_factor`, EvalPlus's --gt-time-limit-factor (the canonical time's multiple an input
    may take; None: its default, 4)."""
    from coderloo.runtime import USER_CACHE

    path = Path(path)
    dataset, records = _read(path)
    expected = expected_outputs(path, records, Path(cache_dir) if cache_dir else USER_CACHE / "evalplus")
    name = ("humaneval+" if dataset == "humaneval" else "mbpp+") + ("" if plus else "base")
    factor = TIME_LIMIT_FACTOR if time_limit_factor is None else time_limit_factor

    def make_task(record: Record) -> Task:
        outputs = expected[record["task_id"]]
        cases = [[evalplus_oracle.encode(args), out] for args, out in zip(record["base_input"], outputs["base"], strict=True)
                 if not too_large(out)]
        if len(cases) < len(record["base_input"]):
            raise ValueError(f"{record['task_id']}: a base input's expected output is over {evalplus_oracle.MAX_OUTPUT_BYTES} bytes")
        num_base = len(cases)
        groups = [[time_limit(t, factor) for t in outputs["base_time"]]]
        if plus:
            keep = [i for i in subset(len(record["plus_input"]), plus_limit) if not too_large(outputs["plus"][i])]
            cases += [[evalplus_oracle.encode(record["plus_input"][i]), outputs["plus"][i]] for i in keep]
            groups.append([time_limit(outputs["plus_time"][i], factor) for i in keep])
        if not cases:
            raise ValueError(f"{record['task_id']} has no inputs")
        time_limits = [limit for group in groups for limit in group]
        entry_point = record["entry_point"]
        setup = (
            '_evalplus = {"__name__": "evalplus_oracle"}\n'
            f"exec({ORACLE_SOURCE!r}, _evalplus)\n"
            f"_evalplus['load']({dataset!r}, {entry_point!r}, {record['atol']!r}, {num_base}, "
            f"{json.dumps(cases)!r}, {time_limits!r}, {CALL_WITHIN})\n"
        )
        return Task(
            id=f"{name}/{_number(record['task_id'])}",
            prompt=record["prompt"],
            tests=[f"_evalplus['check']({entry_point}, {i})" for i in range(len(cases))],
            entry_point=entry_point,
            reference=record["program"],
            difficulty=difficulty(record["canonical_solution"]),
            source=name,
            prompt_is_code=True,
            test_setup=setup,
            split="test",
            public_tests=num_base if plus else 0,  # the base inputs shown, the plus ones held
            run_time_s=sum(min(TIMEOUT_PER_GROUP_S, sum(group)) + GROUP_MARGIN_S for group in groups if group),
        )

    return build_tasks(path, records, {}, make_task)
