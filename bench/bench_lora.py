"""LoRA against full fine-tuning: what trains, what the optimizer holds, what each push moves and
how long it takes, on the tiny model and on Qwen2.5-Coder-0.5B's shape (randomly initialized).

    python -m bench.bench_lora
    python -m bench.bench_lora sweep  # every LoRA variant of SWEEP in RL (about 4 min each)
    python -m bench.bench_lora sft    # why configs/lora.yaml starts the adapter after SFT (below)
    python -m bench.bench_lora real   # the pushes on real weights (the catalogue's 0.5B) into a bf16 engine

For each model, two DeepSpeed learners (ZeRO-0, float32) in turn: full fine-tuning, and a LoRA
adapter (rank 16, alpha 32, on every attention and MLP projection). Each takes one SFT step (AdamW
makes its state at the first step), then pushes into a vLLM rollout worker (weight_sync auto: shared memory, the engine is on the learner's node):
the whole weights, or only the adapter (the worker loads it through vLLM's LoRA support). Push
times are medians of REPEATS pushes after a warm-up, from the first call to the last worker's
verified load.

Then RL: full fine-tuning (configs/default.yaml) against LoRA (configs/lora.yaml, and the preset
without its warm-up), each the same SFT warm-up then BENCH_LORA_STEPS (60) RL steps of the same
seed, evaluated on the held-out tasks; each row's gain in pass@1 over the warm-up against full
fine-tuning's. `sweep` trains the other variants of SWEEP too (rank, rsLoRA scaling, the adapter's
learning rate and its warm-up, LoRA+, initialisation; BENCH_LORA_VARIANTS=full,preset,... picks).

`sft`: the SFT warm-up's loss on the tiny model (random weights) after its 115 steps of 32
reference solutions, for full fine-tuning at the default's rate and for rank-16 adapters at three
rates (a plain AdamW loop on one process, no DeepSpeed): an adapter on random weights barely
learns, which is why configs/lora.yaml uses lora.start rl.
"""
from __future__ import annotations

import os
import random
import sys
import tempfile

import ray

from bench.bench_weight_sync import REPEATS, median_push
from bench.plots import comparison
from coderloo.controller import sft_examples
from coderloo.models import TinyModelSpec, build_tiny_model
from coderloo.runtime import init_ray
from coderloo.tasksets.synthetic import corpus_for_tokenizer, synthetic_suite
from common.hf import load_tokenizer
from learner.config import LearnerConfig, LoraSettings
from learner.group import LearnerGroup
from rollout_workers import RolloutGroup, RolloutWorker
from rollout_workers.config import WeightSyncConfig

LORA = LoraSettings(rank=16, alpha=32)
MODELS = {
    "tiny (default)": TinyModelSpec(),
    # Qwen2.5-Coder-0.5B's shape: 24 layers, hidden 896, MLP 4864, 14 heads, 2 KV heads, 151,936 rows, tied
    "Qwen2.5-Coder-0.5B shape": TinyModelSpec(vocab_rows=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                                              num_heads=14, num_kv_heads=2, max_position_embeddings=4096),
}


def measure(model: str, lora: LoraSettings | None, engine_dtype: str | None = None) -> dict:
    learner = LearnerGroup(model, LearnerConfig(lora=lora, threads=2), sft_lr=1e-4)
    engine = {"max_model_len": 512, **({"dtype": engine_dtype} if engine_dtype else {})}
    worker = RolloutWorker.remote(model, "vllm", threads=2, engine=engine, lora_rank=lora.rank if lora else None)
    group = RolloutGroup([worker], WeightSyncConfig(bucket_mb=32, timeout_s=600))
    try:
        learner.sft_step(sft_examples(synthetic_suite()["train"][:4], load_tokenizer(model)))
        counts = learner.parameter_counts()
        group.connect(learner.weight_sources)
        push_bytes, push_s = median_push(group)
    finally:
        learner.kill()
        ray.kill(worker)
    return {**counts, "push_bytes": push_bytes, "push_s": push_s}


def sft_loss(model_dir: str, lora: LoraSettings | None, lr: float, steps: int = 115, batch: int = 32) -> float:
    """The next-token loss of the last of `steps` SFT steps (full fine-tuning, or an adapter)."""
    import torch

    from common.hf import load_causal_lm
    from learner import lora as lora_lib

    torch.manual_seed(0)
    rng = random.Random(0)
    examples = sft_examples(synthetic_suite()["train"], load_tokenizer(model_dir))
    model = load_causal_lm(model_dir)
    if lora is not None:
        model = lora_lib.wrap(model, lora)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=lr)
    for _ in range(steps):
        rows = rng.sample(examples, batch)
        length = max(len(p) + len(c) for p, c in rows)
        ids = torch.zeros(batch, length, dtype=torch.long)
        labels = torch.full((batch, length), -100)
        for i, (p, c) in enumerate(rows):
            ids[i, : len(p) + len(c)] = torch.tensor(p + c)
            labels[i, len(p) : len(p) + len(c)] = torch.tensor(c)
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
    return loss.item()


def real_main() -> None:
    """The same pushes on real weights (the catalogue's Qwen2.5-Coder-0.5B-Instruct, fetched): a
    float32 learner into a bf16 vLLM engine, the whole model and a LoRA adapter, each verified."""
    from coderloo.model_import import fetch

    init_ray(num_cpus=4)
    model = str(fetch("qwen2.5-coder-0.5b-instruct"))
    print(f"real weights ({model}): DeepSpeed ZeRO-0 float32 learner -> vLLM bf16, shared memory, median of {REPEATS}")
    print("| mode | parameters | trainable | optimizer state | bytes per push | push time |")
    print("|---|---|---|---|---|---|")
    for mode in ("full", "lora"):
        r = measure(model, LORA if mode == "lora" else None, engine_dtype="bfloat16")
        print(f"| {mode} | {r['parameters'] / 1e6:.2f} M | {r['trainable'] / 1e6:.3f} M | {r['optimizer_state_bytes'] / 2**20:.1f} MiB | "
              f"{r['push_bytes'] / 2**20:.2f} MiB | {r['push_s'] * 1e3:.0f} ms |", flush=True)


def sft_main() -> None:
    model = str(build_tiny_model(tempfile.mkdtemp(prefix="bench-lora-sft-"), corpus_for_tokenizer(), TinyModelSpec()))
    print("SFT loss after 115 steps of 32 on the tiny model (random weights), plain AdamW")
    print(f"  full fine-tuning, lr 1e-3: {sft_loss(model, None, 1e-3):.3f}")
    for lr in (1e-3, 5e-3, 2e-2):
        print(f"  LoRA rank 16, alpha 32, lr {lr:g}: {sft_loss(model, LORA, lr):.3f}")


SWEEP_STEPS = int(os.environ.get("BENCH_LORA_STEPS", "60"))
SWEEP = {  # name: (config file, overrides); the preset (configs/lora.yaml) warms its rate up over 10 steps
    "full": ("configs/default.yaml", []),
    "preset": ("configs/lora.yaml", []),
    "no-warmup": ("configs/lora.yaml", ["learner.warmup_steps=0"]),
    "lr-3e-3": ("configs/lora.yaml", ["learner.lr=3e-3"]),
    "rslora": ("configs/lora.yaml", ["learner.lora.rslora=true"]),
    "rslora-no-warmup": ("configs/lora.yaml", ["learner.lora.rslora=true", "learner.warmup_steps=0"]),
    "rank-64-rslora-no-warmup": ("configs/lora.yaml", ["learner.lora.rank=64", "learner.lora.rslora=true", "learner.warmup_steps=0"]),
    "lora+4": ("configs/lora.yaml", ["learner.lora.lr_ratio=4"]),
    "lora+16-lr-5e-4-no-warmup": ("configs/lora.yaml", ["learner.lora.lr_ratio=16", "learner.lr=5e-4", "learner.warmup_steps=0"]),
    "orthogonal-no-warmup": ("configs/lora.yaml", ["learner.lora.init=orthogonal", "learner.warmup_steps=0"]),
}
RECORD = ["full", "preset", "no-warmup"]  # what `python -m bench.run lora` trains


def rl_rows(names: list[str]) -> list[dict]:
    """Full fine-tuning and LoRA variants `names` of SWEEP, each its SFT warm-up then SWEEP_STEPS
    RL steps; a table of their held-out pass@1 and each gain against full fine-tuning's."""
    from bench.bench_algorithms import run

    unknown = [n for n in names if n not in SWEEP]
    if unknown:
        raise SystemExit(f"BENCH_LORA_VARIANTS: unknown {', '.join(unknown)}; valid: {', '.join(SWEEP)}")
    root = tempfile.mkdtemp(prefix="bench-lora-rl-")
    results = {}
    for i, name in enumerate(names):
        results[name] = r = run(*SWEEP[name], f"{root}/{i}", steps=SWEEP_STEPS)
        print(f"  {name}: pass@1 {r['after_sft']['pass@1']:.3f} -> {r['final']['pass@1']:.3f}, RL {r['rl_seconds']:.0f} s", flush=True)
    print(f"LoRA against full fine-tuning on the default, {SWEEP_STEPS} RL steps each (held-out pass@1, 8 samples a task, T=1)")
    print("| run | config | pass@1 after SFT | at the end | gain / full fine-tuning's | greedy | entropy, last step | RL time | samples |")
    print("|---|---|---|---|---|---|---|---|---|")
    full = results.get("full")
    full_gain = full["final"]["pass@1"] - full["after_sft"]["pass@1"] if full else None
    for name, r in results.items():
        gain = r["final"]["pass@1"] - r["after_sft"]["pass@1"]
        entropy = r["last_step"].get("entropy")
        print(f"| {name} | {SWEEP[name][0]} {' '.join(SWEEP[name][1])} | {r['after_sft']['pass@1']:.3f} | {r['final']['pass@1']:.3f} | "
              f"{f'{gain / full_gain:.2f}x' if full_gain else '-'} | {r['final']['greedy_pass@1']:.3f} | "
              f"{'-' if entropy is None else f'{entropy:.3f}'} | {r['rl_seconds']:.0f} s | {r['samples']} |")
    return [comparison(f"held-out pass@1 after {SWEEP_STEPS} RL steps", "pass@1", names[0],
                       {name: r["final"]["pass@1"] for name, r in results.items()})]


def sweep_main() -> list[dict]:
    chosen = os.environ.get("BENCH_LORA_VARIANTS")
    return rl_rows(chosen.split(",") if chosen else list(SWEEP))


def main() -> list[dict]:
    init_ray(num_cpus=4)
    corpus = corpus_for_tokenizer()
    comparisons = []
    print(f"LoRA (rank {LORA.rank}, alpha {LORA.alpha:g}, {', '.join(LORA.target_modules)}) against full fine-tuning; "
          f"DeepSpeed ZeRO-0 float32, push into a vLLM worker through shared memory, median of {REPEATS}")
    print("| model | mode | parameters | trainable | optimizer state | bytes per push | push time |")
    print("|---|---|---|---|---|---|---|")
    for name, spec in MODELS.items():
        model = str(build_tiny_model(tempfile.mkdtemp(prefix="bench-lora-"), corpus, spec))
        results = {mode: measure(model, LORA if mode == "lora" else None) for mode in ("full", "lora")}
        for mode, r in results.items():
            print(f"| {name} | {mode} | {r['parameters'] / 1e6:.2f} M | {r['trainable'] / 1e6:.3f} M | "
                  f"{r['optimizer_state_bytes'] / 2**20:.1f} MiB | {r['push_bytes'] / 2**20:.2f} MiB | {r['push_s'] * 1e3:.0f} ms |")
        full, lora = results["full"], results["lora"]
        print(f"  {name}: lora / full: trainable {lora['trainable'] / full['trainable']:.4f}x, optimizer state "
              f"{lora['optimizer_state_bytes'] / full['optimizer_state_bytes']:.4f}x, bytes per push "
              f"{lora['push_bytes'] / full['push_bytes']:.4f}x, push time {lora['push_s'] / full['push_s']:.3f}x")
        comparisons.append(comparison(f"bytes per push, {name}", "MiB", "lora",
                                      {m: r["push_bytes"] / 2**20 for m, r in results.items()}, lower_is_better=True))
        comparisons.append(comparison(f"push time, {name}", "ms", "lora",
                                      {m: r["push_s"] * 1e3 for m, r in results.items()}, lower_is_better=True))
        comparisons.append(comparison(f"optimizer state, {name}", "MiB", "lora",
                                      {m: r["optimizer_state_bytes"] / 2**20 for m, r in results.items()}, lower_is_better=True))
    ray.shutdown()  # each training run starts its own
    return comparisons + rl_rows(RECORD)


if __name__ == "__main__":
    {"sft": sft_main, "sweep": sweep_main, "real": real_main}.get(sys.argv[1] if sys.argv[1:] else "", main)()
