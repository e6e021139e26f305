"""Losses: pure functions of per-token tensors, tested alone."""
from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class LossConfig:
    """How the learner turns a step's sequences into a loss; the learner applies it as given,
    whatever algorithm made the advantages."""

    clip_eps: float  # clip range of the ratio to the step-start logprobs
    tis_cap: float | None  # truncated importance sampling against the sampler's logprobs (None: off)
    kl_coef: float  # weight of the per-token KL penalty to the reference in the loss (0: none)
    kl_estimator: str  # "k1" or "k3" (kl_penalty)
    aggregation: str  # "token_mean" or "seq_mean_token_sum": what a mini-batch's token losses are divided by
    temperature: float  # the samples' sampling temperature: logprobs are computed at it


@dataclass
class LossInputs:
    """Per-token tensors [B, T] of one micro-batch, each named by whose logprobs it holds."""

    logprobs: torch.Tensor  # the learner's now (with gradient)
    step_start_logprobs: torch.Tensor  # the learner's at the start of the step, before any update
    sampler_logprobs: torch.Tensor  # the sampler's (the rollout engine that drew the tokens)
    advantages: torch.Tensor  # per token
    mask: torch.Tensor  # 1 on the tokens trained on
    reference_logprobs: torch.Tensor | None = None  # the frozen reference's, for the KL penalty


def policy_loss(inputs: LossInputs, config: LossConfig, normalizer: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped policy-gradient loss over the masked tokens, with an optional KL penalty.

    The ratio is taken against the learner's own logprobs at the start of the step: clipping it
    bounds how far this step's optimizer updates move the policy. The samples came from the
    sampler (another engine, maybe older weights), whose logprobs differ; with `tis_cap`, each
    token's loss is weighted by the truncated importance ratio min(p_step_start / p_sampler,
    tis_cap) (truncated importance sampling), which corrects that mismatch without letting a rare
    token's weight explode.

    The loss is the sum of the per-token terms divided by `normalizer`: by default the number of
    masked tokens in this batch (token mean). A learner that splits a mini-batch into
    micro-batches passes the mini-batch's normalizer (its token count for the token mean, its
    sequence count for the sequence mean of token sums) so that the sum of micro-batch losses is
    the mini-batch's loss. The KL penalty to the reference uses `kl_estimator` (see kl_penalty).
    """
    logprobs, advantages = inputs.logprobs, inputs.advantages
    mask = inputs.mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - inputs.step_start_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - config.clip_eps, 1.0 + config.clip_eps) * advantages
    per_token = -torch.min(unclipped, clipped)
    stats = {
        "clip_fraction": masked_mean((unclipped != clipped).to(mask.dtype), mask).item(),
        "ratio_mean": masked_mean(ratio, mask).item(),
    }
    if config.tis_cap is not None:
        raw = torch.exp(inputs.step_start_logprobs - inputs.sampler_logprobs).detach()
        weight = raw.clamp(max=config.tis_cap)
        per_token = per_token * weight
        stats["tis_weight_mean"] = masked_mean(weight, mask).item()
        stats["tis_truncated_fraction"] = masked_mean((raw > config.tis_cap).to(mask.dtype), mask).item()
    stats["pg_loss"] = masked_mean(per_token, mask).item()
    if config.kl_coef > 0:
        if inputs.reference_logprobs is None:
            raise ValueError("kl_coef > 0 needs the reference's logprobs")
        kl = kl_penalty(logprobs, inputs.reference_logprobs, config.kl_estimator)
        per_token = per_token + config.kl_coef * kl
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
