"""Tolerances for results computed along two float32 paths (engines, kernels, ranks, merged or
not, streamed or whole), derived from the computation rather than tried until a test passes.

The rule: a reduction of n terms in float32 carries at most n * u of relative error, u = 2**-24
(float32's unit roundoff), relative to the sum of its terms' sizes; a forward pass chains its
reductions, so its output is off by at most N * u relatively, N the sum of the reduction lengths
along the pass (`reduction_length`). Two paths may each be anywhere within that.

Greedy tokens: a logit is h . w, so its error is at most N * u * |h| * |w| (Cauchy-Schwarz), and
the difference of two logits a and b at most N * u * |h| * (|w_a| + |w_b|). Where two greedy
decodes first part, the two tokens' margin is measured in a reference model's logits (a third
computation of the same function): if it is within the three computations' errors, either choice
is correct (a near-tie, counted, and the rest of that output not compared: its contexts differ
from there on); beyond, one path computed something else. The bound is a worst case, loose by
design: the margins of real mismatches (a wrong adapter scale, stale weights) are spread over the
logits' gaps, most far above it.

Weights after AdamW steps: see `assert_same_adam_steps`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

UNIT_ROUNDOFF = 2.0**-24  # float32's: every compared path runs in float32


def reduction_length(config, context: int, lora_rank: int = 0) -> int:
    """The reductions a token's logits go through, summed: per layer the q/k/v projections
    (hidden), the attention scores (head_dim) and the weighted sum of values (the context), the
    output projection (hidden), the MLP's gate/up (hidden) and down (intermediate); with LoRA the
    rank-r product of each of those four projections; then the output layer (hidden)."""
    hidden, head_dim = config.hidden_size, config.hidden_size // config.num_attention_heads
    layer = 3 * hidden + head_dim + context + config.intermediate_size + 4 * lora_rank
    return config.num_hidden_layers * layer + hidden


def margin_bound(paths: int, reductions: int, hidden: torch.Tensor, row_a: torch.Tensor, row_b: torch.Tensor) -> float:
    """The most rounding can move the margin between two logits, h . w_a - h . w_b, when `paths`
    float32 computations of it (each along `reductions` terms in all) may each be anywhere within
    their error: paths * N * u * |h| * (|w_a| + |w_b|)."""
    return paths * reductions * UNIT_ROUNDOFF * float(hidden.norm()) * float(row_a.norm() + row_b.norm())


@dataclass
class Agreement:
    compared: int = 0  # tokens both paths chose alike before any parting
    near_ties: list[tuple[int, int, float, float]] = field(default_factory=list)  # (prompt, position, margin, bound)


@torch.no_grad()
def compare_greedy(model, prompt_ids: list[list[int]], expected: list[list[int]], got: list[list[int]],
                   lora_rank: int = 0, what: str = "") -> Agreement:
    """`model`: a float32 reference holding the weights both paths ran; `expected`, `got`: the
    two paths' greedy outputs. Raises where they part at a margin beyond the rounding bound;
    returns what was compared and the near-ties."""
    model = model.eval()
    assert next(model.parameters()).dtype == torch.float32
    out_rows = model.get_output_embeddings().weight
    seen = Agreement()
    for index, (prompt, want, have) in enumerate(zip(prompt_ids, expected, got, strict=True)):
        same = next((j for j, (a, b) in enumerate(zip(want, have)) if a != b), min(len(want), len(have)))
        seen.compared += same
        if want == have:
            continue
        assert same < len(want) and same < len(have), f"{what}: prompt {index}: one output is a prefix of the other"
        out = model(input_ids=torch.tensor([prompt + want[:same]]), output_hidden_states=True)
        logits, h = out.logits[0, -1], out.hidden_states[-1][0, -1]  # the last hidden state is after the final norm
        a, b = want[same], have[same]
        margin = float(logits[a] - logits[b])
        n = reduction_length(model.config, len(prompt) + same, lora_rank)
        bound = margin_bound(3, n, h, out_rows[a], out_rows[b])  # the two paths' errors on the margin and the reference's own
        assert margin <= bound, (f"{what}: prompt {index}, token {same}: {b} where the reference chose {a} by a "
                                 f"margin of {margin:.3g} in its logits, beyond float32 rounding ({bound:.3g})")
        seen.near_ties.append((index, same, margin, bound))
    return seen


def assert_same_greedy(model, prompt_ids, expected, got, lora_rank: int = 0, what: str = "") -> Agreement:
    """compare_greedy, and enough compared: a near-tie ends its output's comparison, so at least
    half the expected tokens must have been compared before any (else the check says little)."""
    seen = compare_greedy(model, prompt_ids, expected, got, lora_rank, what)
    total = sum(len(ids) for ids in expected)
    assert 2 * seen.compared >= total, f"{what}: {seen.compared} of {total} tokens compared, near-ties at {seen.near_ties}"
    return seen


def reference_model(path, weights: dict | None = None):
    """A float32 transformers model of `path`, holding `weights` (a source's named weights) if given."""
    from common.hf import load_causal_lm

    model = load_causal_lm(path)
    if weights is not None:
        model.load_state_dict(weights, strict=True)
    return model.eval()


def logprob_bound(model, context: int, lora_rank: int = 0) -> float:
    """How far two float32 paths' logprobs of one token may part: a logprob is a logit less the
    log-sum-exp of all (within the largest logit error of them), so each path is off by at most twice
    the largest logit error, N * u * |h| * max |w|, where the final RMSNorm bounds |h| by sqrt(hidden)
    times its largest weight."""
    h = model.config.hidden_size**0.5 * float(model.model.norm.weight.detach().abs().max())
    w = float(model.get_output_embeddings().weight.detach().norm(dim=1).max())
    return 2 * 2 * reduction_length(model.config, context, lora_rank) * UNIT_ROUNDOFF * h * w


def adam_moves(steps: int, betas=(0.9, 0.999)) -> float:
    """The most AdamW (no weight decay) can move one weight in `steps` steps, in units of lr: step
    t moves it by lr * |m / (sqrt(v) + eps)|, at most sqrt(sum_k a_k**2 / b_k) over the
    bias-corrected weights a_k of the gradients in m and b_k in v (Cauchy-Schwarz): 1 at the first
    step, 1.0014 at the second, 1.043 at the tenth."""
    b1, b2 = betas
    total = 0.0
    for t in range(1, steps + 1):
        a = [(1 - b1) * b1 ** (t - k) / (1 - b1**t) for k in range(1, t + 1)]
        b = [(1 - b2) * b2 ** (t - k) / (1 - b2**t) for k in range(1, t + 1)]
        total += sum(x * x / y for x, y in zip(a, b)) ** 0.5
    return total


APART = 1 / 64  # of lr a step: weights further apart than this count as rounding-sensitive


def assert_same_adam_steps(got: dict, want: dict, initial: dict, lr: float, steps: int, tokens: int, what: str = "") -> int:
    """Weights after `steps` AdamW steps at `lr`, taken along two float32 paths from `initial`
    on a batch of `tokens` tokens (the length of each weight gradient's reduction).

    Adam's update lr * m / (sqrt(v) + eps) is sign-like: a gradient g off by its reduction's
    rounding dg (tokens * u of its terms' sizes) moves the update by about lr * dg / |g|. So where
    |g| is far above dg both paths move a weight alike; where |g| is within dg of zero its sign is
    the rounding's, and the paths may move the weight by up to lr a step in opposite ways. Hence:
    every weight within 2 * adam_moves(steps) * lr of the other path's; and weights more than
    APART * lr a step apart are those with |g| below dg / APART, a fraction of about tokens * u /
    APART of the weights (gradients spread over the size of their terms): counted, and no more
    allowed. A step not taken, or at another rate, moves most weights apart. Returns the count."""
    reach, apart = 2 * adam_moves(steps) * lr, APART * lr * steps
    sensitive, count = 0, 0
    for name, start in initial.items():
        gap = (got[name] - want[name]).abs()
        assert float(gap.max()) <= reach, f"{what}{name}: {float(gap.max()):.3g} apart, beyond Adam's reach {reach:.3g}"
        sensitive += int((gap > apart).sum())
        count += start.numel()
    allowed = tokens * UNIT_ROUNDOFF / APART * count
    assert sensitive <= max(1, allowed), f"{what}{sensitive} of {count} weights more than {apart:.3g} apart (rounding moves some {allowed:.0f})"
    assert any(not torch.equal(want[n], initial[n]) for n in initial), f"{what}no weight moved: the check would say nothing"
    return sensitive


def sizes(sequences) -> tuple[int, int]:
    """A batch's tokens (each weight gradient's reduction) and its longest sequence."""
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in sequences]
    return sum(lengths), max(lengths)


def grad_norm_rtol(tokens: int) -> float:
    """Two paths' gradient norms on one batch: each gradient element is a reduction over the batch's
    tokens (n * u relative to its terms' sizes), and terms of either sign (advantages +-1) cancel to
    about sqrt(n) of their sizes' sum: n**1.5 * u."""
    return tokens**1.5 * UNIT_ROUNDOFF


def entropy_rtol(config, context: int, tokens: int) -> float:
    """Two paths' mean entropy over `tokens` tokens in contexts of up to `context`: each token's
    comes out of a forward pass (reduction_length) and the mean adds `tokens` terms of one sign."""
    return (reduction_length(config, context) + tokens) * UNIT_ROUNDOFF
