"""Learner throughput: tokens per second of RL steps with one and with two data-parallel ranks.

    python -m bench.bench_learner

The same batch (256 synthetic completions of 16-48 tokens on the default tiny model), the same
config (ZeRO-2, 2 optimizer steps, the default token budget), through LearnerGroup and DeepSpeed
on gloo, one rank and two ranks in one run. Medians of REPEATS steps after a warm-up step. On a
2-core machine two ranks share the cores: the figure shows what data parallelism costs or buys
here, not on a cluster, where each rank has its own device.
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


def measure(model: str, batch: list[TrainSequence], ranks: int) -> float:
    config = LearnerConfig(num_ranks=ranks, zero_stage=2)
    learner = LearnerGroup(model, config)
    try:
        learner.train_step(batch, config.loss_config(1, 1.0, 48))  # warm-up
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            learner.train_step(batch, config.loss_config(1, 1.0, 48))
            times.append(time.perf_counter() - start)
    finally:
        learner.kill()
    tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in batch)
    return tokens / statistics.median(times)


def main() -> list[dict]:
    init_ray(num_cpus=4)
    model = str(build_tiny_model(tempfile.mkdtemp(prefix="bench-learner-"), corpus_for_tokenizer(), TinyModelSpec()))
    batch = sequences(model)
    results = {ranks: measure(model, batch, ranks) for ranks in (1, 2)}
    print(f"learner, RL steps of {len(batch)} sequences, ZeRO-2, median of {REPEATS}")
    for ranks, tps in results.items():
        print(f"  {ranks} rank{'s' if ranks > 1 else ' '}  {tps:9.0f} tokens/s")
    print(f"  2 ranks / 1 rank: {results[2] / results[1]:.2f}x")
    return [comparison(f"learner, RL steps of {len(batch)} sequences, ZeRO-2", "tokens/s", "2 ranks",
                       {f"{ranks} rank{'s' if ranks > 1 else ''}": tps for ranks, tps in results.items()})]


if __name__ == "__main__":
    main()
