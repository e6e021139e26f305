"""The rollout worker actor: one generation backend, versioned weights."""
from __future__ import annotations

import os

import ray
import torch

from rollout_workers.types import GenerationParams, PromptRollout

# Parameters read back after every update to check the engine really holds the new weights:
# embeddings and norms are stored as sent (linear layers are repacked by CPU kernels).
PROBE_NAMES = ["model.embed_tokens.weight", "model.norm.weight"]


class WeightSyncError(RuntimeError):
    """The engine does not hold the weights that were sent."""


@ray.remote
class RolloutWorker:
    def __init__(self, model_path: str, backend: str = "vllm", seed: int = 0, threads: int | None = None):
        if threads:
            os.environ["OMP_NUM_THREADS"] = str(threads)
            torch.set_num_threads(threads)
        if backend == "vllm":
            from rollout_workers.vllm_backend import VLLMBackend

            self.backend = VLLMBackend(model_path, seed=seed)
        elif backend == "transformers":
            from rollout_workers.hf_backend import TransformersBackend

            self.backend = TransformersBackend(model_path, seed=seed)
        else:
            raise ValueError(f"unknown rollout backend {backend!r}: expected 'vllm' or 'transformers'")
        self.version = 0

    def generate(self, prompts: list[str], params: GenerationParams) -> list[PromptRollout]:
        return self.backend.generate(prompts, params, self.version)

    def update_weights(self, state: dict[str, torch.Tensor], version: int) -> int:
        """Load new weights, check they arrived, and take on `version`."""
        if version <= self.version:
            raise ValueError(f"weight version must increase: have {self.version}, got {version}")
        self.backend.load_weights(state)
        held = self.backend.probe(PROBE_NAMES)
        for name in PROBE_NAMES:
            if name not in state:
                continue
            sent = float(state[name].detach().double().sum())
            if name not in held or abs(held[name] - sent) > 1e-6 * max(1.0, abs(sent)):
                raise WeightSyncError(
                    f"after update to version {version}, {name} in the engine sums to {held.get(name)}, sent {sent}"
                )
        self.version = version
        return version

    def get_version(self) -> int:
        return self.version
