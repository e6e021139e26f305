"""A real model's greedy completions from vLLM (coderloo's engine) and from transformers' own
`generate`, on the same prompts (each task through the model's chat template, as `coderloo eval`
renders it) and weights, both in bf16: pass@1 of each by coderloo's scorer and sandbox, how many
completions are the same, and tokens/s of each.

    python -m bench.bench_real_models [--model DIR] [--set humaneval] [--limit N] [--batch 16]   # about 30 min

transformers generates `--batch` prompts at a time, left-padded, until the longest is done (its
static batching); vLLM takes them all at once (continuous batching). Each engine gets the
machine's cores alone, one after the other; the timings are of generation only.
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

DATA = (REPO_ROOT / EvalConfig().data_dir).resolve()


def tasks_of(name: str, limit: int | None):
    from coderloo.tasksets.benchmarks import load_humaneval
    from coderloo.tasksets.evalplus import load_evalplus

    if name == "humaneval":
        return load_humaneval(DATA / "HumanEval.jsonl.gz")[:limit]
    return load_evalplus(DATA / "MbppPlus-v0.2.0.jsonl.gz", plus=False)[:limit]


def with_vllm(model: str, prompt_ids: list[list[int]], max_new_tokens: int) -> tuple[list[list[int]], float]:
    worker = RolloutWorker.remote(model, "vllm", threads=2, engine={"dtype": "bfloat16"})
    try:
        group = RolloutGroup([worker])
        group.generate(prompt_ids[:1], GenerationParams(n=1, max_new_tokens=8, temperature=0.0))  # warm-up
        start = time.perf_counter()
        rollouts = group.generate(prompt_ids, GenerationParams(n=1, max_new_tokens=max_new_tokens, temperature=0.0))
        return [r.samples[0].token_ids for r in rollouts], time.perf_counter() - start
    finally:
        ray.kill(worker)


def with_transformers(model: str, prompt_ids: list[list[int]], max_new_tokens: int, batch: int) -> tuple[list[list[int]], float]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16, local_files_only=True).eval()
    ends = lm.generation_config.eos_token_id
    ends = set(ends if isinstance(ends, list) else [ends])
    pad = lm.generation_config.pad_token_id
    out, start = [], time.perf_counter()
    for i in range(0, len(prompt_ids), batch):
        chunk = prompt_ids[i : i + batch]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        with torch.no_grad():
            generated = lm.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens)
        for row in generated[:, width:].tolist():
            cut = next((j for j, t in enumerate(row) if t in ends), None)
            out.append(row if cut is None else row[: cut + 1])
        print(f"  transformers: {min(i + batch, len(prompt_ids))}/{len(prompt_ids)} prompts, "
              f"{time.perf_counter() - start:.0f} s", flush=True)
    return out, time.perf_counter() - start


def passed(tasks, texts: list[str]) -> list[bool]:
    results = asyncio.run(_ours([t.execution_request(analyse(t, text).program, EVAL_LIMITS) for t, text in zip(tasks, texts)]))
    return [r.status is Status.passed for r in results]


def report(engine: str, tasks, tokenizer, runs: dict, verdicts: dict) -> None:
    ids, seconds = runs[engine]
    verdicts[engine] = passed(tasks, [tokenizer.decode(i, skip_special_tokens=True) for i in ids])
    tokens = sum(len(i) for i in ids)
    print(f"  {engine:13s} pass@1 {sum(verdicts[engine]) / len(tasks):6.1%}  {tokens:7d} tokens in {seconds:7.1f} s: "
          f"{tokens / seconds:6.1f} tokens/s", flush=True)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a model directory (default: the catalogue's "
                        "qwen2.5-coder-0.5b-instruct, fetched if it is not yet)")
    parser.add_argument("--set", default="humaneval", choices=["humaneval", "mbpp+base"])
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=768)
    args = parser.parse_args(argv or [])
    args.model = args.model or str(fetch("qwen2.5-coder-0.5b-instruct"))
    tokenizer, chat = load_tokenizer(args.model), PromptConfig(chat_template="on")
    tasks = tasks_of(args.set, args.limit)
    prompt_ids = [tokenizer(render(t, tokenizer, chat), add_special_tokens=False)["input_ids"] for t in tasks]
    tasks = [answered_task(t, tokenizer, chat) for t in tasks]  # a chat answer is the whole program
    print(f"{args.set}, {len(tasks)} tasks, greedy, bf16, up to {args.max_new_tokens} new tokens, {Path(args.model).name}")
    init_ray(num_cpus=4)
    runs, verdicts = {"vllm": with_vllm(args.model, prompt_ids, args.max_new_tokens)}, {}
    ray.shutdown()
    report("vllm", tasks, tokenizer, runs, verdicts)
    runs["transformers"] = with_transformers(args.model, prompt_ids, args.max_new_tokens, args.batch)
    report("transformers", tasks, tokenizer, runs, verdicts)
    same = sum(a == b for a, b in zip(runs["vllm"][0], runs["transformers"][0]))
    both = sum(a == b for a, b in zip(verdicts["vllm"], verdicts["transformers"]))
    print(f"  same completion on {same} of {len(tasks)} tasks; same verdict on {both}; "
          f"vllm / transformers tokens/s: {(sum(map(len, runs['vllm'][0])) / runs['vllm'][1]) / (sum(map(len, runs['transformers'][0])) / runs['transformers'][1]):.1f}x")
    return []


if __name__ == "__main__":
    main(__import__("sys").argv[1:])
