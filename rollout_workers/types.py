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
