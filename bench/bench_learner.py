"""Learner throughput: tokens per second of RL steps, sequences packed end to end (in rows as wide
as the longest, and each micro-batch in one row: learner.pack_row_tokens) against one a row padded
(learner.pack_sequences), and with one and with two data-parallel ranks; then, on a step's batch
shaped as each of three presets makes it, the learner's tokens and time per step with and without
shared prefixes (learner.share_prefixes).

    python -m bench.bench_learner

The same batch (256 synthetic completions of 16-48 tokens after the default task mix's prompts, on
the default tiny model), the same config (ZeRO-2, 2 optimizer steps, the default token budget),
through LearnerGroup and DeepSpeed on gloo, in one run. Medians of REPEATS steps after a warm-up
step; the padding share is each step's (the tensor's tokens that are padding). On a 2-core machine
two ranks share the cores: the figure shows what data parallelism costs or buys here, not on a
cluster, where each rank has its own device.
"""
from __future__ import annotations

import random
import statistics
import tempfile
import time

from bench.plots import comparison
from learner.config import LearnerConfig
from coderloo.models import TinyModelSpec, build_tiny_model
from common.hf import load_tokenizer
from coderloo.runtime import init_ray
from coderloo.tasksets.synthetic import corpus_for_tokenizer, synthetic_suite
from learner.batch import TrainSequence
from learner.group import LearnerGroup

REPEATS = 3


def sequences(model: str, count: int = 256) -> list[TrainSequence]:
    tokenizer = load_tokenizer(model)
    rng = random.Random(0)
    tasks = synthetic_suite()["train"]
    out = []
    for i in range(count):
        prompt = tokenizer(tasks[i % len(tasks)].prompt)["input_ids"]
        completion = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(16, 48))]
        out.append(TrainSequence(prompt, completion, [-2.0] * len(completion), [rng.gauss(0, 1)] * len(completion)))
    return out


def measure(model: str, batch: list[TrainSequence], ranks: int, packed: bool = True, one_row: bool = False) -> tuple[float, float]:
    """Tokens/s (the sequences' own tokens) and the padding share; `one_row`: each micro-batch one
    row (learner.pack_row_tokens at the token budget)."""
    budget = LearnerConfig().max_tokens_per_micro_batch
    config = LearnerConfig(num_ranks=ranks, zero_stage=2, pack_sequences=packed, pack_row_tokens=budget if one_row else 0,
                           share_prefixes=False)  # the layouts of whole sequences
    learner = LearnerGroup(model, config)
    try:
        learner.train_step(batch, config.loss, 1.0, config.loss_kl_coef(1), 48)  # warm-up
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            stats = learner.train_step(batch, config.loss, 1.0, config.loss_kl_coef(1), 48)
            times.append(time.perf_counter() - start)
    finally:
        learner.kill()
    tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in batch)
    return tokens / statistics.median(times), stats["padding_share"]


PRESETS = ("default", "mixed", "refine")


def preset_batch(model: str, preset: str) -> list[TrainSequence]:
    """One RL step's sequences as `preset` (configs/PRESET.yaml) shapes them: its prompts_per_step
    training tasks, each prompted as the engines see it (instructions and task; the default
    tokenizer has no chat template), and samples_per_prompt completions: the task's reference cut
    at a random 50-100% of its tokens. Under refine (train_as concat, 3 attempts) a completion is
    two attempts with the task's prompt again between them: the observation's size, its feedback
    lines aside."""
    from coderloo.config import load_config
    from coderloo.controller import sft_examples
    from coderloo.tasksets.loading import load_tasks

    config = load_config(f"configs/{preset}.yaml")
    train, _ = load_tasks(config.tasks)
    examples = sft_examples(train, load_tokenizer(model), config.prompt)
    rng = random.Random(0)
    out = []
    for prompt, reference in rng.sample(examples, config.train.prompts_per_step):
        for _ in range(config.rollout.samples_per_prompt):
            completion = reference[:max(1, round(len(reference) * rng.uniform(0.5, 1.0)))]
            if config.env.name == "refine":
                completion = completion + prompt + reference
            out.append(TrainSequence(prompt, completion, [-2.0] * len(completion), [rng.gauss(0, 1)] * len(completion)))
    return out


def shared_prefixes(model: str) -> dict[str, dict[str, float]]:
    """Per preset, the learner's tokens per step (the tensors', padding included) and seconds per
    step without and with shared prefixes, on one learner each, steps alternating."""
    results = {}
    for preset in PRESETS:
        batch = preset_batch(model, preset)
        learners = {share: LearnerGroup(model, LearnerConfig(share_prefixes=share)) for share in (False, True)}
        try:
            times: dict[bool, list[float]] = {False: [], True: []}
            tokens = {}
            for repeat in range(REPEATS + 1):  # the first a warm-up
                for share, learner in learners.items():
                    config = learner.config
                    start = time.perf_counter()
                    stats = learner.train_step(batch, config.loss, 1.0, config.loss_kl_coef(1), 48)
                    if repeat:
                        times[share].append(time.perf_counter() - start)
                    tokens[share] = stats["learner_tokens"]
        finally:
            for learner in learners.values():
                learner.kill()
        results[preset] = {"sequences": len(batch), "tokens": tokens[False], "shared tokens": tokens[True],
                           "s/step": statistics.median(times[False]), "shared s/step": statistics.median(times[True])}
    return results


def main() -> list[dict]:
    init_ray(num_cpus=4)
    model = str(build_tiny_model(tempfile.mkdtemp(prefix="bench-learner-"), corpus_for_tokenizer(), TinyModelSpec()))
    shared = shared_prefixes(model)
    print(f"learner with and without shared prefixes, a step's batch as each preset makes it, median of {REPEATS}")
    for preset, r in shared.items():
        print(f"  {preset:8s} {r['sequences']:4d} sequences: tokens {r['tokens']:7.0f} -> {r['shared tokens']:7.0f} "
              f"({r['shared tokens'] / r['tokens']:.2f}x); s/step {r['s/step']:.2f} -> {r['shared s/step']:.2f} "
              f"({r['s/step'] / r['shared s/step']:.2f}x the steps/s)")
    batch = sequences(model)
    runs = {"1 rank, packed": (1, True, False), "1 rank, padded": (1, False, False), "1 rank, one row": (1, True, True),
            "2 ranks, packed": (2, True, False)}
    results = {label: measure(model, batch, *how) for label, how in runs.items()}
    print(f"learner, RL steps of {len(batch)} sequences, ZeRO-2, median of {REPEATS}")
    for label, (tps, padding) in results.items():
        print(f"  {label:16s} {tps:9.0f} tokens/s   padding {padding:6.1%}")
    (packed, _), (padded, _), (one_row, _), (two, _) = results.values()
    print(f"  packed / padded: {packed / padded:.2f}x; one row / padded: {one_row / padded:.2f}x; "
          f"2 ranks / 1 rank (packed): {two / packed:.2f}x")
    return [comparison(f"learner, RL steps of {len(batch)} sequences, ZeRO-2", "tokens/s", "1 rank, packed",
                       {label: tps for label, (tps, _) in results.items()}),
            *(comparison(f"learner, a {preset} step with shared prefixes", "steps/s", "shared prefixes",
                         {"shared prefixes": 1 / r["shared s/step"], "each sequence whole": 1 / r["s/step"]}) for preset, r in shared.items())]


if __name__ == "__main__":
    main()
