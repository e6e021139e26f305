"""Reward service throughput: batches of 64 completions through a DeploymentHandle and over HTTP
(127.0.0.1), side by side, against one running Serve app; and the cost of per-token attribution's
character offsets, decoded as a stream against decoding every prefix.

    python -m bench.bench_reward_service

Each batch is one request of 64 completions of synthetic tasks (a third of them wrong); the two
paths score the same batches, one request at a time, and must agree on every reward. The
difference is what HTTP and JSON cost on top of the scoring.

Attribution (learner.dense_rewards) needs each completion token's end in the decoded text:
`token_end_offsets` for completions of 256 and 1024 tokens of code (the tiny model's tokenizer),
median of 5, against `prefix_end_offsets`, which it replaced.
"""
from __future__ import annotations

import socket
import statistics
import time

import requests

from bench.plots import comparison

BATCH = 64
ROUNDS = 10


def batches():
    from coderloo.tasksets.synthetic import synthetic_suite
    from reward_service.schemas import RewardItem, RewardRequest

    tasks = synthetic_suite()["train"]
    out = []
    for r in range(ROUNDS):
        items = []
        for i in range(BATCH):
            task = tasks[(r * BATCH + i) % len(tasks)]
            right = task.reference[len(task.prompt):] if task.prompt_is_code else task.reference
            items.append(RewardItem(task_id=task.id, completion=right if i % 3 else "    return None\n"))
        out.append(RewardRequest(items=items))
    return out


def timed(call, requests_) -> tuple[list[float], list]:
    latencies, answers = [], []
    for request in requests_:
        start = time.perf_counter()
        answers.append(call(request))
        latencies.append(time.perf_counter() - start)
    return latencies, answers


def report(name: str, latencies: list[float]) -> float:
    """Print one path's line; its completions/s."""
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    rate = BATCH * len(latencies) / sum(latencies)
    print(f"  {name:<18} {rate:8.1f} completions/s  {len(latencies) / sum(latencies):6.2f} requests/s"
          f"  p50 {q[49] * 1000:7.1f} ms  p99 {q[98] * 1000:7.1f} ms")
    return rate


def attribution_offsets() -> dict:
    import tempfile
    from pathlib import Path

    from coderloo.models import TinyModelSpec, build_tiny_model, load_tokenizer
    from coderloo.tasksets.synthetic import corpus_for_tokenizer, synthetic_suite
    from reward_service.attribution import prefix_end_offsets, token_end_offsets

    tokenizer = load_tokenizer(build_tiny_model(Path(tempfile.mkdtemp(prefix="bench-attr-")) / "tiny", corpus_for_tokenizer(), TinyModelSpec()))
    code = "".join(t.reference for t in synthetic_suite()["train"])
    ids = tokenizer(code, add_special_tokens=False)["input_ids"]
    print("per-token attribution: the character end of each completion token, median of 5")
    values = {}
    for n in (256, 1024):
        seconds = {}
        for name, fn in (("stream", token_end_offsets), ("every prefix", prefix_end_offsets)):
            runs = []
            for _ in range(5):
                start = time.perf_counter()
                ends = fn(ids[:n], tokenizer)
                runs.append(time.perf_counter() - start)
            seconds[name] = statistics.median(runs)
            values[f"{name}, {n} tokens"] = seconds[name] * 1000
        assert ends == token_end_offsets(ids[:n], tokenizer)
        print(f"  {n:5d} tokens   stream {seconds['stream'] * 1000:8.2f} ms   every prefix {seconds['every prefix'] * 1000:8.2f} ms"
              f"   every prefix / stream {seconds['every prefix'] / seconds['stream']:6.1f}x")
    return comparison("attribution offsets of one completion", "ms", "stream, 1024 tokens",
                      {k: v for k, v in values.items() if k.endswith("1024 tokens")}, lower_is_better=True)


def main() -> list[dict]:
    from ray import serve

    from coderloo.runtime import init_ray
    from reward_service.app import build_app
    from reward_service.schemas import RewardResponse, ServiceConfig

    init_ray()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        handle = serve.run(build_app(ServiceConfig(num_executors=2)), name="rewards-bench", route_prefix="/")
        work = batches()
        handle.score.remote(work[0]).result()  # warm: the pool's fork servers start on first use
        url = f"http://127.0.0.1:{port}/v1/rewards"

        def over_http(request):
            r = requests.post(url, data=request.model_dump_json(exclude_none=True), timeout=120,
                              headers={"content-type": "application/json"})
            r.raise_for_status()
            return RewardResponse.model_validate_json(r.content)

        handle_s, by_handle = timed(lambda request: handle.score.remote(request).result(), work)
        http_s, by_http = timed(over_http, work)
        print(f"reward service, {ROUNDS} requests of {BATCH} completions each, one request at a time")
        rates = {name: report(name, seconds) for name, seconds in (("DeploymentHandle", handle_s), ("HTTP (127.0.0.1)", http_s))}
        if [a.total for r in by_handle for a in r.items] != [a.total for r in by_http for a in r.items]:
            raise SystemExit("the handle and HTTP paths disagree on rewards")
    finally:
        serve.shutdown()
    return [comparison(f"reward service, requests of {BATCH} completions", "completions/s", "DeploymentHandle", rates),
            attribution_offsets()]


if __name__ == "__main__":
    main()
