"""Weight-sync time against parameter bytes: learner -> vLLM engine, next to a plain memory copy.

    python -m bench.bench_weight_sync

For three model sizes, the real path of a training step: the DeepSpeed learner (rank 0)
broadcasts its weights in buckets over the gloo group into a vLLM rollout worker, which loads
them through vLLM's in-place reload (repacking for the CPU kernels) and checks their sums. Next
to it, one `copy_` of the same number of bytes between two buffers in one process: the floor no
transport can beat. Medians of REPEATS pushes after a warm-up (of 10 copies). A push's time is
from the first call to the last worker's verified load: transport, loading and checks.
"""
from __future__ import annotations

import statistics
import tempfile
import time

import ray
import torch

from bench.plots import comparison
from learner.config import LearnerConfig
from coderloo.models import TinyModelSpec, build_tiny_model
from coderloo.runtime import init_ray
from coderloo.tasksets.synthetic import corpus_for_tokenizer
from learner.group import LearnerGroup
from rollout_workers import RolloutGroup, RolloutWorker
from rollout_workers.config import WeightSyncConfig

REPEATS = 3
SIZES = {
    "tiny (default)": TinyModelSpec(),
    "small": TinyModelSpec(hidden_size=384, intermediate_size=1152, num_layers=6, num_heads=6, num_kv_heads=2),
    "medium": TinyModelSpec(hidden_size=768, intermediate_size=2304, num_layers=8, num_heads=12, num_kv_heads=4),
}


def memcpy_s(nbytes: int) -> float:
    src = torch.randn(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(10):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def push_s(model: str) -> tuple[int, float]:
    learner = LearnerGroup(model, LearnerConfig())
    worker = RolloutWorker.remote(model, "vllm", threads=2)
    group = RolloutGroup([worker], WeightSyncConfig(bucket_mb=32, timeout_s=300))
    try:
        group.connect(learner.weight_sources)
        return median_push(group)
    finally:
        learner.kill()
        ray.kill(worker)


def median_push(group: RolloutGroup) -> tuple[int, float]:
    """Bytes and median seconds of REPEATS pushes of a connected group, after a warm-up."""
    group.push()
    runs = [group.push() for _ in range(REPEATS)]
    return runs[0]["sync_bytes"], statistics.median(r["sync_s"] for r in runs)


def main() -> list[dict]:
    init_ray(num_cpus=4)
    corpus = corpus_for_tokenizer()
    comparisons = []
    print(f"weight sync: learner -> vLLM worker over gloo, 32 MiB buckets, median of {REPEATS}")
    for name, spec in SIZES.items():
        model = str(build_tiny_model(tempfile.mkdtemp(prefix="bench-sync-"), corpus, spec))
        nbytes, sync = push_s(model)
        copy = memcpy_s(nbytes)
        comparisons.append(comparison(f"weight sync, {name} model ({nbytes / 2**20:.1f} MiB)", "ms", "push",
                                      {"push": sync * 1e3, "memcpy": copy * 1e3}, lower_is_better=True))
        print(
            f"  {name:15s} {nbytes / 2**20:7.1f} MiB  push {sync * 1e3:8.1f} ms ({nbytes / 2**20 / sync:6.0f} MiB/s)"
            f"  memcpy {copy * 1e3:6.2f} ms ({nbytes / 2**20 / copy:6.0f} MiB/s)  push / memcpy {sync / copy:5.0f}x"
        )
    return comparisons


if __name__ == "__main__":
    main()
