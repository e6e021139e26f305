"""A real model's greedy completions from vLLM (coderloo's engine) and from transformers, on the
same prompts (each task through the model's chat template, as `coderloo eval` renders it) and
weights, both in float32: pass@1 of each by coderloo's scorer and sandbox, where the two first
part and by what margin, and tokens/s of each.

    python -m bench.bench_real_models [--model DIR] [--set humaneval] [--limit N]   # about 40 min

transformers' greedy completion of a task is found from vLLM's: one forward pass over the prompt
and vLLM's completion gives transformers' own greedy choice at every position; where the first
differs from vLLM's token (a parting), transformers' `generate` continues from there, so every
completion is transformers' greedy decode (its choice of each token given the ones before). At a
parting, the margin of transformers' choice over vLLM's in its logits is set against what the
two computations' float32 rounding can move it (tests/rounding.py): within it, a near-tie that
either engine may break; beyond it, the engines computed something different.

Speed: both engines generate the first `--speed` prompts alone on the machine's cores, one after
the other, transformers `--speed` prompts a batch, left-padded, until the longest is done (its
static batching), vLLM all at once (continuous batching); the timings are of generation only.
"""
from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import ray

from bench.bench_graders import EVAL_LIMITS, _ours
from coderloo.config import EvalConfig
from coderloo.model_import import fetch
from coderloo.runtime import REPO_ROOT, init_ray
from common.hf import load_tokenizer
from reward_service.scorer import analyse
from rollout_workers import GenerationParams, RolloutGroup, RolloutWorker
from rollout_workers.config import PromptConfig
from rollout_workers.prompts import answered_task, render
from sandbox_pool import Status
from tests.rounding import margin_bound, reduction_length

DATA = (REPO_ROOT / EvalConfig().data_dir).resolve()


def tasks_of(name: str, limit: int | None):
    from coderloo.tasksets.benchmarks import load_humaneval
    from coderloo.tasksets.evalplus import load_evalplus

    if name == "humaneval":
        return load_humaneval(DATA / "HumanEval.jsonl.gz")[:limit]
    return load_evalplus(DATA / "MbppPlus-v0.2.0.jsonl.gz", plus=False)[:limit]


def with_vllm(model: str, prompt_ids: list[list[int]], max_new_tokens: int, speed: int):
    """vLLM's greedy completions of every prompt, and the seconds it took to generate the first `speed` alone."""
    worker = RolloutWorker.remote(model, "vllm", threads=2, engine={"dtype": "float32"})
    greedy = GenerationParams(n=1, max_new_tokens=max_new_tokens, temperature=0.0)
    try:
        group = RolloutGroup([worker])
        group.generate(prompt_ids[:1], GenerationParams(n=1, max_new_tokens=8, temperature=0.0))  # warm-up
        start = time.perf_counter()
        group.generate(prompt_ids[:speed], greedy)
        seconds = time.perf_counter() - start
        return [r.samples[0].token_ids for r in group.generate(prompt_ids, greedy)], seconds
    finally:
        ray.kill(worker)


def cut(row: list[int], ends: set[int]) -> list[int]:
    end = next((j for j, t in enumerate(row) if t in ends), None)
    return row if end is None else row[: end + 1]


def generate_batch(lm, prompt_ids: list[list[int]], max_new_tokens: int, ends: set[int]) -> list[list[int]]:
    import torch

    width, pad = max(len(p) for p in prompt_ids), lm.generation_config.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids])
    with torch.no_grad():
        out = lm.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens)
    return [cut(row, ends) for row in out[:, width:].tolist()]


def with_transformers(lm, prompt_ids, vllm_ids, max_new_tokens: int, ends: set[int]):
    """transformers' greedy completions, found from vLLM's (module docstring), and per task its
    parting from vLLM's: None, or (position, margin, bound)."""
    import torch

    out, partings, start = [], [], time.perf_counter()
    rows = lm.get_output_embeddings().weight.detach()
    for i, (prompt, theirs) in enumerate(zip(prompt_ids, vllm_ids, strict=True)):
        with torch.no_grad():
            result = lm(input_ids=torch.tensor([prompt + theirs]), use_cache=False, output_hidden_states=True,
                        logits_to_keep=len(theirs) + 1)
        logits, hidden = result.logits[0], result.hidden_states[-1][0, -len(theirs) - 1:]
        choice = logits[: len(theirs)].argmax(-1).tolist()
        at = next((j for j, (a, b) in enumerate(zip(choice, theirs)) if a != b), None)
        if at is None:  # transformers chooses vLLM's every token; it goes on only where vLLM stopped at its length limit
            out.append(theirs if theirs[-1] in ends or len(theirs) >= max_new_tokens else
                       theirs + generate_batch(lm, [prompt + theirs], max_new_tokens - len(theirs), ends)[0])
            partings.append(None)
        else:
            a, b = choice[at], theirs[at]
            margin = float(logits[at, a] - logits[at, b])
            n = reduction_length(lm.config, len(prompt) + at)
            bound = margin_bound(2, n, hidden[at], rows[a], rows[b])
            out.append(theirs[:at] + generate_batch(lm, [prompt + theirs[:at]], max_new_tokens - at, ends)[0])
            partings.append((at, margin, bound))
        if (i + 1) % 16 == 0:
            print(f"  transformers: {i + 1}/{len(prompt_ids)} tasks, {time.perf_counter() - start:.0f} s", flush=True)
    return out, partings


def passed(tasks, tokenizer, ids: list[list[int]]) -> list[bool]:
    texts = [tokenizer.decode(i, skip_special_tokens=True) for i in ids]
    results = asyncio.run(_ours([t.execution_request(analyse(t, text).program, EVAL_LIMITS) for t, text in zip(tasks, texts)]))
    return [r.status is Status.passed for r in results]


def main(argv: list[str] | None = None) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a model directory (default: the catalogue's "
                        "qwen2.5-coder-0.5b-instruct, fetched if it is not yet)")
    parser.add_argument("--set", default="humaneval", choices=["humaneval", "mbpp+base"])
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--speed", type=int, default=16, help="prompts of the tokens/s comparison")
    parser.add_argument("--max-new-tokens", type=int, default=768)
    args = parser.parse_args(argv or [])
    args.model = args.model or str(fetch("qwen2.5-coder-0.5b-instruct"))
    tokenizer, chat = load_tokenizer(args.model), PromptConfig(chat_template="on")
    tasks = tasks_of(args.set, args.limit)
    prompt_ids = [tokenizer(render(t, tokenizer, chat), add_special_tokens=False)["input_ids"] for t in tasks]
    tasks = [answered_task(t, tokenizer, chat) for t in tasks]  # a chat answer is the whole program
    print(f"{args.set}, {len(tasks)} tasks, greedy, float32, up to {args.max_new_tokens} new tokens, {Path(args.model).name}")

    init_ray(num_cpus=4)
    vllm_ids, vllm_s = with_vllm(args.model, prompt_ids, args.max_new_tokens, args.speed)
    ray.shutdown()
    torch.set_num_threads(2)
    lm = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, local_files_only=True).eval()
    ends = lm.generation_config.eos_token_id
    ends = set(ends if isinstance(ends, list) else [ends])
    start = time.perf_counter()
    speed_ids = generate_batch(lm, prompt_ids[: args.speed], args.max_new_tokens, ends)
    hf_s = time.perf_counter() - start
    hf_ids, partings = with_transformers(lm, prompt_ids, vllm_ids, args.max_new_tokens, ends)

    verdicts = {"vllm": passed(tasks, tokenizer, vllm_ids), "transformers": passed(tasks, tokenizer, hf_ids)}
    for engine, v in verdicts.items():
        print(f"  {engine:13s} pass@1 {sum(v) / len(tasks):6.1%} ({sum(v)} of {len(tasks)})")
    apart = [(i, *p) for i, p in enumerate(partings) if p is not None]
    beyond = [p for p in apart if p[2] > p[3]]
    differ = [i for i, (a, b) in enumerate(zip(verdicts["vllm"], verdicts["transformers"])) if a != b]
    print(f"  same completion on {len(tasks) - len(apart)} of {len(tasks)} tasks; parted on {len(apart)}, "
          f"{len(beyond)} of them beyond rounding; verdicts differ on {len(differ)}: {differ}")
    for i, at, margin, bound in apart:
        print(f"    task {tasks[i].task_id}: token {at}, margin {margin:.3g} (bound {bound:.3g})"
              f"{'  BEYOND' if margin > bound else ''}{'  verdicts differ' if i in differ else ''}")
    tokens = {"vllm": sum(map(len, vllm_ids[: args.speed])), "transformers": sum(map(len, speed_ids))}
    rates = {"vllm": tokens["vllm"] / vllm_s, "transformers": tokens["transformers"] / hf_s}
    print(f"  speed, the first {args.speed} prompts: vllm {tokens['vllm']} tokens in {vllm_s:.1f} s ({rates['vllm']:.1f}/s), "
          f"transformers {tokens['transformers']} in {hf_s:.1f} s ({rates['transformers']:.1f}/s): "
          f"{rates['vllm'] / rates['transformers']:.1f}x; same completions {sum(a == b for a, b in zip(speed_ids, hf_ids))} of {len(speed_ids)}")
    return []


if __name__ == "__main__":
    main(__import__("sys").argv[1:])
