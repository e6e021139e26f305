"""The benchmark sets `coderloo eval --sets` knows: which file, which loader, which stop sequences.

    mbpp              MBPP test split (ids 11-510), the MBPP paper's 3-shot prompt (tasks 2, 3, 4)
    mbpp-sanitized    sanitized MBPP, test split, the same 3-shot prompt (its own tasks 2, 3, 4)
    humaneval         HumanEval, its own tests
    humaneval+        HumanEval+ v0.1.10: base + plus inputs, EvalPlus's comparison (evalplus.py)
    mbpp+             MBPP+ v0.2.0: base + plus inputs, EvalPlus's comparison
    humaneval+base    HumanEval+ with base inputs only (EvalPlus's "base" score)
    mbpp+base         MBPP+ with base inputs only (what EvalPlus reports as "MBPP")
    apps              APPS test split (codeparrot/apps test.jsonl, as apps-test.jsonl)
    codecontests      CodeContests test split (deepmind/code_contests data/test-*.parquet, as
                      codecontests-test.parquet)
    taco              TACO test split (BAAI/TACO ALL/test-*.parquet, as taco-test.parquet)
    livecodebench     LiveCodeBench code generation (livecodebench/code_generation_lite's test.jsonl,
                      test2.jsonl, ...: the releases wanted, in a directory livecodebench/); with
                      eval.after, only the problems published after a model's cut-off

Stop sequences: EvalPlus's for direct completion of a base model (evalplus/provider/utility.py)
for the HumanEval and MBPP+ families; `[DONE]` ends an answer of the 3-shot MBPP prompt. The
competitive-programming sets have none: the answer is a whole program (competitive.py's prompt).
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from coderloo.config import ConfigError
from coderloo.tasksets.benchmarks import load_task_set
from reward_service.tasks import Task

EVALPLUS_EOS = ("\nif __name__", "\ndef main(", "\nprint(")
HUMANEVAL_STOP = ("\ndef ", "\nclass ", "\nimport ", "\nfrom ", "\nassert ") + EVALPLUS_EOS
MBPP_PLUS_STOP = ('\n"""', "\nassert") + EVALPLUS_EOS
MBPP_FEW_SHOT_STOP = ("[DONE]",)


@dataclass(frozen=True)
class EvalSet:
    loader: str  # a name of benchmarks.LOADERS
    file: str  # the file's name in the data directory
    stop: tuple[str, ...]


EVAL_SETS: dict[str, EvalSet] = {
    "mbpp": EvalSet("mbpp-3shot", "mbpp.jsonl", MBPP_FEW_SHOT_STOP),
    "mbpp-sanitized": EvalSet("mbpp-sanitized-3shot", "sanitized-mbpp.json", MBPP_FEW_SHOT_STOP),
    "humaneval": EvalSet("humaneval", "HumanEval.jsonl.gz", HUMANEVAL_STOP),
    "humaneval+": EvalSet("humaneval+", "HumanEvalPlus-v0.1.10.jsonl.gz", HUMANEVAL_STOP),
    "mbpp+": EvalSet("mbpp+", "MbppPlus-v0.2.0.jsonl.gz", MBPP_PLUS_STOP),
    "humaneval+base": EvalSet("humaneval+base", "HumanEvalPlus-v0.1.10.jsonl.gz", HUMANEVAL_STOP),
    "mbpp+base": EvalSet("mbpp+base", "MbppPlus-v0.2.0.jsonl.gz", MBPP_PLUS_STOP),
    "apps": EvalSet("apps", "apps-test.jsonl", ()),
    "codecontests": EvalSet("codecontests", "codecontests-test.parquet", ()),
    "taco": EvalSet("taco", "taco-test.parquet", ()),
    "livecodebench": EvalSet("livecodebench", "livecodebench", ()),
}


def eval_set(name: str) -> EvalSet:
    try:
        return EVAL_SETS[name]
    except KeyError:
        raise ValueError(f"unknown evaluation set {name!r}; known: {', '.join(EVAL_SETS)}") from None


def load_eval_set(name: str, data_dir: str | Path, max_tasks: int = 0, after: datetime.date | None = None) -> list[Task]:
    """The test-split tasks of a set, read from `data_dir`/<its file>: those published after `after`
    (None: all), then the first `max_tasks` of them (0: all)."""
    spec = eval_set(name)
    path = Path(data_dir) / spec.file
    if not path.exists():
        raise FileNotFoundError(f"evaluation set {name!r}: no file {path} (set eval.data_dir or --data-dir)")
    tasks = published_after([t for t in load_task_set(spec.loader, path) if t.split == "test"], after, name)
    return tasks[:max_tasks] if max_tasks else tasks


def published_after(tasks: list[Task], after: datetime.date | None, name: str) -> list[Task]:
    """The tasks published after the day `after` (None: all of them); tasks without a date are left out."""
    if after is None:
        return tasks
    kept = [t for t in tasks if t.date is not None and t.date > after]
    if not kept:
        undated = sum(t.date is None for t in tasks)
        raise ConfigError(f"eval.after / --after {after}: none of the {len(tasks)} tasks of {name!r} was published "
                          f"after it ({undated} have no date)")
    return kept
