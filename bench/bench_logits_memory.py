"""Peak memory of one learner micro-batch at Qwen2.5-Coder's vocabulary: the logits of every token
at once (`token_logprobs(model(...).logits)`, as the learner did) against learner/logits.py's
chunks, forward and backward, side by side in one run.

    python -m bench.bench_logits_memory

A micro-batch of 4,096 tokens (4 rows of a 64-token prompt and a 960-token completion) through a
Qwen2 model with Qwen2.5-Coder-0.5B's width, vocabulary and tied head (hidden 896, vocabulary
151,936) but 2 decoder layers: the layers' activations are the same in both ways, the head's
logits are what differs. Each way runs in a fresh process (`ru_maxrss` is a process's peak); the
figure is the peak resident memory during the step above the resident memory before it.
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
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=4864, num_hidden_layers=2, num_attention_heads=14,
                         num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=32768, rope_theta=1e6)
    model = Qwen2ForCausalLM(config).float()
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


def main() -> list[dict]:
    results = {}
    for label, way in WAYS.items():
        out = subprocess.run([sys.executable, "-m", "bench.bench_logits_memory", way], capture_output=True, text=True, check=True)
        results[label] = json.loads(out.stdout.strip().splitlines()[-1])
    logits_gb = TOKENS * VOCAB * 4 / 1e9
    print(f"one learner micro-batch of {TOKENS} tokens, vocabulary {VOCAB:,}, hidden {HIDDEN}, fp32, forward and backward "
          f"(the logits of every token: {logits_gb:.2f} GB)")
    for label, r in results.items():
        print(f"  {label:42s} peak +{r['peak_above_mb']:8.0f} MB   {r['seconds']:6.1f} s")
    (whole, chunked) = results.values()
    print(f"  chunked / whole: memory {chunked['peak_above_mb'] / whole['peak_above_mb']:.2f}x, time {chunked['seconds'] / whole['seconds']:.2f}x")
    return [comparison(f"peak memory of one micro-batch of {TOKENS} tokens at vocabulary {VOCAB:,}", "MB above the step's start",
                       list(results)[1], {label: r["peak_above_mb"] for label, r in results.items()}, lower_is_better=True)]


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(json.dumps(one_step(sys.argv[1])))
    else:
        main()
