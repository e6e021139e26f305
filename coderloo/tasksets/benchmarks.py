"""Loaders that turn the public benchmark files (MBPP, sanitized MBPP, HumanEval; HumanEval+ and
MBPP+ through evalplus.py; APPS, CodeContests, TACO, LiveCodeBench and a generic column mapping
through competitive.py) into Tasks.

Each loader reads the file as published (see ../shared/data/README.md) and returns list[Task].
A malformed file raises TaskFileError naming where (file:line, or file: record N for a JSON
array) and why.
"""
from __future__ import annotations

import ast
import json
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator


from coderloo.tasksets.competitive import (
    ColumnMapping,
    load_apps,
    load_code_r1,
    load_codecontests,
    load_deepcoder,
    load_generic,
    load_livecodebench,
    load_taco,
)
from reward_service.tasks import Record, Task, TaskFileError, build_tasks, jsonl_records, load_jsonl

# The MBPP paper's prompt (Austin et al. 2021), without its few-shot [BEGIN]/[DONE] wrapping, quoting
# a task's first test only (as EvalPlus's MBPP+ prompt does): that test is shown, the others held
# (never quoted); all of them decide the verdict, as MBPP's grader runs them. The paper quoted all
# three, which a model can answer instead of the task.
MBPP_PROMPT = (
    "You are an expert Python programmer, and here is your task: {text} "
    "Your code should pass these tests:\n\n{tests}\n"
)



def mbpp_prompt(text: str, tests: list[str]) -> str:
    return MBPP_PROMPT.format(text=text.strip(), tests="\n".join(tests))


def mbpp_split(task_id: int) -> str:
    """The standard MBPP splits by task id."""
    if 1 <= task_id <= 10:
        return "fewshot"
    if 11 <= task_id <= 510:
        return "test"
    if 511 <= task_id <= 600:
        return "validation"
    if 601 <= task_id <= 974:
        return "train"
    raise ValueError(f"task_id {task_id} is outside MBPP's ids 1-974")


def difficulty(solution: str) -> int:
    """A rough 1-5 from the lines of code a model has to write for the reference solution.

    Counts non-blank, non-comment lines (for HumanEval only the body, since the prompt holds the
    signature) and maps <=2, <=4, <=7, <=12, more to 1..5. The limits split MBPP roughly into
    5% / 35% / 30% / 20% / 10%. It measures length, not insight: use it for curricula and
    reporting, not as a ground truth.
    """
    lines = sum(1 for line in solution.splitlines() if line.strip() and not line.lstrip().startswith("#"))
    return 1 + sum(lines > limit for limit in (2, 4, 7, 12))


def _called_function(test: str, reference: str) -> str:
    """The function under test: the first name the test calls that the reference defines.

    Looking at the reference's definitions skips wrappers like set(...) or math.isclose(...) and
    still finds a solution that shadows a builtin (MBPP 126 defines `sum`).
    """
    try:
        with warnings.catch_warnings():  # benchmark code has regexes like '\.' in plain strings
            warnings.simplefilter("ignore")
            definitions = ast.parse(reference).body
            calls = ast.walk(ast.parse(test))
    except SyntaxError as e:
        raise ValueError(f"cannot parse the reference or the first test: {e.msg} (line {e.lineno})") from None
    defined = {
        node.name for node in definitions if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }
    for node in calls:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in defined:
            return node.func.id
    raise ValueError(f"the first test calls no function that the reference defines: {test[:100]!r}")


def _lf(text: str) -> str:
    """MBPP code ends lines with CRLF, and four solutions end in a lone CR."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _mbpp_task(record: Record, id_prefix: str, source: str, text: str, test_setup: str) -> Task:
    reference = _lf(record["code"])
    tests = record["test_list"]
    if not tests:
        raise ValueError("test_list is empty")
    return Task(
        id=f"{id_prefix}/{record['task_id']}",
        prompt=mbpp_prompt(text, tests[:1]),
        tests=tests,
        entry_point=_called_function(tests[0], reference),
        reference=reference,
        difficulty=difficulty(reference),
        source=source,
        prompt_is_code=False,
        test_setup=test_setup,
        split=mbpp_split(record["task_id"]),
        public_tests=1,
    )


def load_mbpp(path: str | Path) -> list[Task]:
    """mbpp.jsonl: the full MBPP (974 tasks). challenge_test_list is not used."""
    path = Path(path)
    fields = {"text": str, "code": str, "task_id": int, "test_setup_code": str, "test_list": list}
    return build_tasks(
        path,
        jsonl_records(path),
        fields,
        lambda r: _mbpp_task(r, "mbpp", "mbpp", r["text"], _lf(r["test_setup_code"])),
    )


def load_sanitized_mbpp(path: str | Path) -> list[Task]:
    """sanitized-mbpp.json: the hand-verified MBPP subset (427 tasks); test_imports become test_setup."""
    path = Path(path)
    fields = {"prompt": str, "code": str, "task_id": int, "test_imports": list, "test_list": list}
    return build_tasks(
        path,
        _json_array_records(path),
        fields,
        lambda r: _mbpp_task(r, "mbpp-sanitized", "mbpp-sanitized", r["prompt"], "\n".join(r["test_imports"])),
    )


def _humaneval_task(record: Record) -> Task:
    return Task(
        id=record["task_id"],
        prompt=record["prompt"],
        tests=[record["test"] + "\ncheck(" + record["entry_point"] + ")"],
        entry_point=record["entry_point"],
        reference=record["prompt"] + record["canonical_solution"],
        difficulty=difficulty(record["canonical_solution"]),
        source="humaneval",
        prompt_is_code=True,
        split="test",
    )


def load_humaneval(path: str | Path) -> list[Task]:
    """HumanEval.jsonl.gz (or an uncompressed .jsonl): 164 tasks, all in the test split."""
    path = Path(path)
    fields = {"task_id": str, "prompt": str, "entry_point": str, "canonical_solution": str, "test": str}
    return build_tasks(path, jsonl_records(path), fields, _humaneval_task)


MBPP_SHOTS = (2, 3, 4)  # the MBPP paper's few-shot prompt uses these tasks


def mbpp_few_shot(tasks: list[Task], shots: tuple[int, ...] = MBPP_SHOTS) -> list[Task]:
    """The tasks with the MBPP paper's few-shot prompt for base models: for each shot, its
    zero-shot prompt, then `[BEGIN]`, its reference code and `[DONE]`; then the task's own
    prompt and `[BEGIN]`. The model's answer ends at `[DONE]` (a stop sequence)."""
    by_number = {int(t.id.rsplit("/", 1)[1]): t for t in tasks}
    missing = [n for n in shots if n not in by_number]
    if missing:
        raise ValueError(f"the few-shot prompt needs tasks {list(shots)}; the file lacks {missing}")
    prefix = "".join(
        f"{by_number[n].prompt}[BEGIN]\n{by_number[n].reference.strip()}\n[DONE]\n\n" for n in shots
    )
    return [t.model_copy(update={"prompt": f"{prefix}{t.prompt}[BEGIN]\n"}) for t in tasks]


def _evalplus(plus: bool) -> Callable[[str | Path], list[Task]]:
    def load(path: str | Path) -> list[Task]:
        from coderloo.tasksets.evalplus import load_evalplus  # it imports this module

        return load_evalplus(path, plus=plus)

    return load


LOADERS: dict[str, Callable[[str | Path], list[Task]]] = {
    "mbpp": load_mbpp,
    "mbpp-sanitized": load_sanitized_mbpp,
    "humaneval": load_humaneval,
    "jsonl": load_jsonl,
    "mbpp-3shot": lambda path: mbpp_few_shot(load_mbpp(path)),
    "mbpp-sanitized-3shot": lambda path: mbpp_few_shot(load_sanitized_mbpp(path)),
    "humaneval+": _evalplus(plus=True),
    "mbpp+": _evalplus(plus=True),
    "humaneval+base": _evalplus(plus=False),
    "mbpp+base": _evalplus(plus=False),
    "apps": load_apps,
    "codecontests": load_codecontests,
    "taco": load_taco,
    "livecodebench": load_livecodebench,
    "deepcoder": load_deepcoder,
    "code-r1": load_code_r1,
    "generic": load_generic,  # with its ColumnMapping: load_task_set(..., columns)
}


def load_task_set(name: str, path: str | Path, columns: ColumnMapping | None = None) -> list[Task]:
    """Load a task set by its format name (a key of LOADERS): mbpp, mbpp-sanitized, humaneval,
    jsonl (Task records), their 3-shot MBPP forms, the EvalPlus sets (evalplus.py), or the
    competitive-programming sets (competitive.py): apps, codecontests, taco, livecodebench, deepcoder, code-r1 and
    generic, which reads the file through `columns`."""
    try:
        loader = LOADERS[name]
    except KeyError:
        raise ValueError(f"unknown task set {name!r}; known: {', '.join(LOADERS)}") from None
    return load_generic(path, columns) if name == "generic" else loader(path)


def _json_array_records(path: Path) -> Iterator[tuple[str, Any]]:
    """(location, record) for each element of a file holding one JSON array.

    The published file is a single line, so records are located by index, not by line.
    """
    text = path.read_text(encoding="utf-8")
    try:
        records = json.loads(text)
    except json.JSONDecodeError as e:
        raise TaskFileError(f"{path}:{e.lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(records, list):
        raise TaskFileError(f"{path}:1: expected a JSON array of task records, got {type(records).__name__}")
    for index, record in enumerate(records):
        yield f"{path}: record {index}", record
