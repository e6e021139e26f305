"""The reward service under load over HTTP (127.0.0.1): 1, 8, 32 and 64 concurrent clients, each
sending requests of 8 small programs back to back, for a bounded time and number of requests,
against one Serve app started as the trainer starts it (RewardClient) with autoscaling on (1 to 2
replicas) and a bounded queue.

    python -m bench.bench_reward_load

A client waits out a 503's Retry-After, then sends its next request; every 200 must hold the right
rewards. Latency is per answer, end to end. The queue bound is 16 requests at the HTTP proxy
(the default, 256, is above 64 clients: they would all wait in it), so 32 and 64 clients overflow
it. The replicas' and the proxy's resident memory is read (psutil; their pids from Ray's actor
table) before the first round and after each.
"""
from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time

import aiohttp
import psutil
import requests

from bench.plots import comparison
from coderloo.ops.resources import node_actors

CLIENTS = (1, 8, 32, 64)
BATCH = 8
SECONDS = 20  # each round stops sending after this long ...
MAX_REQUESTS = 1000  # ... or this many requests, whichever comes first
QUEUE = 16
MB = 2**20


def bodies() -> list[tuple[bytes, list[bool]]]:
    """Scoring requests of BATCH synthetic tasks named by id (every fourth completion wrong), with
    whether each item should pass."""
    from coderloo.tasksets.synthetic import synthetic_suite

    tasks = synthetic_suite()["train"]
    out = []
    for first in range(0, len(tasks), BATCH):
        items, passes = [], []
        for i in range(BATCH):
            task = tasks[(first + i) % len(tasks)]
            right = i % 4 != 3
            items.append({"task_id": task.id, "completion": task.reference[len(task.prompt):] if right else "    return None\n"})
            passes.append(right)
        out.append((json.dumps({"items": items}).encode(), passes))
    return out


def serve_rss_mb() -> dict[str, float]:
    """Resident memory (MB) of each live Serve replica and of the HTTP proxy, by their labels in
    coderloo.ops.resources (reward-replica-N, serve-proxy)."""
    out = {}
    for label, pid in node_actors().items():
        if label.startswith(("reward-replica", "serve-proxy")):
            try:
                out[label] = psutil.Process(pid).memory_info().rss / MB
            except psutil.NoSuchProcess:
                pass  # stopped since the table was read
    return out


async def load_round(url: str, clients: int, work: list[tuple[bytes, list[bool]]]) -> dict:
    """`clients` clients sending until SECONDS or MAX_REQUESTS; each answer's status and latency."""
    answers: list[tuple[int, float]] = []
    sent = 0
    deadline = time.perf_counter() + SECONDS

    async def client(session: aiohttp.ClientSession, index: int) -> None:
        nonlocal sent
        while time.perf_counter() < deadline and sent < MAX_REQUESTS:
            body, passes = work[(index + sent) % len(work)]
            sent += 1
            start = time.perf_counter()
            async with session.post(url, data=body, headers={"content-type": "application/json"}) as response:
                content = await response.read()
                answers.append((response.status, time.perf_counter() - start))
                if response.status == 200 and [i["passed"] for i in json.loads(content)["items"]] != passes:
                    raise SystemExit(f"wrong rewards under load: {content[:300]!r}")
                if response.status == 503:
                    if "retry-after" not in response.headers:
                        raise SystemExit("a 503 without Retry-After")
                    await asyncio.sleep(int(response.headers["retry-after"]))

    start = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(client(session, i) for i in range(clients)))
    return {"answers": answers, "seconds": time.perf_counter() - start}


def ms(seconds: list[float], q: int) -> float | None:
    """The q-th percentile of `seconds`, in ms (None: no values)."""
    if len(seconds) < 2:
        return seconds[0] * 1000 if seconds else None
    return statistics.quantiles(seconds, n=100, method="inclusive")[q - 1] * 1000


def shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def memory(before: dict[str, float], after: dict[str, float], replicas: bool) -> str:
    """'before -> after' MB of each replica (or the proxy), short names."""
    names = [n for n in sorted(set(before) | set(after)) if n.startswith("reward-replica") == replicas]
    return "; ".join(f"{before[n]:.0f} -> {after[n]:.0f}" if n in before and n in after else
                     f"(new) {after[n]:.0f}" if n in after else f"{before[n]:.0f} -> (gone)" for n in names)


def table_row(clients: int, result: dict, before: dict[str, float], after: dict[str, float]) -> tuple[str, float, float]:
    """One round's line of the table; its programs/s and the p99 latency of its 200s (ms)."""
    answers, seconds = result["answers"], result["seconds"]
    ok = [t for code, t in answers if code == 200]
    refused = [t for code, t in answers if code == 503]
    rate = len(ok) / seconds
    replicas = [sum(n.startswith("reward-replica") for n in rss) for rss in (before, after)]
    row = (f"| {clients} | {len(answers)} | {len(ok)} | {len(refused)} | {len(answers) - len(ok) - len(refused)} | "
           f"{seconds:.1f} | {rate:.1f} | {rate * BATCH:.0f} | {shown(ms(ok, 50))} | {shown(ms(ok, 99))} | "
           f"{shown(ms(refused, 50))} | {replicas[0]} -> {replicas[1]} | {memory(before, after, True)} | "
           f"{memory(before, after, False)} |")
    return row, rate * BATCH, ms(ok, 99) or 0.0


def main() -> list[dict]:
    from ray import serve

    from coderloo.runtime import init_ray
    from coderloo.tasksets.synthetic import synthetic_suite
    from common.placement import free_port
    from reward_service.client import APP_NAME, RewardClient
    from reward_service.config import AutoscalingSettings, ServiceConfig
    from reward_service.tasks import save_jsonl
    from sandbox_pool import PoolSettings

    task_file = f"{tempfile.mkdtemp(prefix='bench-reward-load-')}/train.jsonl"
    save_jsonl(synthetic_suite()["train"], task_file)
    init_ray()
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    config = ServiceConfig(
        pool=PoolSettings(initial_executors=2, max_executors=4), task_files=[task_file], max_queued_requests=QUEUE,
        autoscaling=AutoscalingSettings(min_replicas=1, max_replicas=2),
    )
    rewards = RewardClient(config)  # Serve runs already: the client adds its app to it
    url = f"http://127.0.0.1:{port}/{APP_NAME}/v1/rewards"
    work = bodies()
    rows, rates, p99s = [], {}, {}
    print(f"reward service under load: requests of {BATCH} programs over HTTP (127.0.0.1), autoscaling 1-2 replicas "
          f"(max_ongoing_requests {config.max_ongoing_requests} each), a queue of {QUEUE} at the proxy, "
          f"each round {SECONDS} s or {MAX_REQUESTS} requests", flush=True)
    try:
        # warm: the pool's fork servers start on first use
        requests.post(url, data=work[0][0], headers={"content-type": "application/json"}, timeout=120).raise_for_status()
        first = before = serve_rss_mb()
        for clients in CLIENTS:
            result = asyncio.run(load_round(url, clients, work))
            after = serve_rss_mb()
            label = f"{clients} client{'s' if clients > 1 else ''}"
            row, rates[label], p99s[label] = table_row(clients, result, before, after)
            rows.append(row)
            before = after
            print(f"  {label}: done in {result['seconds']:.1f} s", flush=True)
    finally:
        rewards.close()
        serve.shutdown()
    print("| clients | answers | 200 | 503 | other | s | requests/s (200) | programs/s | p50 ms (200) | p99 ms (200) | "
          "p50 ms (503) | replicas | replica RSS MB before -> after | proxy RSS MB before -> after |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"  Serve's processes before the first round -> after the last (MB): replicas {memory(first, before, True)}; "
          f"proxy {memory(first, before, False)}")
    return [comparison("reward service under load: programs/s over HTTP", "programs/s", "1 client", rates),
            comparison("reward service under load: p99 latency of a 200", "ms", "1 client", p99s, lower_is_better=True)]


if __name__ == "__main__":
    main()
