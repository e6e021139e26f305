"""Rollout workers: generation backends (vLLM, transformers) behind one actor, grouped for dispatch
and weight pushes."""
from __future__ import annotations

from rollout_workers.group import RolloutGroup, SyncSettings
from rollout_workers.types import GenerationParams, PromptRollout, Sample
from rollout_workers.weight_sync import WeightSyncError, WeightSyncTimeout
from rollout_workers.worker import RolloutWorker, start_workers

__all__ = [
    "GenerationParams", "PromptRollout", "RolloutGroup", "RolloutWorker", "Sample", "SyncSettings",
    "WeightSyncError", "WeightSyncTimeout", "start_workers",
]
