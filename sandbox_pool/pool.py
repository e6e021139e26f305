"""The Ray pool: executor actors that run sandboxed programs, and a dispatcher that queues requests,
spreads them over the executors, runs again what a dead executor had, and scales the executors
with the queue.

    pool = SandboxPool(PoolSettings(min_executors=1, max_executors=8, concurrency_per_executor=4))
    refs = pool.submit(requests)        # at once: one ObjectRef of an ExecutionResult per request
    results = ray.get(refs)

Executors ask Ray for `concurrency_per_executor` units of the custom resource `sandbox` (one per
program they run at a time) and no CPU: on a cluster, nodes that offer `sandbox` (cluster.yaml's
CPU nodes) hold them, and when none has room left the autoscaler adds such a node. A local
cluster offers it too (coderloo.runtime.init_ray). Executors are named `coderloo-sandbox-<pool>-<n>`.

The dispatcher (an async actor, one per pool, owned by the process that made the pool) holds the
queue. Each ObjectRef that `submit` returns is the dispatcher's answer for one request, so a
result is delivered once, whatever happens behind it: when an executor dies, or stops answering
(its call gets no answer within the run's limit plus a margin: it is killed), its in-flight
requests go back to the front of the queue and run on another executor; so does a request whose
executor answered `infra_error` (its sandbox failed, not the program). This is the one retry of
a sandbox failure: up to `MAX_ATTEMPTS` runs; after that, and for any other failure of the
machinery, the result is an `infra_error`, which callers refuse, and never score as a failed
program.

Scaling: when the requests queued and running exceed what the executors (started or starting)
can run at once, executors are added, up to `max_executors`; an executor with nothing to do for
`idle_s` is removed, down to `min_executors`.
"""
from __future__ import annotations

import asyncio
import collections
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Literal

import ray
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandbox_pool.process_backend import ANSWER_MARGIN_S, ForkServer
from sandbox_pool.results import ExecutionRequest, ExecutionResult, Status

NAME_PREFIX = "coderloo-sandbox-"
RESOURCE = "sandbox"
MAX_ATTEMPTS = 3  # runs of one request whose executor died or whose sandbox failed, before it is an infra_error
RETRY_START_S = (1.0, 30.0)  # after a failed start, wait this long (doubling per failure, up to the second) to try again
CALL_MARGIN_S = 30.0  # past a run's own limit and the backend's margin: the executor is stuck
TICK_S = 1.0
RETIRE_S = 30.0  # an idle executor's close() may take this long before its actor is ended
HEALTH_CHECK = ExecutionRequest(program="def ok():\n    return 1\n", tests=["assert ok() == 1"])


class PoolSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: Literal["process", "docker"] = Field(
        "process", description="process: a fork server per executor (no Docker needed); docker: warm containers of "
        "the sandbox image (`make sandbox-image`), one per concurrent run")
    min_executors: int = Field(1, ge=0, description="executors kept even when idle")
    max_executors: int = Field(4, ge=1, description="most executors the pool scales up to")
    initial_executors: int | None = Field(
        None, ge=0, description="executors started with the pool (default: min_executors)")
    concurrency_per_executor: int = Field(4, ge=1, description="programs one executor runs at a time")
    idle_s: float = Field(60.0, gt=0, description="an executor with nothing to do this long is removed")
    start_timeout_s: float = Field(
        300.0, gt=0, description="for a new executor to be placed (an autoscaler may have to add a node) and pass its "
        "health check")

    @model_validator(mode="after")
    def _order(self) -> "PoolSettings":
        if self.max_executors < self.min_executors:
            raise ValueError("max_executors must be at least min_executors")
        if self.initial_executors is not None and not self.min_executors <= self.initial_executors <= self.max_executors:
            raise ValueError("initial_executors must lie between min_executors and max_executors")
        return self


@ray.remote
class SandboxExecutor:
    """Runs requests on its node with one backend, at most `concurrency` at a time."""

    def __init__(self, backend: str, concurrency: int):
        if backend == "docker":
            from sandbox_pool.docker_backend import DockerBackend

            self._backend = DockerBackend(containers=concurrency)  # DockerUnavailable fails the start, with the reason
        else:
            self._backend = ForkServer()
        self._slots = asyncio.Semaphore(concurrency)

    async def ready(self) -> dict:
        """Run one small program: an executor whose sandbox does not work on its node never gets requests."""
        result = await self.execute(HEALTH_CHECK)
        if result.status is not Status.passed:
            raise RuntimeError(f"the sandbox does not work on this node: {result.status.value}: {result.detail}")
        return {"node": ray.get_runtime_context().get_node_id()}

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        async with self._slots:
            return await self._backend.execute(request)

    def close(self) -> None:
        self._backend.close()


@dataclass(eq=False)
class _Job:
    request: ExecutionRequest
    future: asyncio.Future
    attempts: int = 0
    lost_on: list[str] = field(default_factory=list)  # executors that died under it


@dataclass(eq=False)
class _Executor:
    name: str
    handle: ray.actor.ActorHandle
    ready: bool = False
    running: set = field(default_factory=set)
    idle_since: float = field(default_factory=time.monotonic)


@ray.remote
class PoolDispatcher:
    """The pool's queue, executors and scaling (see the module's docstring). An async actor: one
    event loop, so no locks."""

    def __init__(self, settings: PoolSettings, pool_id: str):
        self.settings = settings
        self.pool_id = pool_id
        self.queue: collections.deque[_Job] = collections.deque()
        self.executors: dict[str, _Executor] = {}
        self.numbered = 0
        self.start_failures = 0  # in a row
        self.retry_start_at = 0.0
        self.counts = dict.fromkeys(["delivered", "reruns", "executors_started", "executors_lost", "executors_removed"], 0)
        self.ticker: asyncio.Task | None = None
        self.closed = False
        self.gauges = _pool_gauges()

    async def started(self) -> None:
        """Start the initial executors (without waiting for them)."""
        self._tick_in_background()
        initial = self.settings.initial_executors
        # Requests may have come first (Ray keeps a caller's order, but not across callers).
        for _ in range((self.settings.min_executors if initial is None else initial) - len(self.executors)):
            self._start_executor()

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        self._tick_in_background()
        job = _Job(request, asyncio.get_running_loop().create_future())
        self.queue.append(job)
        self._dispatch()
        self._scale()
        result = await job.future
        self.counts["delivered"] += 1
        return result

    async def stats(self) -> dict:
        return {
            "executors": sorted(self.executors),
            "ready": sorted(name for name, e in self.executors.items() if e.ready),
            "queued": len(self.queue),
            "running": sum(len(e.running) for e in self.executors.values()),
            **self.counts,
        }

    async def shutdown(self) -> None:
        self.closed = True
        if self.ticker is not None:
            self.ticker.cancel()
        for job in self.queue:
            self._fail(job, "the sandbox pool was shut down")
        self.queue.clear()
        executors, self.executors = list(self.executors.values()), {}
        closing = [e.handle.close.remote() for e in executors if e.ready]
        if closing:
            await asyncio.wait([asyncio.ensure_future(ref) for ref in closing], timeout=30)
        for e in executors:
            ray.kill(e.handle)

    # ---- executors ----

    def _start_executor(self) -> None:
        name = f"{NAME_PREFIX}{self.pool_id}-{self.numbered}"
        self.numbered += 1
        s = self.settings
        handle = SandboxExecutor.options(
            name=name, num_cpus=0, resources={RESOURCE: s.concurrency_per_executor}, max_restarts=0,
        ).remote(s.backend, s.concurrency_per_executor)
        executor = _Executor(name, handle)
        self.executors[name] = executor
        self.counts["executors_started"] += 1
        asyncio.ensure_future(self._await_ready(executor))

    async def _await_ready(self, executor: _Executor) -> None:
        timeout = self.settings.start_timeout_s
        try:
            await asyncio.wait_for(executor.handle.ready.remote(), timeout)
        except Exception as e:
            if isinstance(e, asyncio.TimeoutError):
                error = (f"executor {executor.name} did not start within {timeout:g} s: does the cluster offer the "
                         f"`{RESOURCE}` resource ({ray.cluster_resources().get(RESOURCE, 0):g} units now, "
                         f"{self.settings.concurrency_per_executor} needed)?")
            else:
                error = f"executor {executor.name} failed to start: {_cause(e)}"
            self._drop(executor)
            self.start_failures += 1
            low, high = RETRY_START_S
            self.retry_start_at = time.monotonic() + min(high, low * 2 ** (self.start_failures - 1))
            if not self.executors:  # none works and none is on its way: the queue would wait forever
                while self.queue:
                    job = self.queue.popleft()
                    self._fail(job, f"no sandbox executor could start: {error}")
            return
        if executor.name not in self.executors:  # removed while it started
            return
        self.start_failures = 0
        executor.ready = True
        executor.idle_since = time.monotonic()
        self._dispatch()

    def _drop(self, executor: _Executor) -> None:
        """Forget an executor and make sure it is gone."""
        if self.executors.pop(executor.name, None) is not None:
            ray.kill(executor.handle)

    def _lost(self, executor: _Executor) -> None:
        if executor.name in self.executors:
            self.counts["executors_lost"] += 1
        self._drop(executor)

    # ---- requests ----

    def _dispatch(self) -> None:
        ready = [e for e in self.executors.values() if e.ready]
        while self.queue and ready:
            executor = min(ready, key=lambda e: len(e.running))
            if len(executor.running) >= self.settings.concurrency_per_executor:
                return
            job = self.queue.popleft()
            if job.future.done():  # its caller went away
                continue
            executor.running.add(job)
            asyncio.ensure_future(self._run(job, executor))

    async def _run(self, job: _Job, executor: _Executor) -> None:
        job.attempts += 1
        limit = job.request.limits.wall_timeout_s + ANSWER_MARGIN_S + CALL_MARGIN_S
        ref = executor.handle.execute.remote(job.request)
        try:
            result = await asyncio.wait_for(ref, limit)
            if result.status == Status.infra_error and job.attempts < MAX_ATTEMPTS:
                # the sandbox failed (not the program): the one retry of a sandbox failure is here
                job.lost_on.append(f"{executor.name}: {result.detail}")
                self.counts["reruns"] += 1
                self.queue.appendleft(job)
            else:
                self._finish(job, result)
        except (ray.exceptions.RayActorError, asyncio.TimeoutError) as e:
            why = "did not answer in time" if isinstance(e, asyncio.TimeoutError) else "died"
            job.lost_on.append(f"{executor.name} {why}")
            self._lost(executor)
            if job.attempts >= MAX_ATTEMPTS:
                self._fail(job, f"the request ran {job.attempts} times on executors that failed: "
                           + "; ".join(job.lost_on))
            else:
                self.counts["reruns"] += 1
                self.queue.appendleft(job)  # first in line: it has waited longest
        except Exception as e:  # the executor's own failure, not the program's
            self._fail(job, f"sandbox executor {executor.name} failed: {_cause(e)}")
        finally:
            executor.running.discard(job)
            if not executor.running:
                executor.idle_since = time.monotonic()
        self._dispatch()
        self._scale()

    def _finish(self, job: _Job, result: ExecutionResult) -> None:
        if not job.future.done():
            job.future.set_result(result)

    def _fail(self, job: _Job, detail: str) -> None:
        """Finish with an infra_error: the machinery failed, not the program."""
        self._finish(job, ExecutionResult.build(len(job.request.tests), Status.infra_error, detail))

    # ---- scaling ----

    def _scale(self) -> None:
        if self.closed:
            return
        s = self.settings
        demand = len(self.queue) + sum(len(e.running) for e in self.executors.values())
        wanted = max(s.min_executors, math.ceil(demand / s.concurrency_per_executor))
        if time.monotonic() >= self.retry_start_at:
            for _ in range(min(wanted, s.max_executors) - len(self.executors)):
                self._start_executor()
        if self.queue:
            return
        now = time.monotonic()
        for executor in list(self.executors.values()):
            if len(self.executors) <= s.min_executors:
                break
            if executor.ready and not executor.running and now - executor.idle_since >= s.idle_s:
                self.counts["executors_removed"] += 1
                self.executors.pop(executor.name)
                asyncio.ensure_future(self._retire(executor))

    @staticmethod
    async def _retire(executor: _Executor) -> None:
        """Close an idle executor, then end its actor: its resources are free at once (on a cluster,
        its node can go idle and be removed) and not when a timer fires."""
        try:
            await asyncio.wait_for(executor.handle.close.remote(), RETIRE_S)
        except (ray.exceptions.RayError, asyncio.TimeoutError):
            pass  # it is ended below all the same
        ray.kill(executor.handle)

    def _tick_in_background(self) -> None:
        if self.ticker is None:
            self.ticker = asyncio.ensure_future(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            self._scale()
            self._publish()

    def _publish(self) -> None:
        """The queue and the executors, on Ray's metrics endpoint (see coderloo.metrics)."""
        tags = {"pool": self.pool_id}
        ready = [e for e in self.executors.values() if e.ready]
        self.gauges["queue_depth"].set(len(self.queue), tags=tags)
        self.gauges["running"].set(sum(len(e.running) for e in ready), tags=tags)
        self.gauges["busy_executors"].set(sum(1 for e in ready if e.running), tags=tags)
        self.gauges["executors"].set(len(ready), tags={**tags, "state": "ready"})
        self.gauges["executors"].set(len(self.executors) - len(ready), tags={**tags, "state": "starting"})


class SandboxPool:
    """The driver's handle on a pool (see the module's docstring)."""

    def __init__(self, settings: PoolSettings | None = None):
        self.settings = settings or PoolSettings()
        self.pool_id = uuid.uuid4().hex[:8]
        # A dispatcher takes any number of requests at once: the queue is its own, not Ray's.
        self._dispatcher = PoolDispatcher.options(num_cpus=0, max_concurrency=1_000_000).remote(self.settings, self.pool_id)
        self._dispatcher.started.remote()  # a caller's calls reach an actor in order: before any request

    def submit(self, requests: list[ExecutionRequest]) -> list[ray.ObjectRef]:
        """Queue every request; one ObjectRef of an ExecutionResult per request, in order."""
        return [self._dispatcher.execute.remote(request) for request in requests]

    def run(self, requests: list[ExecutionRequest]) -> list[ExecutionResult]:
        """Execute and wait; results in request order."""
        return ray.get(self.submit(requests))

    def stats(self) -> dict:
        """Executors (all, ready), requests queued and running, and counters: delivered, reruns,
        executors_started, executors_lost, executors_removed."""
        return ray.get(self._dispatcher.stats.remote())

    def shutdown(self) -> None:
        ray.get(self._dispatcher.shutdown.remote())
        ray.kill(self._dispatcher)


def _pool_gauges() -> dict:
    from ray.util.metrics import Gauge

    def gauge(name: str, description: str, *extra_tags: str) -> Gauge:
        return Gauge(f"coderloo_sandbox_{name}", description=description, tag_keys=("pool", *extra_tags))

    return {
        "queue_depth": gauge("queue_depth", "Requests waiting for a free sandbox slot."),
        "running": gauge("running", "Programs running in the sandboxes now."),
        "busy_executors": gauge("busy_executors", "Executors running at least one program."),
        "executors": gauge("executors", "Executors, by state (ready, starting).", "state"),
    }


def _cause(error: Exception) -> str:
    cause = getattr(error, "cause", None) or error
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[-1] if text else ''}"
