"""The algorithm seam: a step's scored trajectories, k per prompt, become training sequences with
per-token advantages, the groups kept, and the step's metrics.

Pure functions of tensors and plain data (no Ray): everything between "rewards arrived" and
"sequences go to the learner" is here, so that the learner applies one loss whatever the
algorithm, and the controller calls one function. The reward a trajectory is judged by is its
outcome, shaped here (KL in the reward, the critic's term); advantages come from an estimator of
learner/advantages.py, made per token by the dense term, whitened over the kept groups.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.nn.utils.rnn import pad_sequence

from learner.advantages import compute_advantages, dense_advantages, informative_groups, overlong_penalty, whiten
from learner.batch import TrainSequence
from learner.config import LearnerConfig
from rollout_workers.types import Trajectory


@dataclass
class StepSamples:
    """What the algorithm needs of a step: G prompt groups of k trajectories."""

    sequences: list[list[list[TrainSequence]]]  # [G][k][turns]: each turn as a sequence, advantages unset
    rewards: torch.Tensor  # [G, k]: each trajectory's outcome reward
    token_rewards: list[list[list[float]]] | None = None  # [G][k]: per completion token (single-turn trajectories)
    turn_kl: list[float] | None = None  # each turn's summed KL to the reference, in the order of `flat()`
    critic_p_passed: torch.Tensor | None = None  # [G, k]: the critic's P(passed) of each trajectory

    def flat(self) -> list[TrainSequence]:
        return [seq for group in self.sequences for trajectory in group for seq in trajectory]


@dataclass
class Batch:
    groups: list[list[TrainSequence]]  # the kept groups' sequences, with advantages (trajectory by trajectory)
    kept: torch.Tensor  # [G] bool
    rewards: torch.Tensor  # [G, k]: the shaped rewards the advantages came from
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def sequences(self) -> list[TrainSequence]:
        return [seq for group in self.groups for seq in group]


def to_sequences(groups: list[list[Trajectory]], token_rewards: bool = False) -> StepSamples:
    """StepSamples of trajectories grouped k per prompt; with `token_rewards`, each (single-turn)
    trajectory's per-token rewards, which must match its tokens."""
    sequences = [[[TrainSequence(turn.prompt_ids, turn.token_ids, turn.sampler_logprobs, mask=turn.policy_mask, truncated=turn.truncated)
                   for turn in trajectory.turns] for trajectory in group] for group in groups]
    rewards = torch.tensor([[t.outcome.total for t in group] for group in groups])
    samples = StepSamples(sequences, rewards)
    if token_rewards:
        samples.token_rewards = [[_token_rewards(t, g, j) for j, t in enumerate(group)] for g, group in enumerate(groups)]
    return samples


def _token_rewards(trajectory: Trajectory, g: int, j: int) -> list[float]:
    where = f"group {g} ({trajectory.task.id!r}), sample {j}"
    if len(trajectory.turns) != 1:
        raise ValueError(f"{where}: per-token rewards need single-turn trajectories, got {len(trajectory.turns)} turns")
    turn = trajectory.turns[0]
    rewards = turn.reward.token_rewards if turn.reward is not None else None
    if rewards is None or len(rewards) != len(turn.token_ids):
        got = "no" if rewards is None else len(rewards)
        raise ValueError(f"{where}: the reward service gave {got} token rewards for {len(turn.token_ids)} completion tokens")
    return rewards


def build_batch(samples: StepSamples, config: LearnerConfig, step: int, critic_coef: float = 0.0,
                max_new_tokens: int | None = None) -> Batch:
    """Per-token advantages of every turn of the kept groups (each turn of a trajectory with the
    trajectory's advantage), and the step's algorithm metrics. `max_new_tokens` (the rollout's) is
    needed by the overlong penalty."""
    rewards, metrics = samples.rewards, {}
    groups, k = rewards.shape
    turns = samples.flat()
    metrics["truncated_fraction"] = sum(seq.truncated for seq in turns) / max(len(turns), 1)
    if config.overlong_buffer:
        # a reward term of each trajectory: the sum of its turns' penalties (one turn: DAPO's)
        if max_new_tokens is None:
            raise ValueError("learner.overlong_buffer: the rollout's max_new_tokens is needed")
        lengths = [torch.tensor([len(seq.completion_ids) for seq in trajectory]) for group in samples.sequences for trajectory in group]
        penalty = torch.stack([overlong_penalty(n, max_new_tokens, config.overlong_buffer, config.overlong_penalty).sum()
                               for n in lengths]).view(groups, k)
        rewards = rewards + penalty
        metrics["overlong_penalty_mean"] = float(penalty.mean())
    kl_coef = config.kl_coef_at(step)
    if config.kl_in == "reward" and kl_coef > 0:
        if samples.turn_kl is None:
            raise ValueError("learner.kl_in is 'reward': the turns' KL to the reference is needed")
        turns = iter(samples.turn_kl)
        sequence_kl = torch.tensor([[sum(next(turns) for _ in trajectory) for trajectory in group] for group in samples.sequences])
        rewards = rewards - kl_coef * sequence_kl
        metrics["kl_sequence_mean"] = float(sequence_kl.mean())
    if critic_coef > 0:
        rewards = rewards + critic_coef * samples.critic_p_passed
    advantages = compute_advantages(config.advantage_estimator, rewards)
    if config.filter_uninformative and config.advantage_estimator != "reinforce":
        # by outcome: shaping terms alone (KL, the critic's, length) do not make a group informative
        # about its task (DAPO filters by accuracy too); the same test decides refills
        keep = informative_groups(samples.rewards)
    else:
        keep = torch.ones(groups, dtype=torch.bool)
    token_advantages = None
    if config.dense_rewards:
        # per token: the RLOO advantage plus the leave-one-out reward-to-go of the service's
        # per-token rewards, whitened over the kept groups' tokens
        if samples.token_rewards is None:
            raise ValueError("learner.dense_rewards: the trajectories' per-token rewards are needed")
        per_token = pad_sequence([torch.tensor(r) for group in samples.token_rewards for r in group], batch_first=True).view(groups, k, -1)
        lengths = torch.tensor([len(r) for group in samples.token_rewards for r in group]).view(groups, k, 1)
        mask = torch.arange(per_token.shape[-1]) < lengths
        token_advantages = dense_advantages(advantages, per_token, mask, config.dense_coef, config.dense_gamma)
        metrics["dense_advantage_abs_mean"] = float((token_advantages - advantages.unsqueeze(-1))[mask].abs().mean())
        if config.normalize_advantages and keep.any():
            kept_tokens = mask & keep.view(-1, 1, 1)
            token_advantages[kept_tokens] = whiten(token_advantages[kept_tokens])
    elif config.normalize_advantages and keep.any():
        advantages[keep] = whiten(advantages[keep])
    kept = []
    for g in keep.nonzero().flatten().tolist():
        for j, trajectory in enumerate(samples.sequences[g]):
            for seq in trajectory:
                n = len(seq.completion_ids)
                seq.advantages = token_advantages[g, j, :n].tolist() if token_advantages is not None else [float(advantages[g, j])] * n
                if config.mask_truncated and seq.truncated:
                    seq.mask = [False] * n  # out of the loss; its reward still counted in the baseline
        kept.append([seq for trajectory in samples.sequences[g] for seq in trajectory])
    metrics["groups_filtered"] = int((~keep).sum())
    return Batch(kept, keep, rewards, metrics)
