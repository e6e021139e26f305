"""The mismatch corrections on the asynchronous run: each mode of learner.loss.mismatch against
plain truncated importance sampling (TIS, the default).

    python -m bench.bench_mismatch    # BENCH_MISMATCH_STEPS=30 RL steps, BENCH_MISMATCH_REPEATS=2 runs each

Training runs of configs/async-pinned.yaml (train.max_staleness 1: each step's samples are one
policy version old, and the engine's kernels are not the learner's), one per correction, taking
turns, BENCH_MISMATCH_REPEATS times, repeat i with train.seed i (a run of this preset is
reproducible: the same seed gives the same pass@1, so the seeds give the spread). Reported per correction, as medians over its runs: the share
of tokens (or, for the sequence modes, of sequences' tokens) it truncated or masked, the mean
importance weight, the mean per-token k3 estimate of KL(sampler || learner) and the spread of the
sequences' log-ratios (means over the steps), RL samples/s, and held-out pass@1 at the end.
"""
from __future__ import annotations

import os
import statistics
import tempfile

from bench.bench_pipeline import bench_config
from bench.plots import alternating, comparison, medians
from coderloo.controller import train
from coderloo.metrics import read_metrics

STEPS = int(os.environ.get("BENCH_MISMATCH_STEPS", "30"))
REPEATS = int(os.environ.get("BENCH_MISMATCH_REPEATS", "2"))
MODE = "learner.loss.mismatch.mode"
CORRECTIONS = {
    "TIS (token_truncate, cap 2)": (),
    "token_mask [0.5, 2]": (f"{MODE}=token_mask",),
    "IcePop (token_mask [0.5, 5])": (f"{MODE}=token_mask", "learner.loss.mismatch.floor=0.5", "learner.loss.mismatch.cap=5"),
    "sequence_truncate (cap 2)": (f"{MODE}=sequence_truncate",),
    "sequence_mask [0.5, 2]": (f"{MODE}=sequence_mask",),
}


def run(overrides: tuple[str, ...], out: str, seed: int) -> dict:
    summary = train(bench_config(1, out, "pinned", (*overrides, f"train.seed={seed}"), steps=STEPS))
    rl = [r for r in read_metrics(f"{out}/metrics.jsonl") if r["phase"] == "rl" and "mismatch_weight_mean" in r]

    def mean(key: str) -> float:
        return statistics.mean(r.get(key, 0.0) for r in rl)

    return {
        "changed": mean("mismatch_truncated_fraction") + mean("mismatch_masked_fraction"),
        "weight": mean("mismatch_weight_mean"),
        "kl_k3": mean("mismatch_kl_k3"),
        "log_ratio_std": mean("mismatch_sequence_log_ratio_std"),
        "samples_per_s": sum(r["samples"] for r in rl) / sum(r["time_step_s"] for r in rl),
        "pass@1": summary["final"]["pass@1"],
        "greedy_pass@1": summary["final"]["greedy_pass@1"],
    }


def main() -> list[dict]:
    root = tempfile.mkdtemp(prefix="bench-mismatch-")
    names = {name: f"c{i}" for i, name in enumerate(CORRECTIONS)}
    runs = alternating(REPEATS, {name: lambda i, name=name: run(CORRECTIONS[name], f"{root}/{names[name]}-{i}", i) for name in CORRECTIONS})
    median = medians(runs)
    print(f"mismatch corrections, configs/async-pinned.yaml (max_staleness 1), {STEPS} RL steps each; medians of {REPEATS} runs "
          f"(train.seed 0-{REPEATS - 1})")
    print(f"  {'correction':30s} {'truncated/masked':>16s} {'weight':>7s} {'k3 KL':>9s} {'seq log-ratio sd':>16s} {'samples/s':>9s}  pass@1 (runs)  greedy")
    for name, r in median.items():
        each = ", ".join(f"{x['pass@1']:.3f}" for x in runs[name])
        print(f"  {name:30s} {r['changed']:16.2%} {r['weight']:7.3f} {r['kl_k3']:9.2e} {r['log_ratio_std']:16.3f} {r['samples_per_s']:9.1f}  "
              f"{r['pass@1']:.3f} ({each})  {r['greedy_pass@1']:.3f}")
    return [comparison(f"mismatch corrections on the asynchronous run, {STEPS} RL steps, median of {REPEATS}", "held-out pass@1",
                       "TIS (token_truncate, cap 2)", {name: r["pass@1"] for name, r in median.items()}, key="mismatch corrections")]


if __name__ == "__main__":
    main()
