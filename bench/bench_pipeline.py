"""Asynchronous against synchronous training: the same default config and number of steps, one run.

    python -m bench.bench_pipeline            # BENCH_PIPELINE_STEPS=150 (the default run length)

Two training runs of the default config (SFT warm-up, then RL), one with `train.max_staleness=0`
(generate, score, train, push, in turn) and one with 1 (step t+1 is generated and scored while
the learner trains on step t). Mid-run evaluations and checkpoints are off so that the RL phase
is timed alone. Reported for each: RL samples per second (samples / the sum of step times), the
learner's idle fraction (1 - time training / time of the steps) and held-out pass@1 at the end.
"""
from __future__ import annotations

import os
import tempfile

from bench.plots import comparison
from coderloo.config import load_config
from coderloo.controller import train
from coderloo.metrics import read_metrics

STEPS = int(os.environ.get("BENCH_PIPELINE_STEPS", "150"))


def run(staleness: int, out: str) -> dict:
    config = load_config("configs/default.yaml", [
        f"train.output_dir={out}", f"train.steps={STEPS}", f"train.max_staleness={staleness}",
        "train.eval_every=0", "train.checkpoint_every=0",
    ])
    summary = train(config)
    rl = [r for r in read_metrics(f"{out}/metrics.jsonl") if r["phase"] == "rl"]
    step_time = sum(r["time_step_s"] for r in rl)
    return {
        "samples_per_s": sum(r["samples"] for r in rl) / step_time,
        "learner_idle": 1 - sum(r["time_learn_s"] for r in rl) / step_time,
        "rl_seconds": step_time,
        "pass@1": summary["final"]["pass@1"],
        "greedy_pass@1": summary["final"]["greedy_pass@1"],
    }


def main() -> list[dict]:
    root = tempfile.mkdtemp(prefix="bench-pipeline-")
    results = {mode: run(s, f"{root}/{mode}") for mode, s in (("sync", 0), ("async", 1))}
    print(f"pipeline, default config, {STEPS} RL steps each (no mid-run evals)")
    for mode, r in results.items():
        print(f"  {mode:5s}  {r['samples_per_s']:6.1f} samples/s  learner idle {r['learner_idle']:5.1%}  "
              f"RL {r['rl_seconds']:6.0f} s  final pass@1 {r['pass@1']:.3f}  greedy {r['greedy_pass@1']:.3f}")
    print(f"  async / sync: {results['async']['samples_per_s'] / results['sync']['samples_per_s']:.2f}x samples/s")
    return [comparison(f"pipeline, {STEPS} RL steps", "samples/s", "async",
                       {mode: r["samples_per_s"] for mode, r in results.items()})]


if __name__ == "__main__":
    main()
