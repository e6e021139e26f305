"""The reward service as a Ray Serve application: FastAPI over HTTP, and `score` (and `run`, the
code interpreter) for a DeploymentHandle (the controller's path, no HTTP).

    handle = serve.run(build_app(ServiceConfig()), name="rewards", route_prefix="/")
    response = handle.score.remote(RewardRequest(items=[...])).result()

`deploy` serves it with SandboxFusion's /run_code in front of it (reward_service.fusion).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from ray import serve
from ray.serve.config import BackpressureConfig
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common.cpus import pin_process
from reward_service.attribution import token_rewards
from reward_service.config import ServiceConfig
from reward_service.fusion import SandboxFusion
from reward_service.interpreter import run_request, run_results
from reward_service.peers import OpenRLHFRequest, OpenRLHFResponse, label_task, openrlhf_response
from reward_service.schemas import RewardRequest, RewardResponse, RunRequest, RunResponse
from reward_service.components import ComponentError
from reward_service.scorer import RewardScorer, SandboxInfraError
from reward_service.tasks import Task, load_jsonl
from sandbox_pool import ExecutionRequest, ExecutionResult, SandboxPool

Answer = TypeVar("Answer")
RUN_CODE_ONGOING = 4096  # /run_code requests one front replica holds at once (each an await)


class BodyLimit:
    """413 before parsing: a body over the replica's `max_body_bytes` never reaches the JSON parser.
    A declared one is refused unread; one without a Content-Length (chunked) is counted as it
    arrives and refused at the limit, so the replica never holds more of it than the limit."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = scope["app"].state.max_body_bytes
        too_large = JSONResponse({"detail": f"request body over {limit} bytes"}, status_code=413)
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit():  # the server passes on no more than declared
            return await (too_large if int(declared) > limit else self.app)(scope, receive, send)
        messages: list[Message] = []
        size = 0
        while not messages or (messages[-1]["type"] == "http.request" and messages[-1].get("more_body", False)):
            messages.append(await receive())
            size += len(messages[-1].get("body", b""))
            if size > limit:
                return await too_large(scope, receive, send)
        replay = iter(messages)

        async def replayed() -> Message:
            return next(replay, None) or await receive()

        await self.app(scope, replayed, send)


app = FastAPI(title="coderloo reward service", version="1")
app.add_middleware(BodyLimit)


class Metrics:
    """Prometheus metrics of one replica (GET /metrics answers for the replica that serves it)."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("reward_requests", "Scoring requests", ["path", "code"], registry=self.registry)
        self.latency = Histogram(
            "reward_request_seconds", "Latency of scoring requests", ["path"], registry=self.registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.outcomes = Counter("reward_item_outcomes", "Scored items by sandbox status", ["status"], registry=self.registry)


@serve.deployment
@serve.ingress(app)
class RewardService:
    def __init__(self, config: ServiceConfig):
        pin_process(config.cpus, "reward.cpus")
        self.config = config
        app.state.max_body_bytes = config.max_body_bytes
        self.tasks: dict[str, Task] = {t.id: t for path in config.task_files for t in load_jsonl(path)}
        self.tokenizer = None
        if config.tokenizer_path:
            from common.hf import load_tokenizer

            self.tokenizer = load_tokenizer(config.tokenizer_path)
        self.pool = SandboxPool(config.pool)
        self.scorer = RewardScorer(self.pool, config.limits, weights=config.weights, components=config.components)
        self.metrics = Metrics()
        self.threads = asyncio.Semaphore(config.max_ongoing_requests)

    def _resolve(self, request: RewardRequest | RunRequest) -> list[Task]:
        """Each item's task; a bad request raises HTTPException (4xx) before anything runs."""
        if len(request.items) > self.config.max_batch:
            raise HTTPException(413, f"batch of {len(request.items)} items is over the limit of {self.config.max_batch}")
        tasks = []
        for i, item in enumerate(request.items):
            task = item.task or self.tasks.get(item.task_id)
            if task is None:
                raise HTTPException(404, f"items[{i}]: unknown task id {item.task_id!r}")
            tasks.append(task)
        return tasks

    def _check_token_ids(self, request: RewardRequest) -> None:
        for i, item in enumerate(request.items):
            if item.completion_token_ids is not None and self.tokenizer is None:
                raise HTTPException(422, f"items[{i}]: completion_token_ids given, but the service has no tokenizer")
            if item.completion_token_ids and max(item.completion_token_ids) >= len(self.tokenizer):
                raise HTTPException(
                    422, f"items[{i}]: completion_token_ids holds {max(item.completion_token_ids)}, over the vocabulary of {len(self.tokenizer)}"
                )

    def _score(self, request: RewardRequest, tasks: list[Task]) -> RewardResponse:
        rewards = self.scorer.score(tasks, [item.completion for item in request.items])
        for task, item, r in zip(tasks, request.items, rewards):
            if item.completion_token_ids is not None:
                r.token_rewards, r.token_penalties = token_rewards(task, item.completion, r, item.completion_token_ids, self.tokenizer,
                                                                   self.config.weights, self.config.components)
            self.metrics.outcomes.labels(r.status.value).inc()
        return RewardResponse(items=rewards)

    async def _in_thread(self, work: Callable[..., Answer], *args) -> Answer:
        """`work(*args)` in a thread (it blocks on the pool), so the replica keeps answering health
        checks and other requests meanwhile. A thread cannot be cancelled: when an HTTP client
        disconnects, Serve cancels its request and frees its slot, but the thread runs on. Each
        thread holds one of `threads` until it ends, so however many clients leave, the replica
        runs at most `max_ongoing_requests` of them and new work waits here, not in a backlog."""
        await self.threads.acquire()
        thread = asyncio.get_running_loop().run_in_executor(None, work, *args)
        thread.add_done_callback(lambda _: self.threads.release())
        return await asyncio.shield(thread)

    async def score(self, request: RewardRequest) -> RewardResponse:
        """Score a batch (the handle's entry point), in a thread (`_in_thread`)."""
        tasks = self._resolve(request)
        self._check_token_ids(request)
        return await self._in_thread(self._score, request, tasks)

    def _run(self, request: RunRequest, tasks: list[Task]) -> RunResponse:
        limits = self.config.limits
        requests = [run_request(item.program, item.stdin, t.language, t.run_limits(limits)) for t, item in zip(tasks, request.items, strict=True)]
        results = self.pool.run(requests)
        return RunResponse(items=run_results(tasks, results, limits))

    async def run(self, request: RunRequest) -> RunResponse:
        """Run each program once with no tests, for what it printed and how it ended (the code
        interpreter; the handle's entry point). In a thread, as `score`."""
        return await self._in_thread(self._run, request, self._resolve(request))

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        """Run one sandbox request in this replica's pool (SandboxFusion's /run_code; the handle's
        entry point only: its caller checked the request). In a thread, as `score`."""
        return (await self._in_thread(self.pool.run, [request]))[0]

    async def _answer(self, path: str, answer: Awaitable[Answer]) -> Answer:
        """An HTTP route's answer, with its metrics; a sandbox or plugged-in component failure is a 503 with Retry-After."""
        start, code = time.perf_counter(), 200
        try:
            return await answer
        except HTTPException as e:
            code = e.status_code
            raise
        except (SandboxInfraError, ComponentError) as e:
            code = 503
            raise HTTPException(503, str(e), headers={"Retry-After": str(self.config.retry_after_s)}) from None
        except asyncio.CancelledError:
            code = 499  # the client went away (Serve's code for it)
            raise
        finally:
            self.metrics.requests.labels(path, str(code)).inc()
            self.metrics.latency.labels(path).observe(time.perf_counter() - start)

    @app.post("/v1/rewards", response_model=RewardResponse)
    async def rewards(self, request: RewardRequest) -> RewardResponse:
        return await self._answer("/v1/rewards", self.score(request))

    def _openrlhf_tasks(self, request: OpenRLHFRequest) -> list[Task]:
        if len(request.query) > self.config.max_batch:
            raise HTTPException(413, f"batch of {len(request.query)} queries is over the limit of {self.config.max_batch}")
        try:
            return [label_task(label, f"labels[{i}]", prompt, self.tasks)
                    for i, (label, prompt) in enumerate(zip(request.labels, request.prompts))]
        except ValueError as e:
            raise HTTPException(422, str(e)) from None

    async def openrlhf(self, request: OpenRLHFRequest) -> OpenRLHFResponse:
        tasks = self._openrlhf_tasks(request)
        rewards = await self._in_thread(self.scorer.score, tasks, request.responses())
        for r in rewards:
            self.metrics.outcomes.labels(r.status.value).inc()
        return openrlhf_response(rewards)

    @app.post("/v1/openrlhf", response_model=OpenRLHFResponse)
    async def openrlhf_rewards(self, request: OpenRLHFRequest) -> OpenRLHFResponse:
        """OpenRLHF's remote reward protocol (reward_service.peers); a sandbox failure is a 503, which it retries."""
        return await self._answer("/v1/openrlhf", self.openrlhf(request))

    @app.post("/v1/run", response_model=RunResponse)
    async def interpret(self, request: RunRequest) -> RunResponse:
        return await self._answer("/v1/run", self.run(request))

    @app.get("/v1/ping")
    async def ping(self) -> str:
        """SandboxFusion's liveness check."""
        return "pong"

    @app.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus(self) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def deployment_options(config: ServiceConfig) -> dict:
    """Serve options of the deployment: replicas autoscale on requests in flight per replica;
    Serve's health check replaces one that stops answering; a bounded queue. Serve holds each
    caller's requests (the HTTP proxy's, a handle's) while every replica has
    `max_ongoing_requests` in flight, up to `max_queued_requests`; past that it refuses them at
    once: over HTTP a 503 whose Retry-After header is set here (none without it), through a handle
    a BackPressureError. Refused at the caller, a request costs the replicas nothing."""
    return {
        "autoscaling_config": config.autoscaling.model_dump(),
        "ray_actor_options": {"num_cpus": config.replica_cpus},
        "health_check_period_s": config.health_check_period_s,
        "health_check_timeout_s": config.health_check_timeout_s,
        "max_ongoing_requests": config.max_ongoing_requests,
        "max_queued_requests": config.max_queued_requests,
        "backpressure_config": BackpressureConfig(status_code=503, retry_after_s=config.retry_after_s),
    }


def build_app(config: ServiceConfig):
    """The Serve application, with its replicas, autoscaling and queue from the config."""
    return RewardService.options(**deployment_options(config)).bind(config)


def deploy(config: ServiceConfig, name: str = "rewards") -> serve.handle.DeploymentHandle:
    """The service at / and, in front of its replicas, SandboxFusion's POST /run_code (its own small
    deployment: reward_service.fusion), on the running Serve instance's HTTP proxy. Returns the
    service's handle."""
    handle = serve.run(build_app(config), name=name, route_prefix="/")
    # It only waits on the replicas: no CPU of its own, and room for every client's request, so
    # that a full queue is the replicas' (answered 504), never its own (Serve's 503).
    fusion = SandboxFusion.options(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=RUN_CODE_ONGOING,
                                   max_queued_requests=-1)
    serve.run(fusion.bind(name, config.limits, config.run_code_max_memory_mb, config.max_body_bytes), name=f"{name}-run-code",
              route_prefix="/run_code")
    return handle
