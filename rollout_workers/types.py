"""Types that cross the rollout workers' border."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GenerationParams:
    n: int = 1  # samples per prompt
    max_new_tokens: int = 48
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    # A prompt longer than the engine's context minus max_new_tokens keeps only its last tokens
    # (refinement's feedback prompts: the task's prompt is at their end). Off: the engine refuses it.
    truncate_prompt_left: bool = False


def prompt_room(context: int, params: GenerationParams) -> int:
    """The most prompt tokens that leave room for max_new_tokens in a context of `context` tokens."""
    room = context - params.max_new_tokens
    if room < 1:
        raise ValueError(f"max_new_tokens={params.max_new_tokens} leaves no room for a prompt in the engine's "
                         f"context of {context} tokens (rollout.max_model_len)")
    return room


@dataclass
class Sample:
    """One completion: the sampled tokens, the sampler's logprob of each, and the policy version."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (EOS or a stop sequence) or "length"
    policy_version: int


@dataclass
class PromptRollout:
    prompt_ids: list[int]
    samples: list[Sample]
