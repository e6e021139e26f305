"""The benchmark sets `coderloo eval --sets` knows: which file, which loader, which stop sequences.

    mbpp              MBPP test split (ids 11-510), the MBPP paper's 3-shot prompt (tasks 2, 3, 4)
    mbpp-sanitized    sanitized MBPP, test split, the same 3-shot prompt (its own tasks 2, 3, 4)
    humaneval         HumanEval, its own tests
    humaneval+        HumanEval+ v0.1.10: base + plus inputs, EvalPlus's comparison (evalplus.py)
    mbpp+             MBPP+ v0.2.0: base + plus inputs, EvalPlus's comparison
    humaneval+base    HumanEval+ with base inputs only (EvalPlus's "base" score)
    mbpp+base         MBPP+ with base inputs only (what EvalPlus reports as "MBPP")

Stop sequences: EvalPlus's for direct completion of a base model (evalplus/provider/utility.py)
for the HumanEval and MBPP+ families; `[DONE]` ends an answer of the 3-shot MBPP prompt.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
}


def eval_set(name: str) -> EvalSet:
    try:
        return EVAL_SETS[name]
    except KeyError:
        raise ValueError(f"unknown evaluation set {name!r}; known: {', '.join(EVAL_SETS)}") from None


def load_eval_set(name: str, data_dir: str | Path, max_tasks: int = 0) -> list[Task]:
    """The test-split tasks of a set, read from `data_dir`/<its file>; the first `max_tasks` (0: all)."""
    spec = eval_set(name)
    path = Path(data_dir) / spec.file
    if not path.exists():
        raise FileNotFoundError(f"evaluation set {name!r}: no file {path} (set eval.data_dir or --data-dir)")
    tasks = [t for t in load_task_set(spec.loader, path) if t.split == "test"]
    return tasks[:max_tasks] if max_tasks else tasks
