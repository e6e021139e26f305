"""Types that cross the rollout workers' border: what to sample, what the engine sampled, and the
trajectories a rollout strategy makes of it."""
from __future__ import annotations

from dataclasses import dataclass, field

from reward_service.schemas import ItemReward
from reward_service.tasks import Task


# A prompt is text, or token ids (a multi-turn trajectory's context, which is never re-tokenized).
Prompt = str | list[int]


@dataclass(frozen=True)
class GenerationParams:
    n: int = 1  # samples per prompt
    max_new_tokens: int = 48
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)


# Where each policy version's tokens start in a completion: [(first token's index, version), ...],
# ascending. A push that reaches an engine mid-generation (rollout.update_in_flight) starts a segment.
Segments = list[tuple[int, int]]


@dataclass
class Sample:
    """One completion: the sampled tokens, the sampler's logprob of each, and the policy version
    that sampled its first token (`segments`: the versions of the others, when a push came while it
    was being generated)."""

    token_ids: list[int]
    sampler_logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (EOS or a stop sequence) or "length"
    policy_version: int
    stop: str | None = None  # the stop sequence it ended at (None: EOS, the length, or no stop sequence given)
    segments: Segments | None = None  # two or more; None: every token of policy_version


@dataclass
class PromptRollout:
    prompt_ids: list[int]
    samples: list[Sample]


@dataclass
class Turn:
    """One turn of a trajectory: the context the policy saw, the tokens that followed it, and
    what the turn earned. `policy_mask` marks the tokens the policy produced (an environment's
    tokens inside a turn, such as a tool's output, are not trained on); the sampler's logprob of
    a token it did not produce is 0."""

    prompt_ids: list[int]
    token_ids: list[int]
    sampler_logprobs: list[float]
    policy_mask: list[bool]
    policy_version: int  # the oldest of its tokens' versions (what train.max_staleness bounds)
    text: str
    reward: ItemReward | None = None
    truncated: bool = False  # the engine stopped it at max_new_tokens (finish reason "length")
    segments: Segments | None = None  # the versions of its tokens (Sample.segments); None: all policy_version

    def token_versions(self) -> list[int]:
        """The policy version that sampled each of token_ids."""
        if not self.segments:
            return [self.policy_version] * len(self.token_ids)
        bounds = [start for start, _ in self.segments[1:]] + [len(self.token_ids)]
        return [v for (start, v), end in zip(self.segments, bounds) for _ in range(end - start)]

    @classmethod
    def of(cls, prompt_ids: list[int], sample: Sample, reward: ItemReward | None) -> Turn:
        """A turn that is one sample of the policy, all of it the policy's."""
        return cls(prompt_ids, sample.token_ids, sample.sampler_logprobs, [True] * len(sample.token_ids),
                   sample.policy_version, sample.text, reward, truncated=sample.finish_reason == "length", segments=sample.segments)


@dataclass
class Trajectory:
    """What a rollout strategy made of one sample of a task: its turns and its outcome (the reward
    that RLOO compares among the k trajectories of the task)."""

    task: Task
    turns: list[Turn]
    outcome: ItemReward


def last_answer(turns: list[Turn]) -> tuple[list[int], list[int]]:
    """The last turn's program as one attempt at the task: the first turn's prompt and the last
    turn's tokens (each attempt writes the whole program after the task's prompt again). What
    the critic judges: a program given its task, not the trajectory that led to it, whose length
    tells whether earlier attempts failed the held tests."""
    return turns[0].prompt_ids, turns[-1].token_ids


@dataclass
class Rollouts:
    """A strategy's answer for a step's tasks: k trajectories per task (task-major), and what it
    measured on the way (timings, per-round pass rates)."""

    groups: list[list[Trajectory]]
    metrics: dict[str, float] = field(default_factory=dict)

    def trajectories(self) -> list[Trajectory]:
        return [t for group in self.groups for t in group]

    def extend(self, other: Rollouts) -> None:
        """Add another round's groups (a refill): times and retries add up, other measures are
        averaged over the groups."""
        before, added = len(self.groups), len(other.groups)
        for key, value in other.metrics.items():
            if key.startswith("time_") or key.endswith("_retries"):
                self.metrics[key] = self.metrics.get(key, 0) + value
            else:
                self.metrics[key] = (self.metrics.get(key, value) * before + value * added) / (before + added)
        self.groups = self.groups + other.groups

    def summary(self, version: int) -> dict[str, float]:
        """What the trajectories were: their outcomes, the policy's tokens per trajectory, and how
        many policy versions behind `version` their turns (their oldest tokens) and their policy's
        tokens were sampled."""
        trajectories = self.trajectories()
        outcomes = [t.outcome for t in trajectories]
        turns = [turn for t in trajectories for turn in t.turns]
        staleness = [version - turn.policy_version for turn in turns]
        token_staleness = [version - v for turn in turns for v, mine in zip(turn.token_versions(), turn.policy_mask) if mine]
        return {
            "reward_mean": sum(r.total for r in outcomes) / len(outcomes),
            "pass_rate": sum(r.passed for r in outcomes) / len(outcomes),
            "syntax_rate": sum(r.components.syntax for r in outcomes) / len(outcomes),
            "completion_tokens_mean": sum(sum(turn.policy_mask) for t in trajectories for turn in t.turns) / len(trajectories),
            "completion_tokens_max": max(sum(sum(turn.policy_mask) for turn in t.turns) for t in trajectories),
            "staleness_mean": sum(staleness) / len(staleness),
            "staleness_max": max(staleness),
            "staleness_token_mean": sum(token_staleness) / max(len(token_staleness), 1),
            "updated_in_flight_fraction": sum(turn.segments is not None for turn in turns) / len(turns),
            "samples": len(trajectories),
            **domain_means(outcomes),
        }


def domain_means(outcomes: list[ItemReward]) -> dict[str, float]:
    """The coverage's and each plugged-in reward component's mean score over the items it scored
    (component_<name>_mean)."""
    scores: dict[str, list[float]] = {}
    for r in outcomes:
        for name, value in r.components.shaping().items():
            if value is not None:
                scores.setdefault(name, []).append(value)
    return {f"component_{name}_mean": sum(v) / len(v) for name, v in scores.items()}
