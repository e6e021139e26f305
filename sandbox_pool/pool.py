"""The Ray pool: executor actors that run sandboxed programs, and a dispatcher that queues requests,
spreads them over the executors, runs again what a dead executor had, and scales the executors
with the queue.

    pool = SandboxPool(PoolSettings(min_executors=1, max_executors=8, concurrency_per_executor=4))
    futures = pool.submit(requests)     # at once: one Future of an ExecutionResult per request
    results = [f.result() for f in futures]

Executors ask Ray for `concurrency_per_executor` units of the custom resource `sandbox` (one per
program they run at a time) and no CPU: on a cluster, nodes that offer `sandbox` (cluster.yaml's
CPU nodes) hold them, and when none has room left the autoscaler adds such a node. A local
cluster offers it too (coderloo.runtime.init_ray). Executors are named `coderloo-sandbox-<pool>-<n>`.

The dispatcher holds the queue. It runs in the process that made the pool (a reward-service
replica), on an event loop of its own in a thread of that process: a caller's requests reach it
without a Ray call, and the executors it starts are owned by that process, so they go with it.
Ray calls are batched, since one costs about as much CPU as a small program's run: it hands each
executor as many runs as the executor has slots and twice as many again (HELD_PER_SLOT), which
wait there behind its busy slots, and an executor answers with its ended runs' results once none
waits, several per call (`SandboxExecutor.run`). Each Future that `submit` returns is the
dispatcher's answer for one request, so a result is delivered once, whatever happens behind it:
when an executor dies, or stops answering (it holds a run that should have ended, with its wait
for a slot, its limit and the backend's margin, CALL_MARGIN_S ago: it is killed), the requests
it held, running or waiting, go back to the front of the queue and run on another executor; so
does a request whose executor answered `infra_error` (its sandbox failed, not the program). This
is the one retry of a sandbox failure: up to `MAX_ATTEMPTS` runs; after that, and for any other
failure of the machinery, the result is an `infra_error`, which callers refuse, and never score
as a failed program.

Scaling: when the requests queued (here or at an executor) and running exceed what the executors
(started or starting) can run at once, executors are added, up to `max_executors`; an executor
with nothing to do for `idle_s` is removed, down to `min_executors`.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import math
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Literal

import ray
from pydantic import BaseModel, ConfigDict, Field, model_validator

from common.config import Variant, with_default_variants
from common.cpus import CpuSet, pin_process
from sandbox_pool.process_backend import ANSWER_MARGIN_S, ForkServer
from sandbox_pool.results import ExecutionRequest, ExecutionResult, Status

NAME_PREFIX = "coderloo-sandbox-"
RESOURCE = "sandbox"
MAX_ATTEMPTS = 3  # runs of one request whose executor died or whose sandbox failed, before it is an infra_error
RETRY_START_S = (1.0, 30.0)  # after a failed start, wait this long (doubling per failure, up to the second) to try again
CALL_MARGIN_S = 30.0  # past a run's own limit and the backend's margin: the executor is stuck
# Runs an executor holds per slot: one in it and two waiting for it, so that its slots never wait for
# a round trip to the dispatcher and its results come back about 2 x `concurrency_per_executor` per
# call (at 2, twice the calls cost the pool about 0.03 of its programs/s, measured once against the fork
# servers alone: a Ray call costs about as much CPU as a small program).
HELD_PER_SLOT = 3
TICK_S = 1.0
RETIRE_S = 30.0  # an idle executor's close() may take this long before its actor is ended
HEALTH_CHECK = ExecutionRequest(program="def ok():\n    return 1\n", tests=["assert ok() == 1"])


class ProcessSandbox(Variant):
    """A fork server per executor; no Docker needed. Each run is held to its request's limits alone."""

    type: Literal["process"] = "process"
    weaker_isolation: bool = Field(
        False, description="run programs where the machine cannot give the sandbox every layer of its isolation "
        "(per-run cgroups, a PID namespace, a private root, the sandbox users, the syscall filter); without it the "
        "pool refuses to start there, naming what is missing. With it, every result lists what its run went "
        "without (`coderloo sandbox check` shows what a machine gives)")


class DockerSandbox(Variant):
    """Warm containers of the sandbox image (`make sandbox-image`), one per concurrent run, each
    held to limits of its own besides the request's: its run, the run's tester and the executor
    share them."""

    type: Literal["docker"] = "docker"
    memory_mb: int = Field(1024, ge=64, description="each container's memory, swap included")
    cpus: float = Field(1.0, gt=0, description="CPUs each container may use")
    pids: int = Field(128, ge=16, description="processes and threads in each container")
    tmpfs_mb: int = Field(64, ge=1, description="size of each container's /tmp and of its /dev/shm")
    runtime: str | None = Field(
        None, description="the Docker engine's OCI runtime for the containers (one registered with the engine), e.g. "
        "runsc: gVisor, a second kernel between the program and the host's; None: the engine's default (runc)")


SandboxBackend = Annotated[ProcessSandbox | DockerSandbox, Field(discriminator="type")]


class PoolSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: SandboxBackend = Field(
        default_factory=ProcessSandbox, description="process: a fork server per executor (no Docker needed); docker: "
        "warm containers of the sandbox image, one per concurrent run, with the containers' own limits")
    min_executors: int = Field(1, ge=0, description="executors kept even when idle")
    max_executors: int = Field(
        2, ge=1, description="most executors the pool scales up to (2 executors of 4 programs each keep a 2-core machine's "
        "cores busy, and more only start processes that wait for the same cores; a cluster preset raises it)")
    initial_executors: int | None = Field(
        None, ge=0, description="executors started with the pool (default: min_executors)")
    concurrency_per_executor: int = Field(4, ge=1, description="programs one executor runs at a time")
    cpus: CpuSet = Field(
        None, description="the CPUs each executor, its fork server and every run it forks are pinned to " + '(a cpuset list: "0", "0-3", "0,2"; common/cpus.py), so that one machine stands in for separate devices; null: any. A CPU the node lacks is refused before the run starts.')
    idle_s: float = Field(60.0, gt=0, description="an executor with nothing to do this long is removed")
    start_timeout_s: float = Field(
        300.0, gt=0, description="for a new executor to be placed (an autoscaler may have to add a node) and pass its "
        "health check")

    @model_validator(mode="before")
    @classmethod
    def _default_variant(cls, data):
        if isinstance(data, dict) and isinstance(data.get("backend"), str):  # the earlier shape, `backend: docker`
            raise ValueError(f"backend is a section: backend: {{type: {data['backend']}}} "
                             f"(an override: reward.pool.backend.type={data['backend']})")
        return with_default_variants(data, {"backend": ("type", "process")})

    @model_validator(mode="after")
    def _order(self) -> "PoolSettings":
        if self.max_executors < self.min_executors:
            raise ValueError("max_executors must be at least min_executors")
        if self.initial_executors is not None and not self.min_executors <= self.initial_executors <= self.max_executors:
            raise ValueError("initial_executors must lie between min_executors and max_executors")
        if self.cpus is not None and self.backend.type == "docker":
            raise ValueError("cpus pins the process backend's executors; Docker's containers take backend.cpus")
        return self


@ray.remote
class SandboxExecutor:
    """Runs requests on its node with one backend, at most `concurrency` at a time; the ones it
    holds past that wait for a slot, in the order they came.

    The dispatcher hands it runs and takes their results through `run`, many per Ray call: one
    call per program cost as much CPU as the program itself on a small machine (bench/results.md,
    reward_service)."""

    def __init__(self, backend: ProcessSandbox | DockerSandbox, concurrency: int, cpus: str | None = None):
        pin_process(cpus, "reward.pool.cpus")  # before the fork server starts: it and its runs inherit the set
        if backend.type == "docker":
            from sandbox_pool.docker_backend import DockerBackend

            self._backend = DockerBackend(concurrency, backend)  # DockerUnavailable fails the start, with the reason
        else:
            self._backend = ForkServer(weaker_isolation=backend.weaker_isolation)
        self._concurrency = concurrency
        self._slots = asyncio.Semaphore(concurrency)
        self._held = 0  # runs started whose results no call has handed back yet
        self._running: set[asyncio.Future] = set()  # (the event loop keeps only weak references to tasks)
        self._ended: dict[int, ExecutionResult] = {}  # by the dispatcher's key: ended, not handed back yet
        self._change: asyncio.Future | None = None  # set when a run ends: wakes the calls waiting in `run`

    async def ready(self) -> dict:
        """Run one small program: an executor whose sandbox does not work on its node never gets requests."""
        result = await self.execute(HEALTH_CHECK)
        if result.status is not Status.passed:
            raise RuntimeError(f"the sandbox does not work on this node: {result.status.value}: {result.detail}")
        return {"node": ray.get_runtime_context().get_node_id()}

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        async with self._slots:
            return await self._backend.execute(request)

    @ray.method(enable_task_events=False)
    async def run(self, requests: dict[int, ExecutionRequest]) -> dict[int, ExecutionResult]:
        """Start `requests` (by key; those past the free slots wait for one), then answer with the
        results of every run that has ended and whose result no call has handed back yet, once at
        least one has and no run waits for a slot; at once with none when it holds no run. The
        results of the runs that ended while others waited come back together, in one call, while
        its slots run the rest; a run that takes long holds back no result for longer than its
        waiting runs take to get a slot (nothing waits behind it for long: the dispatcher hands an
        executor no more than HELD_PER_SLOT runs per slot, ended ones included). Calls that overlap
        never hand back one result twice."""
        for key, request in requests.items():
            self._held += 1
            run = asyncio.ensure_future(self._answered(request))
            self._running.add(run)
            run.add_done_callback(lambda run, key=key: self._ended_run(key, run))
        while self._held:
            if self._ended and self._held - len(self._ended) <= self._concurrency:
                results, self._ended = self._ended, {}
                self._held -= len(results)
                return results
            if self._change is None:
                self._change = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._change)
        return {}

    def _ended_run(self, key: int, run: asyncio.Future) -> None:
        """A run ended: its result waits for a call to hand it back; the waiting calls look again
        (one wake-up each, rather than each call watching every run)."""
        self._running.discard(run)
        if run.cancelled():  # the actor is going away
            return
        self._ended[key] = run.result()
        change, self._change = self._change, None
        if change is not None:
            change.set_result(None)

    async def _answered(self, request: ExecutionRequest) -> ExecutionResult:
        """A backend answers every run with a result; should one raise all the same, the run is a sandbox failure."""
        try:
            return await self.execute(request)
        except Exception as e:
            return ExecutionResult.build(len(request.tests), Status.infra_error,
                                         f"sandbox executor failed: {type(e).__name__}: {e}")

    def close(self) -> None:
        self._backend.close()


@dataclass(eq=False)
class _Job:
    request: ExecutionRequest
    future: concurrent.futures.Future  # the caller's (SandboxPool.submit)
    attempts: int = 0
    lost_on: list[str] = field(default_factory=list)  # executors that died under it
    ends_by: float = 0.0  # (monotonic) when its executor's backend must have answered its run, with its wait for a slot


@dataclass(eq=False)
class _Executor:
    name: str
    handle: ray.actor.ActorHandle
    ready: bool = False
    running: dict[int, _Job] = field(default_factory=dict)  # by key (SandboxExecutor.run): in its slots or waiting there
    calls: int = 0  # its `run` calls in flight
    idle_since: float = field(default_factory=time.monotonic)


class _Dispatcher:
    """The pool's queue, executors and scaling (see the module's docstring). Every method runs on
    the pool's event loop, so no locks."""

    def __init__(self, settings: PoolSettings, pool_id: str):
        self.settings = settings
        self.pool_id = pool_id
        self.queue: collections.deque[_Job] = collections.deque()
        self.executors: dict[str, _Executor] = {}
        self.numbered = 0
        self.keys = itertools.count()  # of runs handed to executors
        self.start_failures = 0  # in a row
        self.retry_start_at = 0.0
        self.counts = dict.fromkeys(["delivered", "reruns", "executors_started", "executors_lost", "executors_removed"], 0)
        self.ticker: asyncio.Task | None = None
        self.closed = False
        self.gauges = _pool_gauges()

    async def started(self) -> None:
        """Start the ticker and the initial executors (without waiting for them)."""
        self.ticker = asyncio.ensure_future(self._tick())
        initial = self.settings.initial_executors
        for _ in range((self.settings.min_executors if initial is None else initial) - len(self.executors)):
            self._start_executor()

    def enqueue(self, requests: list[ExecutionRequest], futures: list[concurrent.futures.Future]) -> None:
        """Queue `requests`; each one's result goes to its future."""
        self.queue.extend(_Job(request, future) for request, future in zip(requests, futures, strict=True))
        self._dispatch()
        self._scale()

    async def stats(self) -> dict:
        running = self._in_slots()
        return {
            "executors": sorted(self.executors),
            "ready": sorted(name for name, e in self.executors.items() if e.ready),
            "queued": self._unfinished() - running,  # here, or at an executor behind its busy slots
            "running": running,
            **self.counts,
        }

    async def shutdown(self) -> None:
        self.closed = True
        if self.ticker is not None:
            self.ticker.cancel()
        executors, self.executors = list(self.executors.values()), {}
        for job in [*self.queue, *(job for e in executors for job in e.running.values())]:
            self._fail(job, "the sandbox pool was shut down")
        self.queue.clear()
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
        ).remote(s.backend, s.concurrency_per_executor, s.cpus)
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

    def _lost(self, executor: _Executor, why: str) -> None:
        """The executor died, is stuck, or a call to it failed: the runs it had go to another, first
        in line (they have waited longest), up to MAX_ATTEMPTS runs each."""
        if executor.name in self.executors:
            self.counts["executors_lost"] += 1
        self._drop(executor)
        jobs, executor.running = list(executor.running.values()), {}
        for job in reversed(jobs):
            job.lost_on.append(f"{executor.name} {why}")
            if job.attempts >= MAX_ATTEMPTS:
                self._fail(job, f"the request ran {job.attempts} times on executors that failed: " + "; ".join(job.lost_on))
            else:
                self.counts["reruns"] += 1
                self.queue.appendleft(job)

    # ---- requests ----

    def _dispatch(self) -> None:
        """Hand the executors runs from the queue, up to HELD_PER_SLOT per slot, spreading them (free
        slots first), with one call per executor."""
        ready = [e for e in self.executors.values() if e.ready]
        concurrency = self.settings.concurrency_per_executor
        handed: dict[_Executor, dict[int, ExecutionRequest]] = {}
        while self.queue and ready:
            executor = min(ready, key=lambda e: len(e.running))
            if len(executor.running) >= HELD_PER_SLOT * concurrency:
                break
            job = self.queue.popleft()
            if job.future.done():  # its caller went away
                continue
            job.attempts += 1
            # One that waits for a slot gets one by the time the runs in the slots now have all ended
            # (it waits behind fewer runs than there are slots).
            wait = max(_answer_within(j) for j in executor.running.values()) if len(executor.running) >= concurrency else 0.0
            job.ends_by = time.monotonic() + wait + _answer_within(job)
            key = next(self.keys)
            executor.running[key] = job
            handed.setdefault(executor, {})[key] = job.request
        for executor, requests in handed.items():
            self._call(executor, requests)

    def _call(self, executor: _Executor, requests: dict[int, ExecutionRequest]) -> None:
        executor.calls += 1
        asyncio.ensure_future(self._run(executor, requests))

    async def _run(self, executor: _Executor, requests: dict[int, ExecutionRequest]) -> None:
        """Hand `requests` to the executor and take the results it answers with (SandboxExecutor.run).
        While it has runs, at least one such call is in flight, so every result comes back. One
        that stops answering is found by the ticker (`_find_stuck`), which kills it: its calls fail."""
        try:
            results = await executor.handle.run.remote(requests)
        except Exception as e:
            self._lost(executor, "died" if isinstance(e, ray.exceptions.RayActorError) else f"failed: {_cause(e)}")
        else:
            for key, result in results.items():
                job = executor.running.pop(key, None)
                if job is None:  # the executor was lost meanwhile (its runs went to others)
                    continue
                if result.status == Status.infra_error and job.attempts < MAX_ATTEMPTS:
                    # the sandbox failed (not the program): the one retry of a sandbox failure is here
                    job.lost_on.append(f"{executor.name}: {result.detail}")
                    self.counts["reruns"] += 1
                    self.queue.appendleft(job)
                else:
                    self._finish(job, result)
            if not executor.running:
                executor.idle_since = time.monotonic()
        finally:
            executor.calls -= 1
        self._dispatch()
        if executor.running and not executor.calls:  # its runs' results are yet to come, with no new runs
            self._call(executor, {})
        self._scale()

    def _finish(self, job: _Job, result: ExecutionResult) -> None:
        try:
            job.future.set_result(result)
        except concurrent.futures.InvalidStateError:  # its caller cancelled it, or it was answered already
            return
        self.counts["delivered"] += 1

    def _fail(self, job: _Job, detail: str) -> None:
        """Finish with an infra_error: the machinery failed, not the program."""
        self._finish(job, ExecutionResult.build(len(job.request.tests), Status.infra_error, detail))

    # ---- scaling ----

    def _find_stuck(self) -> None:
        """An executor that holds a run its backend should have answered CALL_MARGIN_S ago is stuck
        (a run that ended comes back once no run waits: by the latest `ends_by` of those it holds)."""
        now = time.monotonic()
        for executor in list(self.executors.values()):
            if executor.running and now > max(job.ends_by for job in executor.running.values()) + CALL_MARGIN_S:
                self._lost(executor, "did not answer in time")
                self._dispatch()

    def _unfinished(self) -> int:
        """Requests queued here or held by an executor (in its slots or waiting there)."""
        return len(self.queue) + sum(len(e.running) for e in self.executors.values())

    def _in_slots(self, executors: list[_Executor] | None = None) -> int:
        """Runs in the executors' slots (or ended, their results on the way back)."""
        concurrency = self.settings.concurrency_per_executor
        return sum(min(len(e.running), concurrency) for e in (self.executors.values() if executors is None else executors))

    def _scale(self) -> None:
        if self.closed:
            return
        s = self.settings
        demand = self._unfinished()
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

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            self._find_stuck()
            self._scale()
            self._publish()

    def _publish(self) -> None:
        """The queue and the executors, on Ray's metrics endpoint (see coderloo.metrics)."""
        tags = {"pool": self.pool_id}
        ready = [e for e in self.executors.values() if e.ready]
        running = self._in_slots(ready)
        self.gauges["queue_depth"].set(self._unfinished() - running, tags=tags)
        self.gauges["running"].set(running, tags=tags)
        self.gauges["busy_executors"].set(sum(1 for e in ready if e.running), tags=tags)
        self.gauges["executors"].set(len(ready), tags={**tags, "state": "ready"})
        self.gauges["executors"].set(len(self.executors) - len(ready), tags={**tags, "state": "starting"})


class SandboxPool:
    """The handle on a pool (see the module's docstring): its dispatcher runs on an event loop in a
    thread of this process, from here until `shutdown`."""

    def __init__(self, settings: PoolSettings | None = None):
        self.settings = settings or PoolSettings()
        self.pool_id = uuid.uuid4().hex[:8]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"sandbox-pool-{self.pool_id}", daemon=True)
        self._thread.start()
        self._dispatcher = _Dispatcher(self.settings, self.pool_id)
        self._on_loop(self._dispatcher.started())

    def _on_loop(self, work):
        """Run a coroutine on the pool's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    def submit(self, requests: list[ExecutionRequest]) -> list[concurrent.futures.Future]:
        """Queue every request; one Future of an ExecutionResult per request, in order."""
        futures = [concurrent.futures.Future() for _ in requests]
        if requests:
            self._loop.call_soon_threadsafe(self._dispatcher.enqueue, list(requests), futures)
        return futures

    def run(self, requests: list[ExecutionRequest]) -> list[ExecutionResult]:
        """Execute and wait; results in request order."""
        return [future.result() for future in self.submit(requests)]

    def stats(self) -> dict:
        """Executors (all, ready), requests queued and running, and counters: delivered, reruns,
        executors_started, executors_lost, executors_removed."""
        return self._on_loop(self._dispatcher.stats())

    def shutdown(self) -> None:
        """End the executors; requests still queued get an infra_error. The pool's thread ends."""
        if self._loop.is_closed():
            return
        try:
            self._on_loop(self._dispatcher.shutdown())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
            if not self._thread.is_alive():
                self._loop.close()


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


def _answer_within(job: _Job) -> float:
    """Seconds a backend takes at most to answer a run of `job` that it has started."""
    return job.request.effective_limits.wall_timeout_s + ANSWER_MARGIN_S


def _cause(error: Exception) -> str:
    cause = getattr(error, "cause", None) or error
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[-1] if text else ''}"
