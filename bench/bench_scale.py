"""Qwen2.5-Coder-0.5B's shapes through the whole pipeline on CPU (configs/scale-0.5b.yaml): the step
timeline and each actor's peak memory, DeepSpeed at ZeRO-2 and at ZeRO-3 side by side in one run;
then the final checkpoint reloaded in vLLM by `coderloo eval`.

    python -m bench.bench_scale

Each run: 3 RL steps of 4 prompts x 4 samples (vLLM in bf16, 2 learner ranks in bf16, the
bucketed weight push, a checkpoint at the end and the final evaluation on it). Peak memory per
actor is the kernel's high-water mark of resident memory (VmHWM) since the actor started, with
its unsampled descendants (coderloo/ops/resources.py), read after every step; the driver's is that of
the stage's own process, which loads the tasks (and, in the first run, builds the model).
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.plots import comparison
from coderloo.config import load_config
from coderloo.controller import train
from coderloo.metrics import read_metrics
from coderloo.ops.plan import plan

CONFIG = "configs/scale-0.5b.yaml"
STAGES = (2, 3)
TIMELINE = {"time_generate_s": "generate", "time_score_tail_s": "score tail", "time_wait_rollouts_s": "wait rollouts",
            "time_learn_s": "learn", "time_sync_s": "push", "time_step_s": "step"}


# The plan's actors against the labels of the measured processes (coderloo/ops/resources.py).
PLANNED = {"learner rank": "learner-", "rollout worker": "rollout-", "reward replica": "reward-replica-",
           "sandbox executor": "sandbox-", "driver": "driver"}


def planned_mb(stage: int) -> dict[str, float]:
    """`coderloo plan`'s total for one actor of each kind (MB), on this machine."""
    actors = plan(load_config(CONFIG, [f"learner.zero_stage={stage}"])).actors
    return {a.name: a.total / 1e6 for a in actors if a.name in PLANNED}


def measured_mb(peaks: dict[str, float], prefix: str) -> float:
    """The largest peak among the processes of one kind (MB)."""
    return max((v for a, v in peaks.items() if a.startswith(prefix)), default=0.0)


def train_stage(stage: int, out: Path) -> None:
    train(load_config(CONFIG, [f"train.output_dir={out}", f"learner.zero_stage={stage}"]))


def run(stage: int, out: Path) -> dict:
    """One stage's run, its driver a process of its own (as a user's `coderloo train`: a driver
    that built the model or ran the other stage holds memory it does not give back)."""
    child = subprocess.run([sys.executable, "-m", "bench.bench_scale", str(stage), str(out)], check=True, stdout=subprocess.PIPE, text=True)
    print(child.stdout, end="")
    records = read_metrics(out / "metrics.jsonl")
    rl = [r for r in records if r["phase"] == "rl"]
    resources = [r for r in records if r["phase"] == "resources"]
    peaks: dict[str, float] = {}
    for r in resources:
        for key, value in r.items():
            if key.startswith("peak_rss_mb/"):
                peaks[key.split("/", 1)[1]] = max(peaks.get(key.split("/", 1)[1], 0.0), value)
    return {"rl": rl, "peaks": peaks, "sync_mb": rl[-1]["sync_bytes"] / 2**20, "failed_pushes": child.stdout.count("weight push failed")}


def evaluate(checkpoint: Path, out: Path) -> dict:
    """`coderloo eval` of the checkpoint, in a process of its own (vLLM loads it)."""
    subprocess.run([sys.executable, "-m", "coderloo.cli", "eval", "--config", CONFIG, "--model", str(checkpoint), "--out", str(out)],
                   check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> list[dict]:
    root = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    results = {stage: run(stage, root / f"zero{stage}") for stage in STAGES}
    report = evaluate(root / "zero2" / "checkpoints" / "final", root / "eval.json")
    print(f"{CONFIG}: Qwen2.5-Coder-0.5B's shapes (494M parameters), 2 learner ranks in bf16, vLLM in bf16, on CPU")
    for stage, r in results.items():
        print(f"\nZeRO-{stage}: step timeline (s); each push moved {r['sync_mb']:.0f} MiB; "
              f"{r['failed_pushes']} of {len(r['rl'])} pushes failed and were made again after the rollout workers recovered")
        print("  step " + "".join(f"{label:>15s}" for label in TIMELINE.values()))
        for record in r["rl"]:
            print(f"  {record['step']:4d} " + "".join(f"{record.get(key, 0.0):15.1f}" for key in TIMELINE))
    actors = sorted({a for r in results.values() for a in r["peaks"]})
    print("\npeak resident memory per actor (MB)\n  actor              " + "".join(f"{'ZeRO-' + str(s):>10s}" for s in STAGES))
    for actor in actors:
        print(f"  {actor:18s} " + "".join(f"{results[s]['peaks'].get(actor, 0.0):10.0f}" for s in STAGES))
    print("\n`coderloo plan`'s prediction (at learner.max_tokens_per_micro_batch, the sandbox programs at their memory "
          "limit) against the measured peak, MB, one actor of each kind")
    for stage in STAGES:
        predicted = planned_mb(stage)
        for name, prefix in PLANNED.items():
            got = measured_mb(results[stage]["peaks"], prefix)
            print(f"  ZeRO-{stage} {name:18s} planned {predicted[name]:8.0f}  measured {got:8.0f}  measured / planned {got / predicted[name]:5.2f}")
    print(f"\n`coderloo eval --model` of ZeRO-2's final checkpoint (vLLM): {json.dumps(report.get('results', report))[:300]}")
    learners = {f"ZeRO-{s}": max(v for a, v in results[s]["peaks"].items() if a.startswith("learner-")) for s in STAGES}
    return [comparison("peak memory of a learner rank, 0.5B shapes, 2 ranks, bf16", "MB", "ZeRO-3", learners, lower_is_better=True)]


if __name__ == "__main__":
    if len(sys.argv) > 1:
        train_stage(int(sys.argv[1]), Path(sys.argv[2]))
    else:
        main()
