"""Losses: pure functions of per-token tensors, tested alone."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


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
SURROGATES = ("clip", "cispo", "sapo", "vespo")


@dataclass(frozen=True)
class LossConfig:
    """How the learner turns a step's sequences into a loss; the learner applies it as given,
    whatever algorithm made the advantages."""

    clip_eps_low: float  # the ratio is clipped to [1 - clip_eps_low, 1 + clip_eps_high]
    clip_eps_high: float
    tis_cap: float | None  # truncated importance sampling against the sampler's logprobs (None: off)
    kl_coef: float  # weight of the per-token KL penalty to the reference in the loss (0: none)
    kl_estimator: str  # "k1" or "k3" (kl_penalty)
    aggregation: str  # one of AGGREGATIONS
    temperature: float  # the samples' sampling temperature: logprobs are computed at it
    surrogate: str = "clip"  # one of SURROGATES (see policy_loss)
    importance_level: str = "token"  # "token" or "sequence" (GSPO)
    clip_ratio_c: float | None = None  # dual clip: a bound c > 1 on the loss of negative advantages
    clip_delta: float | None = None  # two-sided clip: the unclipped ratio is capped at delta
    sapo_tau_pos: float = 1.0  # SAPO's gate temperatures for positive and negative advantages
    sapo_tau_neg: float = 1.05
    vespo_pos: tuple[float, float] = (2.0, 3.0)  # VESPO's gamma weight (k, lambda) for A >= 0
    vespo_neg: tuple[float, float] = (3.0, 2.0)  # and for A < 0
    max_new_tokens: int = 0  # the constant normalizer of seq_mean_token_sum_norm (Dr. GRPO)
    train_value: bool = False  # PPO: train the value model on the sequences' returns (value_loss)
    value_clip: float | None = 0.5  # value_loss's clip
    value_loss_coef: float = 0.1  # the value loss's weight when it shares the policy's backbone


@dataclass
class LossInputs:
    """Per-token tensors [B, T] of one micro-batch, each named by whose logprobs it holds."""

    logprobs: torch.Tensor  # the learner's now (with gradient)
    step_start_logprobs: torch.Tensor  # the learner's at the start of the step, before any update
    sampler_logprobs: torch.Tensor  # the sampler's (the rollout engine that drew the tokens)
    advantages: torch.Tensor  # per token
    mask: torch.Tensor  # 1 on the tokens trained on
    reference_logprobs: torch.Tensor | None = None  # the frozen reference's, for the KL penalty


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


def _row_weights(aggregation: str, mask: torch.Tensor) -> torch.Tensor:
    """[B, 1]: each sequence's weight in the sum (1 / its token count for the mean of token means)."""
    if aggregation == "seq_mean_token_mean":
        return 1.0 / mask.sum(dim=1, keepdim=True).clamp(min=1)
    return torch.ones_like(mask[:, :1])


def _gamma_weight(log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, config: LossConfig) -> torch.Tensor:
    """VESPO's per-sequence weight phi(w) = e^lambda w^k e^(-lambda w) of the sequence's importance
    ratio w (the product of its token ratios), with (k, lambda) by the advantage's sign; no gradient."""
    with torch.no_grad():
        floor = math.log(1e-8)
        log_w = (log_ratio.clamp(-20.0, 20.0) * mask).sum(dim=-1, keepdim=True).clamp(floor, 20.0)
        nonneg = advantages >= 0
        k = torch.where(nonneg, config.vespo_pos[0], config.vespo_neg[0])
        lam = torch.where(nonneg, config.vespo_pos[1], config.vespo_neg[1]).clamp(min=1e-4)
        return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def policy_loss(inputs: LossInputs, config: LossConfig, normalizer: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy-gradient loss over the masked tokens, with an optional KL penalty.

    The ratio r is taken against the learner's own logprobs at the start of the step, per token or
    (importance_level "sequence", GSPO) as the length-normalized geometric mean of a sequence's
    token ratios, the same for all its tokens. The surrogate:

    - clip (PPO; GRPO, DAPO, Dr. GRPO, GSPO): -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), with
      clip-higher when eps_high > eps_low; `clip_delta` caps the unclipped r (two-sided clip);
      `clip_ratio_c` bounds the loss of a negative advantage at -c A (dual clip);
    - cispo: -sg(min(r, 1 + eps_high)) A log p: the importance weight is clipped and carries no
      gradient, so every token keeps a REINFORCE gradient (MiniMax-M1);
    - sapo: -sigmoid(tau (r - 1)) 4 / tau A: a soft gate in place of the hard clip, tau by A's sign;
    - vespo: -sg(phi(w)) A log p with phi VESPO's gamma weight of the sequence ratio w (its own,
      always per sequence).

    The samples came from the sampler (another engine, maybe older weights), whose logprobs differ;
    with `tis_cap`, each token's loss is weighted by min(p_step_start / p_sampler, tis_cap)
    (truncated importance sampling); vespo folds that ratio into w instead.

    The loss is the sum of the per-token terms, each sequence's weighted by the aggregation
    (_row_weights), divided by `normalizer`: by default the batch's own (loss_normalizer). A learner
    that splits a mini-batch into micro-batches passes the mini-batch's normalizer, so that the sum
    of micro-batch losses is the mini-batch's loss. The KL penalty to the reference uses
    `kl_estimator` (see kl_penalty) and is aggregated with the policy term.
    """
    if config.surrogate not in SURROGATES:
        raise ValueError(f"unknown policy loss surrogate {config.surrogate!r}; valid: {', '.join(SURROGATES)}")
    if config.importance_level not in ("token", "sequence"):
        raise ValueError(f"unknown importance level {config.importance_level!r}: expected 'token' or 'sequence'")
    logprobs, advantages = inputs.logprobs, inputs.advantages
    mask = inputs.mask.to(logprobs.dtype)
    log_ratio = logprobs - inputs.step_start_logprobs
    if config.importance_level == "sequence":
        sequence = (log_ratio * mask).sum(dim=-1, keepdim=True) / mask.sum(dim=-1, keepdim=True).clamp(min=1)
        ratio = torch.exp(sequence).expand_as(logprobs)
    else:
        ratio = torch.exp(log_ratio)
    low, high = 1.0 - config.clip_eps_low, 1.0 + config.clip_eps_high
    tis = None
    if config.tis_cap is not None:
        raw = torch.exp(inputs.step_start_logprobs - inputs.sampler_logprobs).detach()
        tis = raw.clamp(max=config.tis_cap)
    stats: dict[str, float] = {}
    if config.surrogate == "clip":
        unclipped = ratio if config.clip_delta is None else ratio.clamp(max=config.clip_delta)
        per_token = -torch.min(unclipped * advantages, torch.clamp(ratio, low, high) * advantages)
        if config.clip_ratio_c is not None:
            dual = (advantages < 0) & (ratio > config.clip_ratio_c)
            per_token = torch.where(advantages < 0, torch.min(per_token, -config.clip_ratio_c * advantages), per_token)
            stats["clip_fraction_dual"] = masked_mean(dual.to(mask.dtype), mask).item()
        clipped_low = (ratio < low) & (advantages < 0)
        clipped_high = (ratio > high) & (advantages > 0)
    elif config.surrogate == "cispo":
        per_token = -ratio.clamp(max=high).detach() * advantages * logprobs
        clipped_low, clipped_high = torch.zeros_like(mask, dtype=torch.bool), ratio > high
    elif config.surrogate == "sapo":
        tau = torch.where(advantages > 0, config.sapo_tau_pos, config.sapo_tau_neg)
        per_token = -torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau * advantages
        clipped_low, clipped_high = (ratio < low) & (advantages < 0), (ratio > high) & (advantages > 0)
    else:  # vespo
        mismatch = 0.0 if tis is None else torch.log(tis.clamp(min=1e-8))
        phi = _gamma_weight(log_ratio + mismatch, advantages, mask, config)
        per_token = -phi * advantages * logprobs
        stats["vespo_weight_mean"] = masked_mean(phi.expand_as(mask), mask).item()
        clipped_low, clipped_high = (ratio < low) & (advantages < 0), (ratio > high) & (advantages > 0)
    stats.update(
        clip_fraction=masked_mean((clipped_low | clipped_high).to(mask.dtype), mask).item(),
        clip_fraction_low=masked_mean(clipped_low.to(mask.dtype), mask).item(),
        clip_fraction_high=masked_mean(clipped_high.to(mask.dtype), mask).item(),
        ratio_mean=masked_mean(ratio, mask).item(),
    )
    if tis is not None:
        if config.surrogate != "vespo":
            per_token = per_token * tis
        stats["tis_weight_mean"] = masked_mean(tis, mask).item()
        stats["tis_truncated_fraction"] = masked_mean((tis < raw).to(mask.dtype), mask).item()
    stats["pg_loss"] = masked_mean(per_token, mask).item()
    if config.kl_coef > 0:
        if inputs.reference_logprobs is None:
            raise ValueError("kl_coef > 0 needs the reference's logprobs")
        kl = kl_penalty(logprobs, inputs.reference_logprobs, config.kl_estimator)
        per_token = per_token + config.kl_coef * kl
        stats["kl"] = masked_mean(kl, mask).item()
    if normalizer is None:
        normalizer = loss_normalizer(config.aggregation, mask.sum(dim=1).tolist(), config.max_new_tokens)
    elif config.aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {config.aggregation!r}; valid: {', '.join(AGGREGATIONS)}")
    loss = (per_token * mask * _row_weights(config.aggregation, mask)).sum() / normalizer
    return loss, stats


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
