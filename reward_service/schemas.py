"""The HTTP (and handle) border of the reward service: requests, responses, the app's config."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from coderloo.tasksets.task import Task
from reward_service.weights import RewardWeights
from sandbox_pool import Limits, PoolSettings, Status

MAX_COMPLETION_CHARS = 64_000
MAX_TOKENS = 32_768


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RewardItem(Strict):
    task: Task | None = Field(None, description="The full task; or give task_id.")
    task_id: str | None = Field(None, min_length=1, description="Id of a task in the task sets the service was configured with.")
    completion: str = Field(max_length=MAX_COMPLETION_CHARS, description="The model's completion, as text.")
    completion_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, max_length=MAX_TOKENS, description="The completion's token ids; per-token rewards are returned when given."
    )

    @model_validator(mode="after")
    def _one_task(self) -> "RewardItem":
        if (self.task is None) == (self.task_id is None):
            raise ValueError("give exactly one of task and task_id")
        return self


class RewardRequest(Strict):
    items: list[RewardItem] = Field(min_length=1, description="Completions to score (at most the service's max_batch).")


class Components(BaseModel):
    syntax: float = Field(description="1 when the program parses and compiles, else 0.")
    functionality: float = Field(description="Fraction of the tests passed.")
    lint: float | None = Field(description="Lint penalty in [0, 1] before weighting; null when lint is off.")
    performance: float | None = Field(
        description="Reference run time over this run time, capped at 1 (0 when tests fail); "
        "null when off or when the reference fails."
    )


class Diagnostic(BaseModel):
    code: str
    message: str
    row: int = Field(description="1-based row in the program (the prompt included when the completion continues it).")
    column: int


class ItemReward(BaseModel):
    components: Components
    total: float = Field(description="The weighted sum of the components (lint subtracted).")
    passed: bool
    status: Status
    diagnostics: list[Diagnostic]
    feedback: str = Field(
        "", description="Why the program did not pass, for a model to rewrite it from: the error that ended the run "
        "or how many tests failed, then the first failing test and its error; empty when it passed."
    )
    token_rewards: list[float] | None = Field(description="One per completion token id; null when no token ids were given.")


class RewardResponse(BaseModel):
    items: list[ItemReward]


class AutoscalingSettings(Strict):
    min_replicas: int = Field(1, ge=1)
    max_replicas: int = Field(1, ge=1)
    target_ongoing_requests: float = Field(2.0, gt=0, description="Requests in flight per replica that Serve aims for.")

    @model_validator(mode="after")
    def _order(self) -> "AutoscalingSettings":
        if self.max_replicas < self.min_replicas:
            raise ValueError("max_replicas must be at least min_replicas")
        return self


class ServiceConfig(Strict):
    weights: RewardWeights = Field(default_factory=RewardWeights)
    limits: Limits = Field(default_factory=Limits, description="Resource limits of each program run.")
    sandbox_backend: Literal["process", "docker"] = Field(
        "process", description="process: sandboxes forked from a warm fork server (no Docker needed); docker: warm "
        "containers of the sandbox image (`make sandbox-image`).")
    min_executors: int = Field(1, ge=0, description="Sandbox executor actors each replica's pool keeps when idle.")
    max_executors: int | None = Field(
        None, ge=1, description="Most executors a replica's pool grows to with its queue (default: 4, or "
        "num_executors or min_executors where larger).")
    num_executors: int | None = Field(
        None, ge=0, description="Executors each replica starts with (between min and max; default min_executors).")
    concurrency_per_executor: int = Field(
        4, ge=1, description="Programs one executor runs at once; it asks Ray for as many units of the `sandbox` resource.")
    executor_idle_s: float = Field(60.0, gt=0, description="An executor idle this long is removed (down to min_executors).")
    synthetic_tasks: bool = Field(True, description="Look task ids up in the synthetic suite (all splits).")
    task_files: list[str] = Field(default_factory=list, description="JSONL task files (the one task format) for task ids.")
    tokenizer_path: str | None = Field(None, description="Tokenizer for per-token rewards (None: token ids are refused).")
    max_batch: int = Field(256, ge=1, description="Most items in one request (more: 413).")
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="Largest request body (more: 413).")
    replica_cpus: float = Field(0.5, gt=0, description="CPUs Ray reserves for each replica.")
    autoscaling: AutoscalingSettings = Field(default_factory=AutoscalingSettings)

    @model_validator(mode="after")
    def _pool(self) -> "ServiceConfig":
        self.pool_settings()  # an inconsistent pool (min over max, say) fails with the config
        return self

    def pool_settings(self) -> PoolSettings:
        return PoolSettings(
            backend=self.sandbox_backend, min_executors=self.min_executors,
            max_executors=self.max_executors or max(4, self.num_executors or 0, self.min_executors),
            initial_executors=self.num_executors, concurrency_per_executor=self.concurrency_per_executor,
            idle_s=self.executor_idle_s,
        )
