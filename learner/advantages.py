"""Advantage estimators: pure functions of reward tensors.

Every estimator takes `rewards` of shape [G, k] (G prompt groups, the k samples of one prompt
share a row) and returns advantages of the same shape, one per sample. `dense_advantages` turns
them into one per token with per-token rewards.
"""
from __future__ import annotations

from collections.abc import Callable

import torch


def _check_groups(rewards: torch.Tensor, min_k: int = 1) -> None:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape [num_groups, k], got {tuple(rewards.shape)}")
    if rewards.shape[1] < min_k:
        raise ValueError(f"this estimator needs at least {min_k} samples per prompt, got k={rewards.shape[1]}")


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out: A_i = r_i - mean(r_j, j != i), per group (needs k >= 2)."""
    _check_groups(rewards, min_k=2)
    k = rewards.shape[1]
    baseline = (rewards.sum(dim=1, keepdim=True) - rewards) / (k - 1)
    return rewards - baseline


def grpo_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: A_i = (r_i - mean_g) / (std_g + eps), per group.

    std_g is the unbiased (Bessel-corrected, divide by k - 1) group std, as in TRL's GRPOTrainer
    (`torch.Tensor.std` default, scale_rewards="group"). A group of equal rewards gets 0.
    """
    _check_groups(rewards, min_k=2)
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=True)
    return (rewards - mean) / (std + eps)


def dr_grpo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO: A_i = r_i - mean_g, per group, with no division by the group's std (which weighs
    the prompts whose samples agree most, the easiest and the hardest, the most); TRL's
    scale_rewards="none". Needs k >= 2."""
    _check_groups(rewards, min_k=2)
    return rewards - rewards.mean(dim=1, keepdim=True)


def reinforce_pp_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++ with baseline (OpenRLHF's "reinforce_baseline").

    Subtract the group mean, then divide by the std of those centred values over the whole
    batch (biased: divide by G * k, as OpenRLHF's batch normalisation). The batch mean of the
    centred values is already 0, so no second mean is subtracted.
    """
    _check_groups(rewards)
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    return centred / (centred.std(unbiased=False) + eps)


def reinforce_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Plain REINFORCE, no baseline: A_i = r_i (a copy), for comparison."""
    _check_groups(rewards)
    return rewards.clone()


ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "rloo": rloo_advantages,
    "grpo": grpo_advantages,
    "dr_grpo": dr_grpo_advantages,
    "reinforce_pp": reinforce_pp_advantages,
    "reinforce": reinforce_advantages,
}


def compute_advantages(estimator: str, rewards: torch.Tensor) -> torch.Tensor:
    """Advantages of `rewards` [G, k] by the estimator registered under `estimator`."""
    try:
        fn = ESTIMATORS[estimator]
    except KeyError:
        raise ValueError(
            f"unknown advantage estimator {estimator!r}; valid: {', '.join(sorted(ESTIMATORS))}"
        ) from None
    return fn(rewards)


def informative_groups(rewards: torch.Tensor) -> torch.Tensor:
    """Bool [G]: True where a group's k rewards are not all equal.

    A group of equal rewards gives zero advantage under every baseline estimator: no signal.
    """
    _check_groups(rewards)
    return (rewards != rewards[:, :1]).any(dim=1)


def whiten(advantages: torch.Tensor, eps: float = 1e-6, shift_mean: bool = False) -> torch.Tensor:
    """Scale advantages to unit standard deviation over the batch; the mean stays as it is (RLOO's
    is 0) unless `shift_mean` (PPO's GAE advantages, as TRL's and OpenRLHF's whitening)."""
    centred = advantages - advantages.mean() if shift_mean else advantages
    return centred / whitening_divisor(advantages, eps)


def whitening_divisor(advantages: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """What `whiten` divides by: the spread over the batch."""
    return advantages.std(unbiased=False) + eps


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over right-padded steps [B, T] (`mask` marks the real ones,
    a prefix of each row): per-step rewards r_t and value estimates V_t of the state before step t.

        delta_t = r_t + gamma V_{t+1} - V_t        (V past the last step: 0, the episode ended)
        A_t     = delta_t + gamma lam A_{t+1}      returns_t = A_t + V_t (the value targets)

    As `get_advantages_and_returns` of OpenRLHF and the loop of TRL's PPOTrainer. lam = 1 makes A_t
    the discounted return minus V_t (Monte Carlo); lam = 0 the one-step TD error. Padding gets 0.
    """
    if rewards.shape != values.shape or rewards.shape != mask.shape or rewards.dim() != 2:
        raise ValueError(f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and mask {tuple(mask.shape)} must all be [B, T]")
    mask = mask.to(rewards.dtype)
    rewards, values = rewards * mask, values * mask
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        next_value = values[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lam * running
        advantages[:, t] = running
    advantages = advantages * mask
    return advantages, (advantages + values) * mask


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over flat tensors: 1 when the value model predicts
    the returns, 0 when it does no better than their mean, below 0 when worse (nan if no variance)."""
    var = returns.var(unbiased=False)
    return float(1.0 - (returns - values).var(unbiased=False) / var) if var > 0 else float("nan")


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer: int, penalty: float) -> torch.Tensor:
    """DAPO's soft overlong punishment, a reward term per completion of `lengths` tokens: 0 up to
    max_new_tokens - buffer tokens, then falling linearly to -penalty at max_new_tokens (and -penalty
    for anything longer), as Eq. 13 of the DAPO paper and TRL's get_soft_overlong_punishment."""
    if not 0 < buffer <= max_new_tokens:
        raise ValueError(f"overlong buffer must be in 1..max_new_tokens ({max_new_tokens}), got {buffer}")
    over = (lengths.to(torch.float) - (max_new_tokens - buffer)).clamp(min=0, max=buffer)
    return -penalty * over / buffer


def dense_advantages(
    sequence_advantages: torch.Tensor, token_rewards: torch.Tensor, mask: torch.Tensor, coef: float, gamma: float = 1.0
) -> torch.Tensor:
    """Per-token advantages [G, k, T] from sequence advantages [G, k] and per-token rewards [G, k, T]
    (right-padded; `mask` marks the real tokens), for dense rewards:

        A_it = A_i + coef * (R_it - mean_{j != i} R_jt),   R_it = sum_{s >= t} gamma^(s - t) r_is

    A_i is the sample's sequence (RLOO) advantage, R_it its reward-to-go from token t (0 past its
    end). The baseline of the per-token term is the other k - 1 samples' reward-to-go at the same
    position: it does not depend on sample i at all, so with gamma = 1 the term is an unbiased policy
    gradient (a baseline from sample i's own remaining length, as a per-token mean times the tokens
    left, would depend on its later actions). Lower gamma trades that for credit nearer the tokens
    that earned it: undiscounted, a penalty falls equally on every token before it. Rewards shared
    by all k samples cancel: the term sums to 0 over a group at each position all k reach, so no
    token is pushed up or down in every sample at once. At the first token the term is the RLOO
    advantage of the summed token rewards.
    """
    _check_groups(sequence_advantages, min_k=2)
    if token_rewards.shape[:2] != sequence_advantages.shape or token_rewards.shape != mask.shape:
        raise ValueError(
            f"token rewards {tuple(token_rewards.shape)} and mask {tuple(mask.shape)} must be "
            f"[G, k, T] with [G, k] = {tuple(sequence_advantages.shape)}"
        )
    rewards = token_rewards * mask
    to_go = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[..., 0])
    for t in reversed(range(rewards.shape[-1])):
        running = rewards[..., t] + gamma * running
        to_go[..., t] = running
    k = to_go.shape[1]
    baseline = (to_go.sum(dim=1, keepdim=True) - to_go) / (k - 1)
    return (sequence_advantages.unsqueeze(-1) + coef * (to_go - baseline)) * mask
