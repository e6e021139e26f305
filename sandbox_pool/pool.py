"""Ray actors that run sandboxed programs, and the driver-side pool that spreads requests over them."""
from __future__ import annotations

import asyncio
import threading

import ray

from sandbox_pool.process_backend import ForkServer
from sandbox_pool.results import ExecutionRequest, ExecutionResult


@ray.remote
class SandboxExecutor:
    """Runs requests in process sandboxes on its node, at most `max_concurrency` at a time, all
    forked by its own fork server (which ends with the actor).

    An async actor: Ray lets it take many calls at once (up to 1000), and the semaphore, not
    Ray, decides how many programs run, so single calls and batches share the same slots.
    """

    def __init__(self, max_concurrency: int):
        self._slots = asyncio.Semaphore(max_concurrency)
        self._fork_server = ForkServer()

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        async with self._slots:
            return await self._fork_server.execute(request)


class SandboxPool:
    """A fixed set of SandboxExecutor actors; each request goes to the least-loaded one."""

    def __init__(self, num_executors: int, concurrency_per_executor: int, num_cpus_per_executor: float = 0.5):
        # The actor itself mostly waits; its programs' CPU use is not Ray's to schedule.
        self._executors = [
            SandboxExecutor.options(num_cpus=num_cpus_per_executor).remote(concurrency_per_executor)
            for _ in range(num_executors)
        ]
        self._in_flight: list[list[ray.ObjectRef]] = [[] for _ in self._executors]
        # The reward service scores several requests at once from worker threads.
        self._lock = threading.Lock()

    def submit(self, requests: list[ExecutionRequest]) -> list[ray.ObjectRef]:
        """Start every request; one ObjectRef of an ExecutionResult per request, in order."""
        with self._lock:
            self._forget_finished()
            refs = []
            for request in requests:
                least_loaded = min(range(len(self._executors)), key=lambda i: len(self._in_flight[i]))
                ref = self._executors[least_loaded].execute.remote(request)
                self._in_flight[least_loaded].append(ref)
                refs.append(ref)
            return refs

    def run(self, requests: list[ExecutionRequest]) -> list[ExecutionResult]:
        """Execute and wait; results in request order."""
        return ray.get(self.submit(requests))

    def shutdown(self) -> None:
        for executor in self._executors:
            ray.kill(executor)
        self._executors, self._in_flight = [], []

    def _forget_finished(self) -> None:
        for i, refs in enumerate(self._in_flight):
            if refs:
                _, self._in_flight[i] = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
