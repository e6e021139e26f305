"""Reward service throughput against the sandbox it runs on, side by side in one run: the same
programs scored through the trainer's path and run on the process backend directly.

    python -m bench.bench_reward_service

Each round is a training step's scoring: PROMPTS synthetic tasks, SAMPLES completions each (every
third one wrong; each distinct, so none is deduplicated), sent as the trainer sends them
(`RewardClient.submit` per prompt, all in flight, then `collect`: the client sends the submits of
one moment as requests of `client_batch_items`, here 4 of 64), and the very same
programs, as the scorer builds them, run on warm fork servers (`ForkServer.execute`, CONCURRENCY
at a time, as bench/bench_sandbox.py drives it), as many as the service's pool has executors, each
running as many at a time as an executor (EXECUTORS x CONCURRENCY_PER_EXECUTOR): the same
sandboxes, without Ray, Serve or scoring. The rounds alternate between the paths
(bench.plots.alternating) and medians are reported; every path must agree on every outcome.
Two more paths: the handle with a request per prompt (`client_linger_ms` 0: what each Serve
request costs), and the same requests of a prompt each over HTTP (127.0.0.1), as many in flight:
what HTTP and JSON cost on top.
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from bench.bench_sandbox import CONCURRENCY, run_async
from bench.plots import alternating, comparison, medians

PROMPTS = 32
SAMPLES = 8
ROUNDS = 5
EXECUTORS = 2
CONCURRENCY_PER_EXECUTOR = CONCURRENCY // EXECUTORS
BACKEND = "process backend, direct"
HANDLE = "reward service, DeploymentHandle"
PER_PROMPT = "reward service, handle, a request a prompt"
HTTP = "reward service, HTTP (127.0.0.1)"


def workload(tasks, round_: int) -> tuple[list, list[list[str]]]:
    """A round's PROMPTS tasks and SAMPLES completions of each: the reference's code, or a wrong
    body for every third; a comment numbers each sample so that no two programs are the same."""
    chosen = [tasks[(round_ * PROMPTS + p) % len(tasks)] for p in range(PROMPTS)]
    completions = []
    for task in chosen:
        right = task.reference[len(task.prompt):] if task.prompt_is_code else task.reference
        completions.append([("    return None\n" if s % 3 == 0 else right) + f"# sample {s}\n" for s in range(SAMPLES)])
    return chosen, completions


def main() -> list[dict]:
    from coderloo.runtime import init_ray
    from coderloo.tasksets.synthetic import synthetic_suite
    from common.placement import free_port
    from reward_service.client import APP_NAME, RewardClient
    from reward_service.config import ServiceConfig
    from reward_service.schemas import RewardItem, RewardRequest, RewardResponse
    from reward_service.scorer import analyse
    from sandbox_pool import ForkServer, PoolSettings

    tasks = synthetic_suite()["train"]
    rounds = [workload(tasks, r) for r in range(ROUNDS)]
    config = ServiceConfig(pool=PoolSettings(min_executors=EXECUTORS, initial_executors=EXECUTORS, max_executors=EXECUTORS,
                                             concurrency_per_executor=CONCURRENCY_PER_EXECUTOR))
    # The programs the scorer builds of each completion, as the pool receives them.
    executions = [[t.execution_request(analyse(t, c).program, config.limits) for t, cs in zip(*w) for c in cs] for w in rounds]
    count = PROMPTS * SAMPLES
    init_ray()
    port = free_port()
    client = RewardClient(config, http_port=port)
    servers = {ForkServer(): 0 for _ in range(EXECUTORS)}  # each with its runs in flight

    async def on_a_server(request):
        server = min(servers, key=servers.get)  # as the pool's dispatcher spreads them
        servers[server] += 1
        try:
            return await server.execute(request)
        finally:
            servers[server] -= 1
    url = f"http://127.0.0.1:{port}/{APP_NAME}/v1/rewards"
    http = requests.Session()
    outcomes: dict[str, list[list[bool]]] = {BACKEND: [], HANDLE: [], PER_PROMPT: [], HTTP: []}

    def by_backend(r: int) -> dict:
        seconds, passed = asyncio.run(run_async(on_a_server, executions[r]))
        outcomes[BACKEND].append(passed)
        return {"programs_s": count / seconds}

    def by_handle(r: int, path: str = HANDLE) -> dict:
        start = time.perf_counter()
        rewards = client.collect([p for t, cs in zip(*rounds[r]) for p in client.submit([t] * len(cs), cs)])
        seconds = time.perf_counter() - start
        outcomes[path].append([x.passed for x in rewards])
        return {"programs_s": count / seconds}

    def by_prompt(r: int) -> dict:
        linger, client.linger_s = client.linger_s, 0.0  # each submit sent at once, as its own request
        try:
            return by_handle(r, PER_PROMPT)
        finally:
            client.linger_s = linger

    def post(request: RewardRequest) -> list:
        answer = http.post(url, data=request.model_dump_json(exclude_none=True), timeout=120,
                           headers={"content-type": "application/json"})
        answer.raise_for_status()
        return RewardResponse.model_validate_json(answer.content).items

    def by_http(r: int) -> dict:
        bodies = [RewardRequest(items=[RewardItem(task=t, completion=c) for c in cs]) for t, cs in zip(*rounds[r])]
        start = time.perf_counter()
        with ThreadPoolExecutor(PROMPTS) as threads:
            rewards = [x for items in threads.map(post, bodies) for x in items]
        seconds = time.perf_counter() - start
        outcomes[HTTP].append([x.passed for x in rewards])
        return {"programs_s": count / seconds}

    try:
        # warm: the fork servers (the pool's and ours) start on first use
        client.score(rounds[0][0][:1], rounds[0][1][0][:1])
        for server in servers:
            asyncio.run(server.execute(executions[0][0]))
        runs = medians(alternating(ROUNDS, {BACKEND: by_backend, HANDLE: by_handle, PER_PROMPT: by_prompt, HTTP: by_http}))
    finally:
        for server in servers:
            server.close()
        client.close()
    if any(outcome != outcomes[BACKEND] for outcome in outcomes.values()):
        raise SystemExit("the reward service and the process backend disagree on which programs pass")
    rates = {name: r["programs_s"] for name, r in runs.items()}
    print(f"reward service against its sandbox: programs/s, {ROUNDS} rounds of {PROMPTS} prompts of {SAMPLES} completions "
          f"({count} programs, all in flight; the handle's in requests of {client.batch_items}), median; {EXECUTORS} fork servers x {CONCURRENCY_PER_EXECUTOR} at a "
          f"time, directly or as the service's pool")
    for name, rate in rates.items():
        print(f"  {name:44s} {rate:8.1f} programs/s   x{rate / rates[BACKEND]:.2f} of the process backend")
    # What a Serve request costs: the same programs in PROMPTS requests against ceil(count / batch) of them
    extra = PROMPTS - -(-count // client.batch_items)
    per_request = (count / rates[PER_PROMPT] - count / rates[HANDLE]) / extra
    print(f"  a Serve request costs {per_request * 1e3:.1f} ms of the round's time ({extra} more requests a round, "
          f"a request a prompt against the handle's)")
    return [comparison(f"reward service vs its sandbox: programs/s ({PROMPTS} prompts of {SAMPLES} in flight)",
                       "programs/s", HANDLE, rates)]


if __name__ == "__main__":
    main()
