"""Sandbox throughput: the same small programs through an interpreter per program and through
one warm fork server, in one run.

    python -m bench.bench_sandbox

Interpreter per program: every program gets a new fork server (a fresh `python -I -S`, which
unshares its own network namespace), stopped after its one run: the start-up cost the process
backend used to pay for every program. Fork server: one server, started before the clock, forks
every program. Both run CONCURRENCY programs at a time (the default config's 2 executors x 4), in
this process, without Ray, and must agree on every program's outcome.
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter

from sandbox_pool import ExecutionRequest, ExecutionResult, ForkServer, Status

PROGRAMS = 300
CONCURRENCY = 8


def programs(count: int) -> list[ExecutionRequest]:
    """A function and 3 asserts each; every third program has a bug that fails its last assert."""
    requests = []
    for i in range(count):
        buggy = i % 3 == 0
        program = f"def scale_{i}(x):\n    return x * {i} + {int(buggy)} * (x > 2)\n"
        tests = [f"assert scale_{i}({x}) == {x * i}" for x in (1, 2, 3)]
        requests.append(ExecutionRequest(program=program, tests=tests))
    return requests


async def interpreter_per_program(request: ExecutionRequest) -> ExecutionResult:
    server = ForkServer()
    try:
        return await server.execute(request)
    finally:
        server.close()


async def measure(run, requests: list[ExecutionRequest]) -> tuple[float, list[ExecutionResult]]:
    slots = asyncio.Semaphore(CONCURRENCY)

    async def one(request: ExecutionRequest) -> ExecutionResult:
        async with slots:
            return await run(request)

    start = time.perf_counter()
    results = await asyncio.gather(*(one(request) for request in requests))
    return time.perf_counter() - start, list(results)


async def compare(requests: list[ExecutionRequest]) -> None:
    fresh_s, fresh = await measure(interpreter_per_program, requests)
    server = ForkServer()
    try:
        await server.execute(requests[0])  # start it: a warm server is the point
        forked_s, forked = await measure(server.execute, requests)
    finally:
        server.close()

    statuses = Counter(result.status.value for result in forked)
    print(f"sandbox, {len(requests)} programs (a function + 3 asserts; {dict(statuses)}), {CONCURRENCY} at a time")
    print(f"  interpreter per program {len(requests) / fresh_s:8.1f} programs/s ({fresh_s:.2f} s)")
    print(f"  fork server             {len(requests) / forked_s:8.1f} programs/s ({forked_s:.2f} s)")
    print(f"  fork server / interpreter per program: {fresh_s / forked_s:.1f}x")
    disagree = [i for i, (a, b) in enumerate(zip(fresh, forked)) if (a.status, a.tests) != (b.status, b.tests)]
    broken = [r.detail for r in fresh + forked if r.status is Status.infra_error]
    if disagree or broken:
        raise SystemExit(f"outcomes differ for programs {disagree}; sandbox failures: {broken[:3]}")


def main() -> None:
    asyncio.run(compare(programs(PROGRAMS)))


if __name__ == "__main__":
    main()
