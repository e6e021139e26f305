"""Rollout workers: generation backends (vLLM, transformers) behind one actor interface."""
from __future__ import annotations

import ray

from rollout_workers.types import GenerationParams, PromptRollout, Sample
from rollout_workers.worker import RolloutWorker, WeightSyncError


def generate(workers: list, prompts: list[str], params: GenerationParams) -> list[PromptRollout]:
    """Generate on all workers at once, one contiguous share of the prompts each; results in order."""
    share = -(-len(prompts) // len(workers))
    refs = [w.generate.remote(prompts[i * share : (i + 1) * share], params) for i, w in enumerate(workers)]
    return [rollout for chunk in ray.get(refs) for rollout in chunk]


def push_weights(workers: list, state_ref: ray.ObjectRef, version: int) -> None:
    """Send one set of weights (already in the object store) to every worker under `version`."""
    ray.get([w.update_weights.remote(state_ref, version) for w in workers])


__all__ = ["GenerationParams", "PromptRollout", "RolloutWorker", "Sample", "WeightSyncError", "generate", "push_weights"]
