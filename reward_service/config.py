"""The reward service's section of the config: weights, sandbox limits and pool, replicas."""
from __future__ import annotations

from pydantic import Field, model_validator

from common.config import Section
from common.cpus import CpuSet
from reward_service.components import ComponentSpec
from reward_service.weights import RewardWeights
from sandbox_pool import Limits, PoolSettings


class AutoscalingSettings(Section):
    min_replicas: int = Field(1, ge=1)
    max_replicas: int = Field(1, ge=1)
    target_ongoing_requests: float = Field(2.0, gt=0, description="Requests in flight per replica that Serve aims for.")

    @model_validator(mode="after")
    def _order(self) -> "AutoscalingSettings":
        if self.max_replicas < self.min_replicas:
            raise ValueError("max_replicas must be at least min_replicas")
        return self


class ServiceConfig(Section):
    weights: RewardWeights = Field(default_factory=RewardWeights)
    components: list[ComponentSpec] = Field(
        default_factory=list, description="Reward components a domain plugs in (reward_service/components.py): each a "
        "callable named by its import path, asked for a score in [0, 1] of every program after its run, weighed into "
        "the total; one that raises or answers late fails the request naming it.")
    limits: Limits = Field(default_factory=Limits, description="Resource limits of each program run.")
    pool: PoolSettings = Field(default_factory=PoolSettings, description="Each replica's sandbox pool: backend, executors, scaling.")
    task_files: list[str] = Field(
        default_factory=list, description="JSONL task files (the one task format, e.g. from `coderloo tasks`) whose "
        "tasks requests may name by task_id.")
    cpus: CpuSet = Field(None, description="The CPUs each replica's process is pinned to " + '(a cpuset list: "0", "0-3", "0,2"; common/cpus.py), so that one machine stands in for separate devices; null: any. A CPU the node lacks is refused before the run starts.')
    tokenizer_path: str | None = Field(None, description="Tokenizer for per-token rewards (None: token ids are refused).")
    max_batch: int = Field(256, ge=1, description="Most items in one request (more: 413).")
    client_batch_items: int = Field(
        64, ge=1, description="The trainer's handle sends the items of the submits it gets within `client_linger_ms` of "
        "each other as one request of at most this many (and max_batch): a Serve request (the caller's router, the "
        "replica, the pool) costs about as much as a small program's run (bench/results.md, reward_service, which "
        "derives it). Several requests of a step still spread over the replicas.")
    client_linger_ms: float = Field(
        5.0, ge=0, description="How long a submit's items wait for others to join their request (0: each submit is "
        "sent at once, in requests of its own); `collect` sends a waiting request at once.")
    run_code_max_memory_mb: int = Field(
        4096, ge=1, description="The most memory a SandboxFusion /run_code request may ask (memory_limit_MB); more is "
        "refused (422). Its default, -1, takes limits.memory_mb.")
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="Largest request body (more: 413).")
    replica_cpus: float = Field(0.5, gt=0, description="CPUs Ray reserves for each replica.")
    autoscaling: AutoscalingSettings = Field(default_factory=AutoscalingSettings)
    request_timeout_s: float = Field(
        300.0, gt=0, description="A request (through the trainer's handle) not answered in this time is cancelled and sent "
        "again, as one whose replica died: a replica that hangs fails Serve's health check and is replaced.")
    health_check_period_s: float = Field(10.0, gt=0, description="How often Serve checks that each replica answers.")
    health_check_timeout_s: float = Field(
        30.0, gt=0, description="A replica that does not answer its health check in this time is replaced.")
    max_ongoing_requests: int = Field(
        64, ge=1, description="Requests one replica takes at once (its scoring threads, as many as its thread pool has, "
        "work through them; their programs wait in its sandbox pool's queue); the rest wait in their caller's queue. "
        "At least a training step's requests (one per prompt): a caller's Serve router sends a waiting request again "
        "and again to a full replica, which refuses it, each time a Ray call on both sides (at Serve's default of 5 "
        "the trainer's 32 requests drew 4.4 refusals each, and the service scored at 0.5x of its sandbox's speed).")
    max_queued_requests: int = Field(
        256, ge=1, description="Requests each caller (the HTTP proxy; each handle, e.g. the trainer's) holds waiting for a "
        "replica; more are refused: HTTP 503 with Retry-After, a handle's BackPressureError (RewardClient waits and sends "
        "again). Above a training step's requests (one per prompt), so the trainer is not refused at its normal load.")
    retry_after_s: int = Field(
        1, ge=1, description="Seconds a 503 tells its client to wait (Retry-After): a full queue, or failing sandboxes.")

    @model_validator(mode="after")
    def _distinct_components(self) -> "ServiceConfig":
        names = [c.name for c in self.components]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"components: {', '.join(twice)} named more than once")
        return self
