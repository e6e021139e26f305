"""Losses: pure functions of per-token tensors, tested alone."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from learner.config import ClipLoss, MismatchCorrection, PolicyLoss, VespoLoss


def at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    """`t` in float32, or in its own dtype when that is wider: softmaxes over a vocabulary need it."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each next token: out[:, t] = log p(input_ids[:, t + 1] | input_ids[:, :t + 1]),
    from the logits of every position (the learner itself uses learner.logits: in chunks).

    Logits are divided by the sampling temperature so that the values match what the sampler used.
    """
    logits = at_least_fp32(logits[:, :-1]) / temperature
    targets = input_ids[:, 1:].unsqueeze(-1)
    return torch.gather(logits.log_softmax(dim=-1), -1, targets).squeeze(-1)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of each next-token distribution at `temperature`, aligned as token_logprobs: [B, T-1]."""
    logprobs = (at_least_fp32(logits[:, :-1]) / temperature).log_softmax(dim=-1)
    return -(logprobs.exp() * logprobs).sum(dim=-1)


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


# How a mini-batch's token losses become one number. Each is a sum over the mini-batch's tokens
# with a per-sequence weight, divided by a normalizer of the whole mini-batch (`loss_normalizer`),
# so that the sum of its micro-batches' losses is the mini-batch's loss however it was split.
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
# sapo and vespo clip nothing: their clip fractions count the ratios outside PPO's usual band, to
# compare them with a clip run's.
REPORT_BAND = 0.2


@dataclass
class LossInputs:
    """Per-token tensors [B, T] of one micro-batch, each named by whose logprobs it holds."""

    logprobs: torch.Tensor  # the learner's now (with gradient)
    step_start_logprobs: torch.Tensor  # the learner's at the start of the step, before any update
    sampler_logprobs: torch.Tensor  # the sampler's (the rollout engine that drew the tokens)
    advantages: torch.Tensor  # per token
    mask: torch.Tensor  # 1 on the tokens trained on
    reference_logprobs: torch.Tensor | None = None  # the frozen reference's, for the KL penalty
    # Per token, the index of the sequence it belongs to (-1: none), where a row holds several
    # (PackedBatch.segments); None: each row is one sequence.
    segments: torch.Tensor | None = None


def per_sequence(values: torch.Tensor, segments: torch.Tensor | None) -> torch.Tensor:
    """The sum of `values` [B, T] over each sequence's tokens (a row's without `segments`, else
    those of each segment index), with gradient: [sequences]."""
    if segments is None:
        return values.sum(dim=-1)
    member = (segments >= 0).to(values.dtype)
    return values.new_zeros(int(segments.max().item()) + 1).index_add(0, segments.clamp(min=0).flatten(), (values * member).flatten())


def sequence_sums(values: torch.Tensor, segments: torch.Tensor | None) -> torch.Tensor:
    """Per token, the sum of `values` [B, T] over the tokens of its sequence (`per_sequence`)."""
    sums = per_sequence(values, segments)
    if segments is None:
        return sums.unsqueeze(-1).expand_as(values)
    return sums[segments.clamp(min=0).flatten()].view_as(values)


def loss_normalizer(aggregation: str, trained_tokens: list[int], max_new_tokens: int = 0) -> float:
    """What a mini-batch's weighted token-loss sum is divided by, from the trained tokens of each of
    its sequences: their total (token_mean), the sequence count (seq_mean_token_mean,
    seq_mean_token_sum), or the sequence count times max_new_tokens (seq_mean_token_sum_norm,
    Dr. GRPO's constant). A sequence with no trained token (a masked truncated one) still counts as
    a sequence, as in TRL."""
    if aggregation == "token_mean":
        return float(max(sum(trained_tokens), 1))
    if aggregation in ("seq_mean_token_mean", "seq_mean_token_sum"):
        return float(max(len(trained_tokens), 1))
    if aggregation == "seq_mean_token_sum_norm":
        if max_new_tokens < 1:
            raise ValueError("seq_mean_token_sum_norm needs max_new_tokens (the rollout's) >= 1")
        return float(max(len(trained_tokens), 1) * max_new_tokens)
    raise ValueError(f"unknown loss aggregation {aggregation!r}; valid: {', '.join(AGGREGATIONS)}")


def _sequence_weights(aggregation: str, mask: torch.Tensor, segments: torch.Tensor | None) -> torch.Tensor:
    """Per token, its sequence's weight in the sum (1 / its token count for the mean of token means)."""
    if aggregation == "seq_mean_token_mean":
        return 1.0 / sequence_sums(mask, segments).clamp(min=1)
    return torch.ones_like(mask)


def _gamma_weight(log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, loss: VespoLoss,
                  segments: torch.Tensor | None) -> torch.Tensor:
    """VESPO's per-sequence weight phi(w) = e^lambda w^k e^(-lambda w) of the sequence's importance
    ratio w (the product of its token ratios), with (k, lambda) by the advantage's sign; no gradient."""
    with torch.no_grad():
        floor = math.log(1e-8)
        log_w = sequence_sums(log_ratio.clamp(-20.0, 20.0) * mask, segments).clamp(floor, 20.0)
        nonneg = advantages >= 0
        k = torch.where(nonneg, loss.k_pos, loss.k_neg)
        lam = torch.where(nonneg, loss.lambda_pos, loss.lambda_neg).clamp(min=1e-4)
        return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def mismatch_weights(inputs: LossInputs, correction: MismatchCorrection | None) -> tuple[torch.Tensor | None, dict[str, float]]:
    """Per token, the weight that corrects the gap between the sampler's and the learner's
    probabilities (learner.loss.mismatch; no gradient; None without a correction), and its
    statistics: the share of trained tokens it truncated or masked, the mean and spread over
    sequences of their log-ratio log(p_learner / p_sampler) summed over their tokens, and the k3
    estimate of KL(sampler || learner) per token (r - 1 - log r with r = p_learner / p_sampler,
    whose mean under the sampler's tokens is that KL)."""
    if correction is None:
        return None, {}
    mask, segments = inputs.mask.to(inputs.logprobs.dtype), inputs.segments
    with torch.no_grad():
        log_ratio = (inputs.step_start_logprobs - inputs.sampler_logprobs) * mask
        sequence = correction.mode.startswith("sequence")
        raw = torch.exp(sequence_sums(log_ratio, segments) if sequence else log_ratio)
        low, high = correction.lower, correction.cap
        if correction.mode.endswith("truncate"):
            weight = raw.clamp(min=low, max=high)
            changed, name = weight != raw, "mismatch_truncated_fraction"
        else:
            changed = (raw > high) | (raw < low)
            weight, name = raw.masked_fill(changed, 0.0), "mismatch_masked_fraction"
        sequence_log_ratio = per_sequence(log_ratio, segments)
        return weight, {
            "mismatch_weight_mean": masked_mean(weight, mask).item(),
            name: masked_mean(changed.to(mask.dtype), mask).item(),
            "mismatch_sequence_log_ratio_mean": sequence_log_ratio.mean().item(),
            "mismatch_sequence_log_ratio_std": sequence_log_ratio.std(correction=0).item(),
            "mismatch_kl_k3": masked_mean(torch.exp(log_ratio) - 1.0 - log_ratio, mask).item(),
        }


def policy_loss(inputs: LossInputs, loss: PolicyLoss, kl_coef: float = 0.0, kl_estimator: str = "k3",
                normalizer: float | None = None, max_new_tokens: int = 0) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy-gradient loss over the masked tokens, with an optional KL penalty.

    The ratio r is taken against the learner's own logprobs at the start of the step, per token or
    (importance_level "sequence", GSPO) as the length-normalized geometric mean of a sequence's
    token ratios, the same for all its tokens. The surrogate, by `loss.type`:

    - clip (PPO; GRPO, DAPO, Dr. GRPO, GSPO): -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), with
      clip-higher when eps_high > eps_low; `delta` caps the unclipped r (two-sided clip);
      `dual_clip` bounds the loss of a negative advantage at -c A;
    - cispo: -sg(min(r, 1 + eps_high)) A log p: the importance weight is clipped and carries no
      gradient, so every token keeps a REINFORCE gradient (MiniMax-M1);
    - sapo: -sigmoid(tau (r - 1)) 4 / tau A: a soft gate in place of the hard clip, tau by A's sign;
    - vespo: -sg(phi(w)) A log p with phi VESPO's gamma weight of the sequence ratio w (its own,
      always per sequence).

    The samples came from the sampler (another engine, maybe older weights), whose logprobs differ;
    with `loss.mismatch`, each token's loss is weighted by the bounded ratio p_step_start / p_sampler
    of its token or its sequence (mismatch_weights: truncated or masked importance sampling); vespo
    folds that weight into w instead.

    The loss is the sum of the per-token terms, each sequence's weighted by the aggregation
    (_sequence_weights), divided by `normalizer`: by default the batch's own (loss_normalizer, which needs
    the rollout's `max_new_tokens` for seq_mean_token_sum_norm). A learner
    that splits a mini-batch into micro-batches passes the mini-batch's normalizer, so that the sum
    of micro-batch losses is the mini-batch's loss. A KL penalty to the reference of weight
    `kl_coef` uses `kl_estimator` (see kl_penalty) and is aggregated with the policy term.
    """
    logprobs, advantages = inputs.logprobs, inputs.advantages
    mask = inputs.mask.to(logprobs.dtype)
    segments = inputs.segments
    log_ratio = logprobs - inputs.step_start_logprobs
    if getattr(loss, "importance_level", "token") == "sequence":
        ratio = torch.exp(sequence_sums(log_ratio * mask, segments) / sequence_sums(mask, segments).clamp(min=1))
    else:
        ratio = torch.exp(log_ratio)
    low = 1.0 - (loss.eps_low if isinstance(loss, ClipLoss) else REPORT_BAND)
    high = 1.0 + getattr(loss, "eps_high", REPORT_BAND)
    weight, stats = mismatch_weights(inputs, loss.mismatch)
    if loss.type == "clip":
        unclipped = ratio if loss.delta is None else ratio.clamp(max=loss.delta)
        per_token = -torch.min(unclipped * advantages, torch.clamp(ratio, low, high) * advantages)
        if loss.dual_clip is not None:
            dual = (advantages < 0) & (ratio > loss.dual_clip)
            per_token = torch.where(advantages < 0, torch.min(per_token, -loss.dual_clip * advantages), per_token)
            stats["clip_fraction_dual"] = masked_mean(dual.to(mask.dtype), mask).item()
        clipped_low = (ratio < low) & (advantages < 0)
        clipped_high = (ratio > high) & (advantages > 0)
    elif loss.type == "cispo":
        per_token = -ratio.clamp(max=high).detach() * advantages * logprobs
        clipped_low, clipped_high = torch.zeros_like(mask, dtype=torch.bool), ratio > high
    elif loss.type == "sapo":
        tau = torch.where(advantages > 0, loss.tau_pos, loss.tau_neg)
        per_token = -torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau * advantages
        clipped_low, clipped_high = (ratio < low) & (advantages < 0), (ratio > high) & (advantages > 0)
    else:  # vespo
        mismatch = 0.0 if weight is None else torch.log(weight.clamp(min=1e-8))
        phi = _gamma_weight(log_ratio + mismatch, advantages, mask, loss, segments)
        per_token = -phi * advantages * logprobs
        stats["vespo_weight_mean"] = masked_mean(phi.expand_as(mask), mask).item()
        clipped_low, clipped_high = (ratio < low) & (advantages < 0), (ratio > high) & (advantages > 0)
    stats.update(
        clip_fraction=masked_mean((clipped_low | clipped_high).to(mask.dtype), mask).item(),
        clip_fraction_low=masked_mean(clipped_low.to(mask.dtype), mask).item(),
        clip_fraction_high=masked_mean(clipped_high.to(mask.dtype), mask).item(),
        ratio_mean=masked_mean(ratio, mask).item(),
    )
    if weight is not None and loss.type != "vespo":
        per_token = per_token * weight
    stats["pg_loss"] = masked_mean(per_token, mask).item()
    if kl_coef > 0:
        if inputs.reference_logprobs is None:
            raise ValueError("kl_coef > 0 needs the reference's logprobs")
        kl = kl_penalty(logprobs, inputs.reference_logprobs, kl_estimator)
        per_token = per_token + kl_coef * kl
        stats["kl"] = masked_mean(kl, mask).item()
    if normalizer is None:
        normalizer = loss_normalizer(loss.aggregation, per_sequence(mask, segments).tolist(), max_new_tokens)
    return (per_token * mask * _sequence_weights(loss.aggregation, mask, segments)).sum() / normalizer, stats


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float | None, normalizer: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss over the masked tokens [B, T]:

        0.5 max((V - R)^2, (V_old + clip(V - V_old, -clip, clip) - R)^2)

    (the value may not move more than `clip` from its estimate at the step's start unless that
    brings it nearer the return R), summed and divided by `normalizer` (default: the masked token
    count), as OpenRLHF's ValueLoss and TRL's PPOTrainer. `clip` None: the plain squared error.
    Stats: value_loss (the token mean), value_clip_fraction (tokens whose clipped term was larger),
    value_mean."""
    mask = mask.to(values.dtype)
    unclipped = (values - returns) ** 2
    if clip is None:
        per_token, clipped = unclipped, torch.zeros_like(mask, dtype=torch.bool)
    else:
        bounded = old_values + (values - old_values).clamp(-clip, clip)
        clipped_term = (bounded - returns) ** 2
        per_token, clipped = torch.max(unclipped, clipped_term), clipped_term > unclipped
    per_token = 0.5 * per_token
    denominator = mask.sum().clamp(min=1) if normalizer is None else normalizer
    stats = {
        "value_loss": masked_mean(per_token, mask).item(),
        "value_clip_fraction": masked_mean(clipped.to(mask.dtype), mask).item(),
        "value_mean": masked_mean(values, mask).item(),
    }
    return (per_token * mask).sum() / denominator, stats


def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor, normalizer: float | None = None) -> torch.Tensor:
    """Negative log-likelihood of the masked (completion) tokens, divided by `normalizer`
    (default: their count, the token mean)."""
    mask = mask.to(logprobs.dtype)
    denominator = mask.sum().clamp(min=1) if normalizer is None else normalizer
    return -(logprobs * mask).sum() / denominator
