"""SandboxFusion's POST /run_code against coderloo's own POST /v1/rewards, in the same run, over HTTP
(127.0.0.1): 1, 8, 32 and 64 concurrent clients, each sending one program per request back to
back for a bounded time, against the service as `coderloo serve` deploys it (one replica, its
default pool and queue).

    python -m bench.bench_run_code

The same small stdin/stdout programs go both ways: through /run_code as verl sends them (the
client compares stdout itself, as verl does), through /v1/rewards as a task with its case (the
service judges). Each round runs the two routes in turn at the same client count. A 504 (a full
queue) is counted and sent again after a second, as verl's client does; any other failure stops
the bench. Latency is per answer, end to end.
"""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from bench.bench_reward_load import ms, shown
from bench.plots import comparison

CLIENTS = (1, 8, 32, 64)
SECONDS = 10  # each route's round stops sending after this long
PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"


def cases(n: int = 16) -> list[tuple[str, str]]:
    return [(f"{i} {i * 7}\n", f"{i * 8}\n") for i in range(n)]


def run_code_body(stdin: str) -> bytes:
    return json.dumps({"code": PROGRAM, "language": "python", "stdin": stdin, "compile_timeout": 10, "run_timeout": 10,
                       "memory_limit_MB": 512, "files": {}, "fetch_files": []}).encode()


def rewards_body(stdin: str, stdout: str) -> bytes:
    task = {"id": "bench/sum", "prompt": "Print the sum of two integers.", "tests": [{"stdin": stdin, "stdout": stdout}],
            "reference": PROGRAM, "difficulty": 1, "source": "bench", "prompt_is_code": False}
    return json.dumps({"items": [{"task": task, "completion": f"```python\n{PROGRAM}```"}]}).encode()


def passed(route: str, content: bytes, stdout: str) -> bool:
    answer = json.loads(content)
    if route == "run_code":
        return answer["status"] == "Success" and answer["run_result"]["stdout"].rstrip("\n") == stdout.rstrip("\n")
    return answer["items"][0]["passed"]


async def load_round(url: str, route: str, clients: int) -> dict:
    """`clients` clients sending one program per request for SECONDS; each answer's status and latency."""
    work = cases()
    answers: list[tuple[int, float]] = []
    deadline = time.perf_counter() + SECONDS

    async def client(session: aiohttp.ClientSession, index: int) -> None:
        sent = 0
        while time.perf_counter() < deadline:
            stdin, stdout = work[(index + sent) % len(work)]
            sent += 1
            body = run_code_body(stdin) if route == "run_code" else rewards_body(stdin, stdout)
            start = time.perf_counter()
            async with session.post(url, data=body, headers={"content-type": "application/json"}) as response:
                content = await response.read()
            answers.append((response.status, time.perf_counter() - start))
            if response.status in (503, 504):
                await asyncio.sleep(1)
            elif response.status != 200 or not passed(route, content, stdout):
                raise SystemExit(f"{route}: a wrong answer under load: {response.status} {content[:300]!r}")

    start = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300),
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(client(session, i) for i in range(clients)))
    return {"answers": answers, "seconds": time.perf_counter() - start}


def main() -> list[dict]:
    import requests
    from ray import serve

    from coderloo.runtime import init_ray
    from common.placement import free_port
    from reward_service.app import deploy
    from reward_service.config import ServiceConfig

    init_ray()
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    deploy(ServiceConfig())
    base = f"http://127.0.0.1:{port}"
    routes = {"run_code": f"{base}/run_code", "rewards": f"{base}/v1/rewards"}
    rates: dict[str, float] = {}
    p99s: dict[str, float] = {}
    rows = []
    print(f"/run_code against /v1/rewards over HTTP (127.0.0.1): one stdin/stdout program per request, one replica "
          f"as `coderloo serve` deploys it, {SECONDS} s per route and client count", flush=True)
    try:
        for route, url in routes.items():  # warm: the pool's fork servers start on first use
            stdin, stdout = cases()[0]
            body = run_code_body(stdin) if route == "run_code" else rewards_body(stdin, stdout)
            requests.post(url, data=body, headers={"content-type": "application/json"}, timeout=120).raise_for_status()
        for clients in CLIENTS:
            for route, url in routes.items():
                result = asyncio.run(load_round(url, route, clients))
                ok = [t for code, t in result["answers"] if code == 200]
                full = sum(code in (503, 504) for code, _ in result["answers"])
                rate = len(ok) / result["seconds"]
                label = f"{route}, {clients} client{'s' if clients > 1 else ''}"
                rates[label], p99s[label] = rate, ms(ok, 99) or 0.0
                rows.append(f"| {clients} | /{'run_code' if route == 'run_code' else 'v1/rewards'} | {len(ok)} | {full} | "
                            f"{rate:.1f} | {shown(ms(ok, 50))} | {shown(ms(ok, 99))} |")
                print(f"  {label}: {rate:.1f} programs/s", flush=True)
    finally:
        serve.shutdown()
    print("| clients | route | 200 | 503/504 | programs/s | p50 ms | p99 ms |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    for clients in CLIENTS:
        plural = "s" if clients > 1 else ""
        print(f"  {clients} client{plural}: /run_code at {rates[f'run_code, {clients} client{plural}'] / rates[f'rewards, {clients} client{plural}']:.2f}x "
              "the programs/s of /v1/rewards")
    return [comparison("/run_code and /v1/rewards: programs/s over HTTP", "programs/s", "rewards, 1 client", rates),
            comparison("/run_code and /v1/rewards: p99 latency", "ms", "rewards, 1 client", p99s, lower_is_better=True)]


if __name__ == "__main__":
    main()
