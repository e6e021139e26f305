"""Asynchronous against synchronous training: the same default config and number of steps.

    python -m bench.bench_pipeline     # BENCH_PIPELINE_STEPS=20 RL steps, BENCH_PIPELINE_REPEATS=3 runs each
                                       # BENCH_PIPELINE_MODES="sync async" (bench/quick.py: sync alone)
                                       # BENCH_PIPELINE_PINNED_REPEATS=2 runs each of the pinned pair (0: none)

Training runs of the default config (SFT warm-up, then RL), with `train.max_staleness=0`
(generate, score, train, push, in turn) and with 1 (step t+1 is generated and scored while the
learner trains on step t), alternating, BENCH_PIPELINE_REPEATS times each. Mid-run evaluations
and checkpoints are off so that the RL phase is timed alone. Reported for each mode, as medians
over its runs: RL samples per second (samples / the sum of step times), the learner's idle
fraction (1 - time training / time of the steps) and held-out pass@1 at the end; and the ratio
async / sync of each pair of runs. For the synchronous runs, the step's timeline: the median over
their steps of each part as the step's records time it (generating, with scoring alongside; the
scoring left once generation ended; learning; the push) against the step, and what is left (the
controller's own work: batches, metrics, the next draw). Then each part alone, in the same run:
the last synchronous run's final policy, with the components the trainer starts (its rollout
workers, reward service, learner), on the tasks the run would have drawn for its next steps (from
its final checkpoint's draw state, so that the batches are like the step's: the train set's first
tasks are all of the easiest level), PARTS_REPEATS rounds after a warm-up, medians: generating a
step's samples with nothing scoring them, scoring those completions, one learner step on the
step's batch, one push. Their sum against the step (the median of the sync runs' last five
steps, near the final policy): what the step gains by scoring while it generates, and what it
spends besides its parts.

Then the same pair with the roles on CPUs of their own (configs/async-pinned.yaml: scoring on one
core, generation, the learner and the driver on the other), BENCH_PIPELINE_PINNED_REPEATS runs
each: what the overlap buys where the roles do not take each other's cores. Then, pinned too, the
synchronous run against the same with train.stream_groups, BENCH_PIPELINE_STREAM_REPEATS runs
each: what starting the learner on a step's first scored groups buys. The learner's idle fraction is 1 - its own time at the steps'
work / the steps' time (a streamed step's work begins before its rollouts are all in).
"""
from __future__ import annotations

import os
import random
import statistics
import tempfile
import time

import ray

from bench.plots import alternating, comparison, medians
from coderloo.checkpoint import read_state
from coderloo.config import load_config
from coderloo.controller import train
from coderloo.curriculum import TaskDraw
from coderloo.metrics import read_metrics
from coderloo.runtime import init_ray
from coderloo.tasksets.loading import load_tasks
from common.hf import load_tokenizer
from learner.algorithm import build_batch, to_sequences
from learner.group import LearnerGroup
from reward_service.client import RewardClient
from rollout_workers import GenerationParams, RolloutGroup, start_workers
from rollout_workers.prompts import answered_task, generation_params, render
from rollout_workers.strategies import SingleAttempt

STEPS = int(os.environ.get("BENCH_PIPELINE_STEPS", "20"))
# A step's parts, as its record in metrics.jsonl times them (coderloo/controller.py: step_record)
TIMELINE = {"step": "time_step_s", "generation (scoring alongside)": "time_generate_s", "scoring after generation": "time_score_tail_s",
            "learning": "time_learn_s", "push": "time_sync_s"}
REPEATS = int(os.environ.get("BENCH_PIPELINE_REPEATS", "3"))
# mode: (train.max_staleness, its overrides)
MODES = {mode: {"sync": (0, ()), "async": (1, ())}[mode] for mode in os.environ.get("BENCH_PIPELINE_MODES", "sync async").split()}
PINNED_REPEATS = int(os.environ.get("BENCH_PIPELINE_PINNED_REPEATS", "2"))
STREAM_REPEATS = int(os.environ.get("BENCH_PIPELINE_STREAM_REPEATS", "2"))
# streaming pays where the learner's work after a step's last group is the step's critical path:
# synchronous steps (bench/results.md, pipeline)
STREAM_MODES = {"sync": (0, ()), "stream": (0, ("train.stream_groups=true",))}
PRESETS = {"default": "configs/default.yaml", "pinned": "configs/async-pinned.yaml"}
PARTS_REPEATS = 3
PARTS = ("generation", "scoring", "learning", "push")


def bench_config(staleness: int, out: str, preset: str = "default", overrides: tuple[str, ...] = (), steps: int = STEPS):
    return load_config(PRESETS[preset], [
        f"train.output_dir={out}", f"train.steps={steps}", f"train.max_staleness={staleness}",
        "train.eval_every=0", "train.checkpoint_every=0", *overrides,
    ])


def run(staleness: int, out: str, preset: str = "default", overrides: tuple[str, ...] = ()) -> dict:
    config = bench_config(staleness, out, preset, overrides)
    summary = train(config)
    rl = [r for r in read_metrics(f"{out}/metrics.jsonl") if r["phase"] == "rl"]
    step_time = sum(r["time_step_s"] for r in rl)
    last = statistics.median(r["time_step_s"] for r in rl[-5:])
    parts = {name: statistics.median(r[key] for r in rl[1:] or rl) for name, key in TIMELINE.items()}
    return {
        "timeline": parts,
        "last_steps_s": last,
        "samples_per_s": sum(r["samples"] for r in rl) / step_time,
        "learner_idle": 1 - sum(r["time_learner_busy_s"] for r in rl) / step_time,
        "rl_seconds": step_time,
        "pass@1": summary["final"]["pass@1"],
        "greedy_pass@1": summary["final"]["greedy_pass@1"],
    }


def parts_alone(out: str) -> dict[str, float]:
    """Median seconds of each of PARTS alone, with the policy the synchronous run in `out` ended
    with, started as the trainer starts its components (coderloo/controller.py: run), on the
    tasks of the steps the run would have taken next."""
    config = bench_config(0, out)
    model = f"{out}/checkpoints/final"
    rollout, learn = config.rollout, config.learner
    train_tasks, _ = load_tasks(config.tasks)
    tokenizer = load_tokenizer(model)
    init_ray(address=config.ray_address)
    rewards = RewardClient(config.reward)
    learner = LearnerGroup(model, learn, name="bench-parts")
    workers = start_workers(model, rollout, learn.seed, run="bench-parts", lora_rank=learn.pushed_adapter_rank)
    group = RolloutGroup(workers, rollout.weight_sync, rollout.stuck_timeout_s)
    strategy = SingleAttempt(group, rewards, tokenizer, config.prompt)
    params = GenerationParams(n=rollout.samples_per_prompt, max_new_tokens=rollout.max_new_tokens,
                              temperature=rollout.temperature_at(STEPS), top_p=rollout.top_p, stop=rollout.stop)
    n = config.train.prompts_per_step
    draw = TaskDraw(train_tasks, n, config.curriculum, random.Random())
    draw.load_state(read_state(model))
    times: dict[str, list[float]] = {part: [] for part in PARTS}
    try:
        group.connect(learner.weight_sources)
        for r in range(PARTS_REPEATS + 1):  # the first round warms each part up
            tasks = draw.draw()
            answered = [answered_task(t, tokenizer, config.prompt) for t in tasks]
            generated = {}
            start = time.perf_counter()
            group.generate_each([render(t, tokenizer, config.prompt) for t in answered],
                                generation_params(params, tokenizer, config.prompt), r, generated.__setitem__)
            seconds = {"generation": time.perf_counter() - start}
            scored = [(answered[i], s.text) for i in range(n) for s in generated[i].samples]
            start = time.perf_counter()
            rewards.score([t for t, _ in scored], [c for _, c in scored])
            seconds["scoring"] = time.perf_counter() - start
            rollouts = strategy.run(tasks, params, r)  # the step's groups to learn from (not timed)
            samples = to_sequences(rollouts.groups, token_rewards=learn.dense_rewards, concat=config.env.train_as == "concat")
            batch = build_batch(samples, learn, STEPS, 0.0, max_new_tokens=rollout.max_new_tokens, turn_cost=config.env.turn_cost)
            start = time.perf_counter()
            learner.train_step(batch.sequences, learn.loss, params.temperature, learn.loss_kl_coef(STEPS), rollout.max_new_tokens)
            seconds["learning"] = time.perf_counter() - start
            seconds["push"] = group.push()["sync_s"]
            if r:
                for part, value in seconds.items():
                    times[part].append(value)
    finally:
        learner.kill()
        for actor in workers:
            ray.kill(actor)
        rewards.close()
        ray.shutdown()
    return {part: statistics.median(values) for part, values in times.items()}


def pair(root: str, preset: str, repeats: int, modes: dict = MODES, label: str = "") -> tuple[dict, list[dict]]:
    """`modes` of `preset`, `repeats` alternating runs each: their runs, printed, and the figure
    of the second mode against the first."""
    suffix = "" if preset == "default" else f"-{preset}"
    runs = alternating(repeats, {mode: lambda i, mode=mode, s=staleness, o=overrides: run(s, f"{root}/{mode}{suffix}-{i}", preset, o)
                                 for mode, (staleness, overrides) in modes.items()})
    median = medians({mode: [{k: v for k, v in r.items() if k != "timeline"} for r in rs] for mode, rs in runs.items()})
    print(f"pipeline, {PRESETS[preset]}{label}, {STEPS} RL steps each (no mid-run evals), medians of {repeats} runs each")
    for mode, r in median.items():
        each = ", ".join(f"{x['samples_per_s']:.1f}" for x in runs[mode])
        print(f"  {mode:5s}  {r['samples_per_s']:6.1f} samples/s (runs: {each})  learner idle {r['learner_idle']:5.1%}  "
              f"RL {r['rl_seconds']:6.0f} s  final pass@1 {r['pass@1']:.3f}  greedy {r['greedy_pass@1']:.3f}")
    figures = []
    if len(median) == 2:
        base, other = median
        ratios = [a["samples_per_s"] / s["samples_per_s"] for s, a in zip(runs[base], runs[other])]
        print(f"  {other} / {base}: {median[other]['samples_per_s'] / median[base]['samples_per_s']:.2f}x samples/s "
              f"(per pair of runs: {', '.join(f'{r:.2f}x' for r in ratios)})")
        name = ("pipeline" if preset == "default" else f"pipeline {preset}") + label
        figures.append(comparison(f"{name}, {STEPS} RL steps, median of {repeats}", "samples/s", other,
                                  {mode: r["samples_per_s"] for mode, r in median.items()}, key=f"{name}, {other} against {base}"))
    return runs, figures


def main() -> list[dict]:
    root = tempfile.mkdtemp(prefix="bench-pipeline-")
    runs, figures = pair(root, "default", REPEATS)
    if "sync" in runs:
        figures.append(step_against_parts(root, runs))
    if PINNED_REPEATS:
        figures += pair(root, "pinned", PINNED_REPEATS)[1]
    if STREAM_REPEATS:
        figures += pair(root, "pinned", STREAM_REPEATS, STREAM_MODES, " streamed")[1]
    return figures


def step_against_parts(root: str, runs: dict) -> dict:
    """The default sync runs' step timeline, and a step against the sum of its parts alone."""
    timeline = {name: statistics.median(r["timeline"][name] for r in runs["sync"]) for name in TIMELINE}
    step = timeline.pop("step")
    print(f"  a sync step, median over steps 2-{STEPS} and the {REPEATS} runs: {step:.3f} s")
    for name, seconds in timeline.items():
        print(f"    {name:32s} {seconds:7.3f} s  {seconds / step:6.1%}")
    rest = step - sum(timeline.values())
    print(f"    {'the rest (controller)':32s} {rest:7.3f} s  {rest / step:6.1%}")
    alone = parts_alone(f"{root}/sync-{REPEATS - 1}")
    last = statistics.median(r["last_steps_s"] for r in runs["sync"])
    total = sum(alone.values())
    print(f"  each part alone ({PARTS_REPEATS} rounds of a step's {bench_config(0, root).train.prompts_per_step} prompts, "
          f"the last sync run's final policy, medians), against a sync step near the end (median of the last 5): {last:.3f} s")
    for part, seconds in alone.items():
        print(f"    {part:32s} {seconds:7.3f} s")
    print(f"    {'sum of the parts':32s} {total:7.3f} s;  step / sum {last / total:.2f}x")
    return comparison(f"a sync step against the sum of its parts alone, {STEPS} RL steps", "s", "sync step",
                      {"sync step": last, "sum of the parts": total, **alone}, lower_is_better=True,
                      key="pipeline, a sync step against its parts")


if __name__ == "__main__":
    main()
