"""What the tests of whole training runs share: the small run's overrides, its RL records, waiting for
one, and the live actors by name."""
import time
from pathlib import Path

import ray

from coderloo.metrics import read_metrics


SMALL = [
    "sft.steps=2",
    "sft.batch_size=8",
    "train.prompts_per_step=4",
    "train.eval_every=0",
    "rollout.samples_per_prompt=4",
    "rollout.max_new_tokens=16",
    "learner.advantage.filter_uninformative=false",
    "tasks.max_eval_tasks=2",
    "eval.samples_per_task=2",
    "eval.k=[1]",
    "eval.greedy=false",
]


def rl_steps(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [r for r in read_metrics(path) if r["phase"] == "rl"] if path.exists() else []


def wait_for_step(out: Path, step: int, timeout: float = 600) -> None:
    wait_for_record(out, lambda r: r["step"] >= step, f"step {step}", timeout)


def wait_for_record(out: Path, where, what: str, timeout: float = 600) -> dict:
    """The first RL record in `out` for which `where` holds, once one is written."""
    deadline = time.time() + timeout
    while not (found := [r for r in rl_steps(out) if where(r)]):
        if time.time() > deadline:
            raise TimeoutError(f"{what} not reached in {out}")
        time.sleep(0.2)
    return found[0]


def named(prefix: str) -> list[tuple[str, str]]:
    return [(a["name"], a["namespace"]) for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)]
