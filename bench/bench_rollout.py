"""Generation throughput: vLLM against transformers on the same prompts and tiny model, one run.

    python -m bench.bench_rollout
"""
from __future__ import annotations

import statistics
import tempfile
import time

import ray

from bench.plots import comparison
from coderloo.models import TinyModelSpec, build_tiny_model
from coderloo.runtime import init_ray
from coderloo.tasksets.synthetic import corpus_for_tokenizer, synthetic_suite
from rollout_workers import GenerationParams, RolloutGroup, RolloutWorker

REPEATS = 3


def measure(backend: str, model: str, prompts: list[str], params: GenerationParams) -> tuple[float, float]:
    """Median samples/s and tokens/s over REPEATS runs of all prompts at once, after a warm-up."""
    worker = RolloutWorker.remote(model, backend, threads=2)
    group = RolloutGroup([worker])
    runs = []
    try:
        group.generate(prompts[:4], params)  # warm-up
        for _ in range(REPEATS):
            start = time.perf_counter()
            rollouts = group.generate(prompts, params)
            elapsed = time.perf_counter() - start
            samples = sum(len(r.samples) for r in rollouts)
            tokens = sum(len(s.token_ids) for r in rollouts for s in r.samples)
            runs.append((samples / elapsed, tokens / elapsed))
    finally:
        ray.kill(worker)
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def main() -> list[dict]:
    init_ray(num_cpus=4)
    model = str(build_tiny_model(tempfile.mkdtemp(prefix="bench-tiny-"), corpus_for_tokenizer(), TinyModelSpec()))
    prompts = [t.prompt for t in synthetic_suite()["train"][:32]]
    params = GenerationParams(n=8, max_new_tokens=48, temperature=1.0)
    results = {backend: measure(backend, model, prompts, params) for backend in ("vllm", "transformers")}
    print(f"generation, 32 prompts x 8 samples x up to 48 tokens, T=1 (random tiny model), median of {REPEATS}")
    for backend, (sps, tps) in results.items():
        print(f"  {backend:13s} {sps:8.1f} samples/s {tps:9.0f} tokens/s")
    print(f"  vllm / transformers: {results['vllm'][1] / results['transformers'][1]:.1f}x tokens/s")
    return [comparison("generation, 32 prompts x 8 samples, tiny model", "tokens/s", "vllm",
                       {backend: tps for backend, (_, tps) in results.items()})]


if __name__ == "__main__":
    main()
