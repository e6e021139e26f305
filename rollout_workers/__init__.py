"""Rollout workers: generation backends (vLLM, transformers) behind one actor, grouped for dispatch
and weight pushes, and the rollout strategies that turn tasks into trajectories."""
from __future__ import annotations

from common.weight_sync import WeightSyncError, WeightSyncTimeout
from rollout_workers.group import RolloutGroup
from rollout_workers.types import GenerationParams, PromptRollout, Rollouts, Sample, Trajectory, Turn
from rollout_workers.worker import RolloutWorker, start_workers

__all__ = [
    "GenerationParams", "PromptRollout", "RolloutGroup", "RolloutWorker", "Rollouts", "Sample", "Trajectory", "Turn",
    "WeightSyncError", "WeightSyncTimeout", "start_workers",
]
