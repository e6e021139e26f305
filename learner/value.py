"""PPO's value model: a scalar estimate of the return before each token, from a causal LM's backbone.

Two forms (learner.advantage.value_model): a model of its own (`ValueModel`: the policy's backbone, copied
from the policy when RL starts, and a head; its own optimizer), or a head on the policy's own
backbone (`add_value_head`; the value loss joins the policy's). Either way the head starts at zero,
so the first step's advantages are the returns themselves, and the value at position t (the hidden
state after token t) is the estimate before token t + 1: aligned with token_logprobs, [B, T-1].
"""
from __future__ import annotations

import torch

from learner.logits import final_hidden_states

# The shared head's name in the policy's module: its parameters stay out of the weights pushed to
# the rollout engines and of the Hugging Face export (`policy_state`).
VALUE_HEAD = "value_head"


def _head(hidden_size: int) -> torch.nn.Linear:
    head = torch.nn.Linear(hidden_size, 1)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    return head


class ValueModel(torch.nn.Module):
    """A causal LM's backbone (its decoder without the language-model head) and a scalar head."""

    def __init__(self, causal_lm):
        super().__init__()
        self.backbone = causal_lm.base_model
        self.value_head = _head(causal_lm.config.hidden_size)

    def forward(self, **inputs) -> torch.Tensor:
        """Values [B, T-1], aligned with the next-token logprobs, of a PackedBatch's `model_inputs`."""
        hidden = self.backbone(**inputs).last_hidden_state
        return self.value_head(hidden).squeeze(-1)[:, :-1]


def add_value_head(causal_lm) -> None:
    """A scalar head on the policy's backbone (value_model shared), as a submodule named VALUE_HEAD."""
    causal_lm.add_module(VALUE_HEAD, _head(causal_lm.config.hidden_size).to(causal_lm.dtype))


def hidden_and_values(forward, causal_lm, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward pass (`forward`: `causal_lm` or the engine that wraps it) of a policy with a
    shared head: its final hidden states (for learner.logits) and its values [B, T-1], the head on
    the last hidden state (after the final norm, as the language-model head sees it)."""
    hidden = final_hidden_states(forward, causal_lm, inputs)
    return hidden, getattr(causal_lm, VALUE_HEAD)(hidden).squeeze(-1)[:, :-1]


def policy_state(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The policy's own tensors of a state dict: without a shared value head's."""
    return {name: t for name, t in named.items() if not name.startswith(VALUE_HEAD + ".")}
