"""Learner throughput: tokens per second of RL steps, sequences packed end to end (in rows as wide
as the longest, and each micro-batch in one row: learner.pack_row_tokens) against one a row padded
(learner.pack_sequences), and with one and with two data-parallel ranks.

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
    config = LearnerConfig(num_ranks=ranks, zero_stage=2, pack_sequences=packed, pack_row_tokens=budget if one_row else 0)
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


def main() -> list[dict]:
    init_ray(num_cpus=4)
    model = str(build_tiny_model(tempfile.mkdtemp(prefix="bench-learner-"), corpus_for_tokenizer(), TinyModelSpec()))
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
                       {label: tps for label, (tps, _) in results.items()})]


if __name__ == "__main__":
    main()
