"""The rollout worker actor: one generation backend, versioned weights."""
from __future__ import annotations

import os

import ray
import torch

from common.cpus import pin_process
from common.memory import limit_own_memory
from common.placement import placement_options
from common.weight_sync import BucketPlan
from rollout_workers.types import GenerationParams, Prompt


class StaleWeightsError(RuntimeError):
    """A worker was asked to generate with weights older than the group's (it was restarted)."""


# A push to a worker that takes updates in flight runs in this concurrency group's thread, beside
# generation in the default group's.
IN_FLIGHT = "weights"
# With partial rollouts, generation calls run in this group's threads, side by side: the engine
# batches their requests together (VLLMBackend.generate_stream).
SIDE_BY_SIDE = "generate"


class RolloutWorker:
    def __init__(self, model_path: str, backend: str = "vllm", seed: int = 0, threads: int | None = None,
                 engine: dict | None = None, lora_rank: int | None = None, memory_limit_mb: float | None = None,
                 cpus: str | None = None):
        """`engine`: the vLLM engine's options (dtype, gpu_memory_utilization, max_model_len).
        `lora_rank`: the learner pushes LoRA adapters of this rank (vLLM reserves room for them; the
        transformers backend takes any). `memory_limit_mb`: this worker's own memory cgroup's limit.
        `cpus`: the CPU set it is pinned to (rollout.cpus), before the engine starts its threads."""
        pin_process(cpus, "rollout.cpus")
        if memory_limit_mb is not None:
            limit_own_memory(ray.get_runtime_context().get_actor_name() or f"coderloo-rollout-{os.getpid()}", memory_limit_mb)
        if threads:
            os.environ["OMP_NUM_THREADS"] = str(threads)
            torch.set_num_threads(threads)
        if backend == "vllm":
            from rollout_workers.vllm_backend import VLLMBackend

            self.backend = VLLMBackend(model_path, seed=seed, lora_rank=lora_rank, **(engine or {}))
        elif backend == "transformers":
            from rollout_workers.hf_backend import TransformersBackend

            self.backend = TransformersBackend(model_path, seed=seed)
        else:
            raise ValueError(f"unknown rollout backend {backend!r}: expected 'vllm' or 'transformers'")
        self.backend_name, self.threads = backend, threads
        self.version = 0

    def generate_stream(self, prompts: list[Prompt], params: GenerationParams, seed: int | None = None, min_version: int = 0,
                        heartbeat_s: float | None = None):
        """Samples for `prompts`: yields (index, rollout) as each prompt's samples finish (call
        with .options(num_returns="streaming")), and with `heartbeat_s`, None each time that long
        passes while the engine steps and no prompt finishes (long completions on a slow machine
        are not a stuck worker). With `seed`, the engine's generator is reseeded first, so that
        the same weights, prompts and seed give the same samples whatever ran before.

        Raises StaleWeightsError if this worker holds weights older than `min_version`: a worker
        that Ray restarted has its initial weights until the group brings it back.
        """
        if self.version < min_version:
            raise StaleWeightsError(f"worker holds weights version {self.version}, the group is at {min_version}")
        if seed is not None:
            self.backend.reseed(seed)
        if self.threads:
            torch.set_num_threads(self.threads)  # in a concurrency group's thread (InFlightRolloutWorker): its own setting
        yield from self.backend.generate_stream(prompts, params, self.version, heartbeat_s)

    def join_weight_group(self, transport: str, host: str, port: int, rank: int, world_size: int, timeout_s: float) -> None:
        """Join the learner's weight-sync group as `rank` (blocks until every rank has joined).
        `transport` "auto" or "shm": the vLLM engine receives through shared memory when this
        worker is on the learner's Ray node (common/weight_sync.py); the transformers engine, a
        reference for tests, always by gloo."""
        if self.backend_name == "transformers":
            self.backend.join_weight_group("gloo" if transport == "auto" else transport, host, port, rank, world_size, timeout_s)
            return
        node_id = ray.get_runtime_context().get_node_id()
        self.backend.join_weight_group(transport, host, port, rank, world_size, timeout_s, node_id)

    def receive_weights(self, plan: BucketPlan, version: int | None) -> int:
        """Receive one push from the group, check it arrived whole, then take on `version`
        (None: the first stage of a catch-up, the base under an adapter; the version moves with
        the adapter that follows it).

        Raises WeightSyncError (nothing is taken on) if a bucket or a probe parameter differs
        from what the learner sent, and WeightSyncTimeout if the learner stops sending.
        """
        if version is not None and version <= self.version:
            raise ValueError(f"weight version must increase: have {self.version}, got {version}")
        self.backend.receive_weights(plan, version)
        if version is not None:
            self.version = version
        return self.version

    def load_adapter(self, directory: str) -> None:
        """Serve the base model with the LoRA adapter saved in `directory` (PEFT's format), as an
        evaluation of a checkpoint's adapter does; pushes are for training."""
        self.backend.load_adapter(directory)

    def context_length(self) -> int:
        """The longest prompt + completion, in tokens, that the engine takes."""
        return self.backend.context_length

    def status(self) -> tuple[int, int]:
        """This incarnation's process id (a restarted actor has a new one) and weights version."""
        return os.getpid(), self.version


InFlightRolloutWorker = ray.remote(concurrency_groups={IN_FLIGHT: 1, SIDE_BY_SIDE: 8})(RolloutWorker)
RolloutWorker = ray.remote(RolloutWorker)


def start_workers(model_path: str, settings, seed: int, run: str | None = None, lora_rank: int | None = None) -> list:
    """`settings.num_workers` workers placed and configured by `settings` (a RolloutConfig): its GPUs, custom resources and engine options. With `run`, each is named
    `coderloo-rollout-<i>-<run>`. Ray restarts a worker that dies; RolloutGroup.recover brings it
    back into the weight group. `lora_rank`: the weights pushed are LoRA adapters of this rank.
    With `settings.update_in_flight`, each has a second thread (the IN_FLIGHT concurrency group)
    for pushes that come while it generates."""
    actor = InFlightRolloutWorker if settings.update_in_flight else RolloutWorker
    return [
        actor.options(
            max_restarts=-1, name=f"coderloo-rollout-{i}-{run}" if run else None,
            **placement_options(settings.gpus_per_worker, settings.resources),
        ).remote(model_path, settings.backend, seed=seed + i, threads=settings.threads, engine=settings.engine_options(), lora_rank=lora_rank,
                                                                       memory_limit_mb=settings.memory_limit_mb, cpus=settings.cpus)
        for i in range(settings.num_workers)
    ]
