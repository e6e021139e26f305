"""In-flight weight updates against draining the engines first, and partial rollouts on top, on
completions whose lengths vary more than tenfold.

    python -m bench.bench_in_flight    # BENCH_IN_FLIGHT_STEPS=20 RL steps, BENCH_IN_FLIGHT_REPEATS=2 runs each

Asynchronous training runs (train.max_staleness 1) of configs/async-pinned.yaml with the engine on
a CPU of its own (rollout.cpus 1; the learner, scoring and the driver on CPU 0: the engine stands
in for a generation device) and a long tail: rollout.max_new_tokens 256 and a short SFT warm-up
(25 steps), after which most completions end within a few dozen tokens and some run to the limit.
With rollout.update_in_flight false, each push waits for the engine to finish the next step's
generation, its long tail included (drain); with true, it reaches the engine mid-generation and
the step after next is queued behind at once; partial: a pool of groups across steps, the next
launch's generation beside the tail in the engine's batch (train.partial_rollouts), at max_staleness
1 and 2 (partial-s2: a step may train short groups of a later launch before long ones of an
earlier one). Alternating, BENCH_IN_FLIGHT_REPEATS runs each;
reported per mode, as medians over its runs: samples and completion tokens per second of RL, the
push's median time (the drain's wait is in it), the share of samples a push reached mid-way, the
staleness of each policy token and of each sample's oldest token, the completion lengths, and
held-out pass@1 at the end; for partial rollouts, the share of groups dropped over the staleness
bound and of a step's groups that an earlier step launched.
"""
from __future__ import annotations

import os
import statistics
import tempfile

from bench.bench_pipeline import bench_config
from bench.plots import alternating, comparison, medians
from coderloo.controller import train
from coderloo.metrics import read_metrics

STEPS = int(os.environ.get("BENCH_IN_FLIGHT_STEPS", "20"))
REPEATS = int(os.environ.get("BENCH_IN_FLIGHT_REPEATS", "2"))
LONG_TAIL = ("rollout.max_new_tokens=256", "sft.steps=25", "rollout.cpus=1", "learner.cpus=0", "reward.cpus=0",
             "reward.pool.cpus=0", "train.driver_cpus=0")
MODES = {"drain": ("rollout.update_in_flight=false",), "in-flight": ("rollout.update_in_flight=true",),
         "partial": ("rollout.update_in_flight=true", "train.partial_rollouts=true"),
         "partial-s2": ("rollout.update_in_flight=true", "train.partial_rollouts=true", "train.max_staleness=2")}


def run(mode: str, out: str) -> dict:
    config = bench_config(1, out, "pinned", (*LONG_TAIL, *MODES[mode]), steps=STEPS)
    summary = train(config)
    rl = [r for r in read_metrics(f"{out}/metrics.jsonl") if r["phase"] == "rl"]
    dropped = sum(r.get("pool_dropped_groups", 0) for r in rl)
    seconds = sum(r["time_step_s"] for r in rl)
    later = rl[1:] or rl  # the first step's rollouts were made before any push
    return {
        "samples_per_s": sum(r["samples"] for r in rl) / seconds,
        "tokens_per_s": sum(r["samples"] * r["completion_tokens_mean"] for r in rl) / seconds,
        "push_s": statistics.median(r["time_sync_s"] for r in rl),
        "updated_in_flight": statistics.mean(r["updated_in_flight_fraction"] for r in later),
        "staleness_token": statistics.mean(r["staleness_token_mean"] for r in later),
        "staleness_oldest": statistics.mean(r["staleness_mean"] for r in later),
        "tokens_mean": statistics.mean(r["completion_tokens_mean"] for r in rl),
        "tokens_max": statistics.mean(r["completion_tokens_max"] for r in rl),
        "learner_idle": 1 - sum(r["time_learn_s"] for r in rl) / seconds,
        "dropped": dropped / (dropped + sum(r["samples"] for r in rl) / config.rollout.samples_per_prompt),
        "carried": statistics.mean(r.get("pool_carried_groups", 0) for r in later) / config.train.prompts_per_step,
        "pass@1": summary["final"]["pass@1"],
    }


def main() -> list[dict]:
    root = tempfile.mkdtemp(prefix="bench-in-flight-")
    runs = alternating(REPEATS, {mode: lambda i, mode=mode: run(mode, f"{root}/{mode}-{i}") for mode in MODES})
    median = medians(runs)
    print(f"in-flight updates against draining, {STEPS} RL steps each of configs/async-pinned.yaml with the engine on CPU 1 "
          f"and the rest on CPU 0, {', '.join(LONG_TAIL[:2])}; medians of {REPEATS} runs each")
    for mode, r in median.items():
        each = ", ".join(f"{x['samples_per_s']:.1f}" for x in runs[mode])
        print(f"  {mode:9s} {r['samples_per_s']:6.1f} samples/s (runs: {each})  {r['tokens_per_s']:6.0f} completion tokens/s  "
              f"push {r['push_s']:.3f} s  pushed mid-sample {r['updated_in_flight']:5.1%}  staleness per token "
              f"{r['staleness_token']:.2f} (oldest token {r['staleness_oldest']:.2f})  completion tokens mean {r['tokens_mean']:.0f}, "
              f"max {r['tokens_max']:.0f}  learner idle {r['learner_idle']:5.1%}  final pass@1 {r['pass@1']:.3f}"
              + (f"  groups dropped {r['dropped']:5.1%}, carried over {r['carried']:5.1%}" if mode.startswith("partial") else ""))
    for mode, base in (("in-flight", "drain"), ("partial", "in-flight"), ("partial-s2", "in-flight")):
        ratios = [f"{a['samples_per_s'] / d['samples_per_s']:.2f}x" for d, a in zip(runs[base], runs[mode])]
        token_ratios = [f"{a['tokens_per_s'] / d['tokens_per_s']:.2f}x" for d, a in zip(runs[base], runs[mode])]
        print(f"  {mode} / {base}: samples/s per pair of runs {', '.join(ratios)}; completion tokens/s {', '.join(token_ratios)}")
    tokens = {mode: r["tokens_per_s"] for mode, r in median.items()}
    return [comparison(f"in-flight updates against draining, long tail, {STEPS} RL steps, median of {REPEATS}", "completion tokens/s",
                       "in-flight", {m: tokens[m] for m in ("drain", "in-flight")}, key="in-flight against drain"),
            comparison(f"partial rollouts against in-flight updates alone, long tail, {STEPS} RL steps, median of {REPEATS}",
                       "completion tokens/s", "partial", {m: tokens[m] for m in ("in-flight", "partial")}, key="partial against in-flight")]


if __name__ == "__main__":
    main()
