"""Asynchronous against synchronous training: the same default config and number of steps.

    python -m bench.bench_pipeline     # BENCH_PIPELINE_STEPS=20 RL steps, BENCH_PIPELINE_REPEATS=3 runs each

Training runs of the default config (SFT warm-up, then RL), with `train.max_staleness=0`
(generate, score, train, push, in turn) and with 1 (step t+1 is generated and scored while the
learner trains on step t), alternating, BENCH_PIPELINE_REPEATS times each. Mid-run evaluations
and checkpoints are off so that the RL phase is timed alone. Reported for each mode, as medians
over its runs: RL samples per second (samples / the sum of step times), the learner's idle
fraction (1 - time training / time of the steps) and held-out pass@1 at the end; and the ratio
async / sync of each pair of runs.
"""
from __future__ import annotations

import os
import tempfile

from bench.plots import alternating, comparison, medians
from coderloo.config import load_config
from coderloo.controller import train
from coderloo.metrics import read_metrics

STEPS = int(os.environ.get("BENCH_PIPELINE_STEPS", "20"))
REPEATS = int(os.environ.get("BENCH_PIPELINE_REPEATS", "3"))


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
    runs = alternating(REPEATS, {mode: lambda i, mode=mode, s=staleness: run(s, f"{root}/{mode}-{i}")
                                 for mode, staleness in (("sync", 0), ("async", 1))})
    median = medians(runs)
    ratios = [a["samples_per_s"] / s["samples_per_s"] for s, a in zip(runs["sync"], runs["async"])]
    print(f"pipeline, default config, {STEPS} RL steps each (no mid-run evals), medians of {REPEATS} runs each")
    for mode, r in median.items():
        each = ", ".join(f"{x['samples_per_s']:.1f}" for x in runs[mode])
        print(f"  {mode:5s}  {r['samples_per_s']:6.1f} samples/s (runs: {each})  learner idle {r['learner_idle']:5.1%}  "
              f"RL {r['rl_seconds']:6.0f} s  final pass@1 {r['pass@1']:.3f}  greedy {r['greedy_pass@1']:.3f}")
    print(f"  async / sync: {median['async']['samples_per_s'] / median['sync']['samples_per_s']:.2f}x samples/s "
          f"(per pair of runs: {', '.join(f'{r:.2f}x' for r in ratios)})")
    return [comparison(f"pipeline, {STEPS} RL steps, median of {REPEATS}", "samples/s", "async",
                       {mode: r["samples_per_s"] for mode, r in median.items()})]


if __name__ == "__main__":
    main()
