"""Peak memory of one learner micro-batch at Qwen2.5-Coder's vocabulary: the logits of every token
at once (`token_logprobs(model(...).logits)`, as the learner did) against learner/logits.py's
chunks, forward and backward, side by side in one run.

    python -m bench.bench_logits_memory

A micro-batch of 4,096 tokens (4 rows of a 64-token prompt and a 960-token completion) through a
Qwen2 model with Qwen2.5-Coder-0.5B's width, vocabulary and tied head (hidden 896, vocabulary
151,936) but 2 decoder layers: the layers' activations are the same in both ways, the head's
logits are what differs. Each way runs in a fresh process (`ru_maxrss` is a process's peak); the
figure is the peak resident memory during the step above the resident memory before it.

Then the same micro-batch through all 24 decoder layers of the 0.5B shape in bf16 (configs/
scale-0.5b.yaml's learner.dtype), chunked, with `learner.gradient_checkpointing` off and on (each
layer recomputed in the backward from its input), beside `coderloo plan`'s figure for what the step
adds (its activations, logits and the bf16 gradients of a rank that holds them all).
"""
from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

from bench.plots import comparison

TOKENS, ROWS, PROMPT = 4096, 4, 64
VOCAB, HIDDEN = 151_936, 896
CHUNK_TOKENS = 512  # learner.logit_chunk_tokens' default
WAYS = {"whole vocabulary (before)": "whole", f"chunks of {CHUNK_TOKENS} tokens (learner/logits.py)": "chunked"}
LAYERS = 24  # Qwen2.5-Coder-0.5B's
DEPTH_WAYS = {"24 layers, chunked": "depth", "24 layers, chunked, gradient checkpointing": "depth-checkpointed"}


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def one_step(way: str) -> dict:
    """In this process: one forward and backward of the micro-batch, `way` "whole" or "chunked"."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from learner.batch import TrainSequence, pack
    from learner.logits import chunked_logprobs, final_hidden_states
    from learner.losses import token_logprobs

    torch.manual_seed(0)
    deep = way.startswith("depth")
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=4864, num_hidden_layers=LAYERS if deep else 2,
                         num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=32768,
                         rope_theta=1e6)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16 if deep else torch.float32)
    if way == "depth-checkpointed":  # as Learner._trainable does
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    length = TOKENS // ROWS
    ids = torch.randint(VOCAB, (ROWS, length)).tolist()
    batch = pack([TrainSequence(row[:PROMPT], row[PROMPT:]) for row in ids], pad_id=0)
    before = rss_mb()
    start = time.perf_counter()
    if way == "whole":
        logprobs = token_logprobs(model(**batch.model_inputs()).logits, batch.input_ids)
    else:
        hidden = final_hidden_states(model, model, batch.model_inputs())
        logprobs = chunked_logprobs(hidden, model.get_output_embeddings(), batch.input_ids, batch.completion_positions, 1.0, CHUNK_TOKENS)
    (-(logprobs * batch.completion_mask).sum() / batch.completion_mask.sum()).backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"peak_above_mb": peak - before, "seconds": seconds}


def fresh(way: str) -> dict:
    """one_step(way) in a process of its own."""
    out = subprocess.run([sys.executable, "-m", "bench.bench_logits_memory", way], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def planned_step_mb(checkpointing: bool) -> float:
    """`coderloo plan`'s activations, logits and gradients of one rank that holds them all (ZeRO-0),
    at this micro-batch, for the 0.5B shape in bf16 (MB)."""
    from coderloo.config import load_config
    from coderloo.ops.plan import plan

    config = load_config("configs/scale-0.5b.yaml", ["learner.num_ranks=1", "learner.zero_stage=0", f"learner.max_tokens_per_micro_batch={TOKENS}",
                                                     f"learner.logit_chunk_tokens={CHUNK_TOKENS}", f"learner.gradient_checkpointing={str(checkpointing).lower()}"])
    learner = next(a for a in plan(config).actors if a.name == "learner rank")
    return sum(learner.components[k] for k in ("activations", "logits", "gradients")) / 2**20


def main() -> list[dict]:
    results = {label: fresh(way) for label, way in WAYS.items()}
    logits_gb = TOKENS * VOCAB * 4 / 1e9
    print(f"one learner micro-batch of {TOKENS} tokens, vocabulary {VOCAB:,}, hidden {HIDDEN}, fp32, forward and backward "
          f"(the logits of every token: {logits_gb:.2f} GB)")
    for label, r in results.items():
        print(f"  {label:42s} peak +{r['peak_above_mb']:8.0f} MB   {r['seconds']:6.1f} s")
    (whole, chunked) = results.values()
    print(f"  chunked / whole: memory {chunked['peak_above_mb'] / whole['peak_above_mb']:.2f}x, time {chunked['seconds'] / whole['seconds']:.2f}x")
    depth = {label: fresh(way) for label, way in DEPTH_WAYS.items()}
    print(f"the same micro-batch through all {LAYERS} layers of the 0.5B shape, bf16, chunked logits: "
          f"activation checkpointing (learner.gradient_checkpointing) off and on")
    for (label, r), checkpointing in zip(depth.items(), (False, True)):
        planned = planned_step_mb(checkpointing)
        print(f"  {label:42s} peak +{r['peak_above_mb']:8.0f} MB   {r['seconds']:6.1f} s   coderloo plan {planned:8.0f} MB "
              f"(measured / planned {r['peak_above_mb'] / planned:.2f})")
    (off, on) = depth.values()
    print(f"  checkpointing / not: memory {on['peak_above_mb'] / off['peak_above_mb']:.2f}x, time {on['seconds'] / off['seconds']:.2f}x")
    return [comparison(f"peak memory of one micro-batch of {TOKENS} tokens at vocabulary {VOCAB:,}", "MB above the step's start",
                       list(results)[1], {label: r["peak_above_mb"] for label, r in results.items()}, lower_is_better=True),
            comparison(f"one micro-batch of {TOKENS} tokens, {LAYERS} layers of the 0.5B shape, bf16", "MB above the step's start",
                       list(depth)[1], {label: r["peak_above_mb"] for label, r in depth.items()}, lower_is_better=True)]


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(json.dumps(one_step(sys.argv[1])))
    else:
        main()
