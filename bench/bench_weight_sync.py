"""Weight-sync time against parameter bytes: learner -> vLLM engine over gloo and over shared memory,
next to a plain memory copy, in one run.

    python -m bench.bench_weight_sync

For four model sizes (the last is Qwen2.5-Coder-0.5B's shape, randomly initialized), the real path
of a training step: the DeepSpeed learner (rank 0) sends its weights in 32 MiB buckets into a vLLM
rollout worker on the same node, which loads them through vLLM's in-place reload (repacking for the
CPU kernels) and checks them. Two transports into the same worker, one after the other:
"gloo" (a broadcast over TCP, what a worker on another node gets) and "shm" (a file in /dev/shm the
engine maps: "auto" on one node). Next to them, one `copy_` of the same number of bytes between
two buffers in one process: the floor no transport can beat (a push copies at least twice: into
the transport, then into the engine). Medians of REPEATS pushes after a warm-up (of 10 copies).
A push's time is from the first call to the last worker's verified load: transport, loading and
checks. "send" is the learner's part of it (shm: writing the file and its checksums; gloo: the
broadcasts); the rest is the engine's load and checks and the Ray calls. "vLLM reload alone" is
the engine's part without any transport: the same worker reloads the checkpoint's tensors, already
in its memory, through the same in-place reload (`reload_weights`), median of REPEATS: the floor of
any push into this engine.
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
TRANSPORTS = ("gloo", "shm")
SIZES = {
    "tiny (default)": TinyModelSpec(),
    "small": TinyModelSpec(hidden_size=384, intermediate_size=1152, num_layers=6, num_heads=6, num_kv_heads=2),
    "medium": TinyModelSpec(hidden_size=768, intermediate_size=2304, num_layers=8, num_heads=12, num_kv_heads=4),
    # Qwen2.5-Coder-0.5B's shape: 24 layers, hidden 896, MLP 4864, 14 heads, 2 KV heads, 151,936 rows, tied
    "Qwen2.5-Coder-0.5B shape": TinyModelSpec(vocab_rows=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                                              num_heads=14, num_kv_heads=2, max_position_embeddings=4096),
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


def push_s(model: str) -> dict:
    """By transport: bytes, median push seconds, and the learner's share of the last push; and
    "reload": the worker's median reload seconds alone."""
    learner = LearnerGroup(model, LearnerConfig(threads=2))
    worker = RolloutWorker.remote(model, "vllm", threads=2, engine={"max_model_len": 512})
    version = 0
    out = {}
    try:
        for transport in TRANSPORTS:
            group = RolloutGroup([worker], WeightSyncConfig(transport=transport, bucket_mb=32, timeout_s=600))
            group.version = version  # the same worker: its versions go on increasing
            group.connect(learner.weight_sources)
            nbytes, seconds = median_push(group)
            sent = ray.get([learner.ranks[0].send_weights.remote(group._plan),
                            worker.receive_weights.remote(group._plan, group.version + 1)])[0]
            version = group.version + 1
            out[transport] = (nbytes, seconds, sent["sent_s"])
        out["reload"] = ray.get(worker.__ray_call__.remote(lambda self: self.backend.llm.collective_rpc(reload_s)[0]))
    finally:
        learner.kill()
        ray.kill(worker)
    return out


def reload_s(vllm_worker) -> float:
    """(In the vLLM worker.) Median seconds of its in-place reload of the model's checkpoint, read
    into memory first: the engine's load alone."""
    import glob

    from safetensors.torch import load_file

    weights = {}
    for path in sorted(glob.glob(f"{vllm_worker.model_runner.model_config.model}/*.safetensors")):
        weights.update(load_file(path))
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        vllm_worker.reload_weights(weights_iterator=iter(weights.items()))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def median_push(group: RolloutGroup) -> tuple[int, float]:
    """Bytes and median seconds of REPEATS pushes of a connected group, after a warm-up."""
    group.push()
    runs = [group.push() for _ in range(REPEATS)]
    return runs[0]["sync_bytes"], statistics.median(r["sync_s"] for r in runs)


def main() -> list[dict]:
    init_ray(num_cpus=4)
    corpus = corpus_for_tokenizer()
    comparisons = []
    print(f"weight sync: learner -> vLLM worker on the same node, over gloo and over shm, 32 MiB buckets, median of {REPEATS}")
    for name, spec in SIZES.items():
        model = str(build_tiny_model(tempfile.mkdtemp(prefix="bench-sync-"), corpus, spec))
        pushes = push_s(model)
        nbytes = pushes["gloo"][0]
        copy = memcpy_s(nbytes)
        comparisons.append(comparison(f"weight sync, {name} model ({nbytes / 2**20:.1f} MiB)", "ms", "shm push",
                                      {"gloo push": pushes["gloo"][1] * 1e3, "shm push": pushes["shm"][1] * 1e3,
                                       "vLLM reload alone": pushes["reload"] * 1e3, "memcpy": copy * 1e3},
                                      lower_is_better=True))
        print(f"  {name} ({nbytes / 2**20:.1f} MiB): memcpy {copy * 1e3:.2f} ms ({nbytes / 2**20 / copy:.0f} MiB/s); "
              f"vLLM reload alone {pushes['reload'] * 1e3:.1f} ms, {pushes['reload'] / copy:.1f}x memcpy")
        for transport in TRANSPORTS:
            _, sync, sent = pushes[transport]
            print(f"    {transport:4s} push {sync * 1e3:8.1f} ms ({nbytes / 2**20 / sync:6.0f} MiB/s), push / memcpy "
                  f"{sync / copy:6.1f}x; learner's send {sent * 1e3:7.1f} ms, engine's load, checks and Ray calls "
                  f"the rest")
        print(f"    shm / gloo {pushes['shm'][1] / pushes['gloo'][1]:.2f}x")
    return comparisons


if __name__ == "__main__":
    main()
