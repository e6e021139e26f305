"""Advantage estimators: pure functions of reward tensors."""
from __future__ import annotations

import torch


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out: A_i = r_i - mean(r_j, j != i), per group.

    `rewards` has shape [num_groups, k]: the k samples of one prompt share a row.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape [num_groups, k], got {tuple(rewards.shape)}")
    k = rewards.shape[1]
    if k < 2:
        raise ValueError(f"RLOO needs at least 2 samples per prompt, got k={k}")
    baseline = (rewards.sum(dim=1, keepdim=True) - rewards) / (k - 1)
    return rewards - baseline


def whiten(advantages: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Scale advantages to unit standard deviation over the batch (mean stays as it is: RLOO's is 0)."""
    return advantages / (advantages.std(unbiased=False) + eps)
