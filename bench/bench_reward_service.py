"""Reward service throughput: batches of 64 completions through a DeploymentHandle and over HTTP
(127.0.0.1), side by side, against one running Serve app.

    python -m bench.bench_reward_service

Each batch is one request of 64 completions of synthetic tasks (a third of them wrong); the two
paths score the same batches, one request at a time, and must agree on every reward. The
difference is what HTTP and JSON cost on top of the scoring.
Requests name their tasks by id: the service reads them from a task file of the synthetic
train split.
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


def main() -> list[dict]:
    from ray import serve

    import tempfile

    from coderloo.runtime import init_ray
    from coderloo.tasksets.synthetic import synthetic_suite
    from reward_service.app import build_app
    from reward_service.config import ServiceConfig
    from reward_service.schemas import RewardResponse
    from reward_service.tasks import save_jsonl
    from sandbox_pool import PoolSettings

    task_file = f"{tempfile.mkdtemp(prefix='bench-rewards-')}/train.jsonl"
    save_jsonl(synthetic_suite()["train"], task_file)
    init_ray()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        handle = serve.run(build_app(ServiceConfig(pool=PoolSettings(initial_executors=2), task_files=[task_file])), name="rewards-bench", route_prefix="/")
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
    return [comparison(f"reward service, requests of {BATCH} completions", "completions/s", "DeploymentHandle", rates)]


if __name__ == "__main__":
    main()
