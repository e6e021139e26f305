"""Next-token logprobs and entropies in bounded memory: the language-model head applied a chunk of
tokens at a time, forward and backward.

`token_logprobs(model(...).logits, ...)` holds the logits of every token of a micro-batch, in fp32
for the softmax, and autograd keeps the log-softmax for the backward: at Qwen2.5-Coder's vocabulary
(151,936) a micro-batch of 4,096 tokens is 2.5 GB per copy. Here the model's forward stops at the
final hidden states (the head runs on one position only) and `ChunkedHead` computes, for the
completion tokens only, `chunk_tokens` at a time: the head's logits, their fp32 log-softmax, the
chosen token's logprob and the entropy; its backward computes each chunk's logits again and their
gradient by hand (the log-softmax's and the entropy's), adding the head's weight gradient up over
chunks. It keeps only the hidden states; peak memory is one chunk's logits (a few copies), whatever
the micro-batch's tokens. The values are the whole-vocabulary computation's, gradients included
(tests/test_chunked_logprobs.py).

It runs as the head module's forward (`_as_forward_of`): under ZeRO-3, DeepSpeed gathers a module's
partitioned weight for its forward and again for its backward by the module's hooks, once per
micro-batch here on every rank alike, however many chunks a rank has.
"""
from __future__ import annotations

import torch

from learner.losses import at_least_fp32


def final_hidden_states(forward, causal_lm, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The hidden states the language-model head reads (after the final norm), [B, T, H], from one
    forward pass (`forward`: `causal_lm` or the engine that wraps it) on `inputs` (a PackedBatch's
    `model_inputs`) that computes the logits of the last position only."""
    captured = []
    hook = causal_lm.get_decoder().register_forward_hook(lambda module, args, out: captured.append(out.last_hidden_state))
    try:
        forward(**inputs, logits_to_keep=1)
    finally:
        hook.remove()
    return captured[-1]


class ChunkedHead(torch.autograd.Function):
    """logprobs [N] (and entropies [N]) of `targets` [N] under `hidden` [N, H] @ `weight` [V, H]^T /
    temperature, `chunk` rows at a time; see the module's docstring."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, chunk: int, entropy: bool):
        ctx.save_for_backward(hidden, weight, targets)
        ctx.temperature, ctx.chunk, ctx.entropy = temperature, chunk, entropy
        # An output the loss does not use gets None, not zeros: entropies read as a statistic
        # alongside a trained logprob cost no backward work.
        ctx.set_materialize_grads(False)
        logprobs, entropies = [], []
        for start in range(0, len(targets), chunk):
            logp = _log_softmax(hidden[start:start + chunk], weight, temperature)
            logprobs.append(logp.gather(-1, targets[start:start + chunk].unsqueeze(-1)).squeeze(-1))
            if entropy:
                entropies.append(-(logp.exp() * logp).sum(dim=-1))
        dtype = at_least_fp32(hidden).dtype
        logprobs = torch.cat(logprobs) if logprobs else hidden.new_zeros(0, dtype=dtype)
        if not entropy:
            return logprobs
        return logprobs, torch.cat(entropies) if entropies else hidden.new_zeros(0, dtype=dtype)

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropies=None):
        hidden, weight, targets = ctx.saved_tensors
        if grad_logprobs is None:
            grad_logprobs = torch.zeros(len(targets), dtype=at_least_fp32(hidden).dtype, device=hidden.device)
        grad_hidden = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=at_least_fp32(weight).dtype) if ctx.needs_input_grad[1] else None
        for start in range(0, len(targets), ctx.chunk):
            end = start + ctx.chunk
            logp = _log_softmax(hidden[start:end], weight, ctx.temperature)
            probs = logp.exp()
            # d logp[t] / dz = onehot(t) - p;  d entropy / dz = -p (log p + entropy); z = logits / T
            grad = probs * -grad_logprobs[start:end, None]
            grad.scatter_add_(-1, targets[start:end, None], grad_logprobs[start:end, None])
            if grad_entropies is not None:
                entropy = -(probs * logp).sum(dim=-1, keepdim=True)
                grad -= grad_entropies[start:end, None] * probs * (logp + entropy)
            grad /= ctx.temperature
            if grad_hidden is not None:
                grad_hidden[start:end] = (grad @ at_least_fp32(weight)).to(hidden.dtype)
            if grad_weight is not None:
                grad_weight += grad.T @ at_least_fp32(hidden[start:end])
        return grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype), None, None, None, None


def _log_softmax(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    return (at_least_fp32(hidden @ weight.T) / temperature).log_softmax(dim=-1)


def _as_forward_of(module, fn, *args):
    """`fn(*args)` called as `module`'s forward, through its hooks (ZeRO-3's gathering of its weights)."""
    module.forward = fn
    try:
        return module(*args)
    finally:
        del module.forward


def chunked_logprobs(hidden: torch.Tensor, head, input_ids: torch.Tensor, positions: torch.Tensor, temperature: float,
                     chunk_tokens: int, entropy: bool = False):
    """Next-token logprobs [B, T-1] aligned as `token_logprobs` (and with `entropy` the entropies
    too), computed where `positions` [B, T-1] is true (0 elsewhere): the head `head` (the model's
    output embeddings, a Linear without bias) on `hidden` [B, T, H], `chunk_tokens` tokens at a time."""
    rows, cols = positions.nonzero(as_tuple=True)
    states = hidden[:, :-1][rows, cols]
    targets = input_ids[:, 1:].to(hidden.device)[rows, cols]
    out = _as_forward_of(head, lambda x: ChunkedHead.apply(x, head.weight, targets, temperature, chunk_tokens, entropy), states)
    zeros = at_least_fp32(hidden.new_zeros(positions.shape))

    def scatter(values: torch.Tensor) -> torch.Tensor:
        return zeros.index_put((rows, cols), values)

    return scatter(out) if not entropy else (scatter(out[0]), scatter(out[1]))
