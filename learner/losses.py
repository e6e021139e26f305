"""Losses: pure functions of per-token tensors, tested alone."""
from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each next token: out[:, t] = log p(input_ids[:, t + 1] | input_ids[:, :t + 1]).

    Logits are divided by the sampling temperature so that the values match what the sampler used.
    """
    logits = logits[:, :-1].float() / temperature
    targets = input_ids[:, 1:].unsqueeze(-1)
    return torch.gather(logits.log_softmax(dim=-1), -1, targets).squeeze(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from the sampled tokens' logprobs.

    k1 = log p - log p_ref (unbiased, can be negative per token); k3 = r - 1 - log r with
    r = p_ref / p (unbiased, always >= 0, lower variance; Schulman's estimator).
    """
    delta = ref_logprobs - logprobs
    if estimator == "k1":
        return -delta
    if estimator == "k3":
        return torch.exp(delta) - delta - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}: expected 'k1' or 'k3'")


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    sampler_logprobs: torch.Tensor | None = None,
    tis_cap: float | None = None,
    kl_estimator: str = "k3",
    normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped policy-gradient loss over completion tokens, with an optional KL penalty.

    Shapes: logprobs, old_logprobs, ref_logprobs, sampler_logprobs, mask are [B, T]; advantages is
    [B] (one per sequence, as RLOO gives) or [B, T] (per-token).

    `old_logprobs` are the learner's own logprobs at the start of the step: the clipped ratio
    against them bounds how far this step's optimizer updates move the policy. The samples came
    from the sampler (another engine, maybe older weights), whose logprobs differ; with
    `sampler_logprobs` and `tis_cap`, each token's loss is weighted by the truncated importance
    ratio min(p_old / p_sampler, tis_cap) (truncated importance sampling), which corrects that
    mismatch without letting a rare token's weight explode.

    The loss is the sum of the per-token terms divided by `normalizer`: by default the number of
    completion tokens in this batch (token mean). A learner that splits a mini-batch into
    micro-batches passes the mini-batch's normalizer (its token count for the token mean, its
    sequence count for the sequence mean of token sums) so that the sum of micro-batch losses is
    the mini-batch's loss. The KL penalty to the reference uses `kl_estimator` (see kl_penalty).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1).expand_as(logprobs)
    mask = mask.to(logprobs.dtype)
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    per_token = -torch.min(unclipped, clipped)
    stats = {
        "clip_fraction": masked_mean((unclipped != clipped).to(mask.dtype), mask).item(),
        "ratio_mean": masked_mean(ratio, mask).item(),
    }
    if tis_cap is not None and sampler_logprobs is not None:
        raw = torch.exp(old_logprobs - sampler_logprobs).detach()
        weight = raw.clamp(max=tis_cap)
        per_token = per_token * weight
        stats["tis_weight_mean"] = masked_mean(weight, mask).item()
        stats["tis_truncated_fraction"] = masked_mean((raw > tis_cap).to(mask.dtype), mask).item()
    stats["pg_loss"] = masked_mean(per_token, mask).item()
    if ref_logprobs is not None and kl_coef > 0:
        kl = kl_penalty(logprobs, ref_logprobs, kl_estimator)
        per_token = per_token + kl_coef * kl
        stats["kl"] = masked_mean(kl, mask).item()
    denominator = mask.sum().clamp(min=1) if normalizer is None else normalizer
    loss = (per_token * mask).sum() / denominator
    return loss, stats


def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor, normalizer: float | None = None) -> torch.Tensor:
    """Negative log-likelihood of the masked (completion) tokens, divided by `normalizer`
    (default: their count, the token mean)."""
    mask = mask.to(logprobs.dtype)
    denominator = mask.sum().clamp(min=1) if normalizer is None else normalizer
    return -(logprobs * mask).sum() / denominator
