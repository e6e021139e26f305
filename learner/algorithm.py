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

from learner.advantages import (
    compute_advantages, dense_advantages, explained_variance, gae, informative_groups, overlong_penalty, whiten, whitening_divisor,
)
from learner.batch import TrainSequence
from learner.config import LearnerConfig
from rollout_workers.types import Trajectory


@dataclass
class StepSamples:
    """What the algorithm needs of a step: G prompt groups of k trajectories."""

    sequences: list[list[list[TrainSequence]]]  # [G][k][turns]: each turn as a sequence, advantages unset
    rewards: torch.Tensor  # [G, k]: each trajectory's outcome reward
    token_rewards: list[list[list[float]]] | None = None  # [G][k]: per completion token (single-turn trajectories)
    token_penalties: list[list[list[float] | None]] | None = None  # [G][k]: the lint and syntax part of token_rewards
    turn_kl: list[list[float]] | None = None  # each turn's KL to the reference per completion token, in the order of `flat()`
    turn_values: list[list[float]] | None = None  # PPO: each turn's value estimates per completion token, likewise
    critic_p_passed: torch.Tensor | None = None  # [G, k]: the critic's P(passed) of each trajectory
    turn_counts: torch.Tensor | None = None  # [G, k]: each trajectory's policy turns (its sequences may be fewer: concat)

    def flat(self) -> list[TrainSequence]:
        return [seq for group in self.sequences for trajectory in group for seq in trajectory]


@dataclass
class Batch:
    groups: list[list[TrainSequence]]  # the kept groups' sequences, with advantages (trajectory by trajectory)
    kept: torch.Tensor  # [G] bool
    rewards: torch.Tensor  # [G, k]: the shaped rewards the advantages came from
    metrics: dict[str, float] = field(default_factory=dict)
    divisor: float = 1.0  # what the advantages were whitened by over the batch (1: not whitened)

    @property
    def sequences(self) -> list[TrainSequence]:
        return [seq for group in self.groups for seq in group]


def to_sequences(groups: list[list[Trajectory]], token_rewards: bool = False, concat: bool = False) -> StepSamples:
    """StepSamples of trajectories grouped k per prompt: each turn a sequence (its whole context
    as the prompt), or with `concat` each trajectory one sequence (`concatenated`). With
    `token_rewards`, each (single-turn) trajectory's per-token rewards, which must match its tokens."""
    def sequences(trajectory: Trajectory) -> list[TrainSequence]:
        if concat:
            return [concatenated(trajectory)]
        return [TrainSequence(turn.prompt_ids, turn.token_ids, turn.sampler_logprobs, mask=turn.policy_mask, truncated=turn.truncated)
                for turn in trajectory.turns]

    rewards = torch.tensor([[t.outcome.total for t in group] for group in groups])
    samples = StepSamples([[sequences(t) for t in group] for group in groups], rewards,
                          turn_counts=torch.tensor([[len(t.turns) for t in group] for group in groups]))
    if token_rewards:
        samples.token_rewards = [[_token_rewards(t, g, j) for j, t in enumerate(group)] for g, group in enumerate(groups)]
        samples.token_penalties = [[t.turns[0].reward.token_penalties for t in group] for group in groups]
    return samples


def concatenated(trajectory: Trajectory) -> TrainSequence:
    """A trajectory as one sequence: its first prompt, then each turn's tokens and the observation
    after it (the tokens by which the next turn's context is longer), the observations masked out
    of the loss with sampler logprob 0. Truncated if any of its turns was."""
    turns = trajectory.turns
    completion, logprobs, mask = [], [], []
    for i, turn in enumerate(turns):
        completion += turn.token_ids
        logprobs += turn.sampler_logprobs
        mask += turn.policy_mask
        if i + 1 < len(turns):
            context, after = turns[i + 1].prompt_ids, len(turn.prompt_ids) + len(turn.token_ids)
            if context[:after] != turn.prompt_ids + turn.token_ids:
                raise ValueError(f"task {trajectory.task.id!r}: turn {i + 2}'s context does not continue turn {i + 1}'s "
                                 "(a strategy that rewrites its prompts trains as turns, not concat)")
            observation = context[after:]
            completion += observation
            logprobs += [0.0] * len(observation)
            mask += [False] * len(observation)
    return TrainSequence(turns[0].prompt_ids, completion, logprobs, mask=mask, truncated=any(t.truncated for t in turns))


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
                max_new_tokens: int | None = None, turn_cost: float = 0.0, whitened: bool = True) -> Batch:
    """Per-token advantages of every turn of the kept groups (each turn of a trajectory with the
    trajectory's advantage), and the step's algorithm metrics. `max_new_tokens` (the rollout's) is
    needed by the overlong penalty; `turn_cost` is subtracted from a trajectory's reward per turn
    after its first. Not `whitened`: learner.advantage.normalize is left to the caller (a streamed
    group, whose batch is not whole yet)."""
    rewards, metrics = samples.rewards, {}
    if turn_cost:
        if samples.turn_counts is None:
            raise ValueError("turn_cost: the trajectories' turn counts are needed")
        penalty = turn_cost * (samples.turn_counts - 1)
        rewards = rewards - penalty
        metrics["turn_cost_mean"] = float(penalty.float().mean())
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
    kl_in_reward = config.kl is not None and config.kl.into == "reward" and kl_coef > 0
    if kl_in_reward:
        if samples.turn_kl is None:
            raise ValueError("learner.kl.into is 'reward': the turns' KL to the reference is needed")
        turns = iter(samples.turn_kl)
        sequence_kl = torch.tensor([[sum(_policy_sum(seq, next(turns)) for seq in trajectory) for trajectory in group]
                                    for group in samples.sequences])
        metrics["kl_sequence_mean"] = float(sequence_kl.mean())
        if config.advantage.type != "ppo":  # PPO's is per token, in its rewards
            rewards = rewards - kl_coef * sequence_kl
    if critic_coef > 0:
        rewards = rewards + critic_coef * samples.critic_p_passed
    estimator = config.advantage
    if estimator.type == "ppo":
        return _ppo_batch(samples, rewards, config, kl_coef if kl_in_reward else 0.0, metrics)
    advantages = compute_advantages(estimator.type, rewards)
    if config.filters_groups:
        # by outcome: shaping terms alone (KL, the critic's, length) do not make a group informative
        # about its task (DAPO filters by accuracy too); the same test decides refills
        keep = informative_groups(samples.rewards)
    else:
        keep = torch.ones(groups, dtype=torch.bool)
    token_advantages, divisor = None, 1.0
    if config.dense_rewards:
        dense = estimator.dense
        # per token: the RLOO advantage plus the leave-one-out reward-to-go of the service's
        # per-token rewards, whitened over the kept groups' tokens
        if samples.token_rewards is None:
            raise ValueError("learner.advantage.dense: the trajectories' per-token rewards are needed")
        per_token = pad_sequence([torch.tensor(r) for group in samples.token_rewards for r in group], batch_first=True).view(groups, k, -1)
        lengths = torch.tensor([len(r) for group in samples.token_rewards for r in group]).view(groups, k, 1)
        mask = torch.arange(per_token.shape[-1]) < lengths
        token_advantages = dense_advantages(advantages, per_token, mask, dense.coef, dense.gamma)
        metrics["dense_advantage_abs_mean"] = float((token_advantages - advantages.unsqueeze(-1))[mask].abs().mean())
        if estimator.normalize and whitened and keep.any():
            kept_tokens = mask & keep.view(-1, 1, 1)
            divisor = float(whitening_divisor(token_advantages[kept_tokens]))
            token_advantages[kept_tokens] = whiten(token_advantages[kept_tokens])
    elif estimator.normalize and whitened and keep.any():
        divisor = float(whitening_divisor(advantages[keep]))
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
    return Batch(kept, keep, rewards, metrics, divisor)


def _policy_sum(seq: TrainSequence, values: list[float]) -> float:
    """The sum of per-token `values` over the tokens the policy produced."""
    return sum(v for v, own in zip(values, seq.mask or [True] * len(values)) if own)


def _ppo_batch(samples: StepSamples, rewards: torch.Tensor, config: LearnerConfig, kl_coef: float, metrics: dict) -> Batch:
    """PPO: per-token advantages and returns by GAE over each trajectory's policy tokens, in order
    (a multi-turn trajectory's turns are one episode; an environment's tokens are not steps).

    A step's reward is -kl_coef x its KL to the reference (kl.into reward), plus with dense_rewards the
    service's lint and syntax penalties on the tokens that caused them, plus the trajectory's reward at
    its last token (less those penalties: a trajectory's step rewards sum to its reward and its KL
    term). Every group is kept (the value model is the baseline); advantages are whitened over the
    batch's steps, mean included, as TRL and OpenRLHF do.
    """
    if samples.turn_values is None:
        raise ValueError("advantage ppo: the value model's estimates of the turns are needed")
    groups, k = rewards.shape
    estimator = config.advantage
    values_of = iter(samples.turn_values)
    kl_of = iter(samples.turn_kl) if kl_coef else None
    steps = []  # per trajectory: its (sequence, token index) steps, their rewards and values
    for g, group in enumerate(samples.sequences):
        for j, trajectory in enumerate(group):
            where, step_rewards, step_values = [], [], []
            for seq in trajectory:
                values, kl = next(values_of), next(kl_of) if kl_of else None
                for t in range(len(seq.completion_ids)):
                    if seq.mask is None or seq.mask[t]:
                        where.append((seq, t))
                        step_values.append(values[t])
                        step_rewards.append(-kl_coef * kl[t] if kl is not None else 0.0)
            outcome = float(rewards[g, j])
            if estimator.dense_rewards:
                if samples.token_penalties is None:
                    raise ValueError("learner.advantage.dense_rewards: the trajectories' per-token penalties are needed")
                penalties = samples.token_penalties[g][j]
                if penalties is None or len(penalties) != len(trajectory[0].completion_ids):
                    raise ValueError(f"group {g}, sample {j}: ppo with dense_rewards needs the reward service's token penalties "
                                     f"for its {len(trajectory[0].completion_ids)} completion tokens")
                for i, (_, t) in enumerate(where):
                    step_rewards[i] += penalties[t]
                outcome -= sum(penalties[t] for _, t in where)
            if where:
                step_rewards[-1] += outcome
            steps.append((where, step_rewards, step_values))
    longest = max((len(w) for w, _, _ in steps), default=0)
    if longest == 0:
        raise ValueError("advantage ppo: no trajectory of the step has a policy token")
    step_rewards = torch.zeros(len(steps), longest)
    step_values = torch.zeros(len(steps), longest)
    mask = torch.zeros(len(steps), longest, dtype=torch.bool)
    for i, (where, r, v) in enumerate(steps):
        step_rewards[i, : len(r)], step_values[i, : len(v)], mask[i, : len(r)] = torch.tensor(r), torch.tensor(v), True
    advantages, returns = gae(step_rewards, step_values, mask, estimator.gae_gamma, estimator.gae_lambda)
    metrics.update(
        explained_variance=explained_variance(step_values[mask], returns[mask]),
        value_estimate_mean=float(step_values[mask].mean()), return_mean=float(returns[mask].mean()),
        advantage_abs_mean=float(advantages[mask].abs().mean()), groups_filtered=0,
    )
    if estimator.normalize:
        advantages[mask] = whiten(advantages[mask], shift_mean=True)
    for seq in samples.flat():
        n = len(seq.completion_ids)
        seq.advantages, seq.returns = [0.0] * n, [0.0] * n
    values_of = iter(samples.turn_values)
    for seq in samples.flat():
        seq.values = list(next(values_of))
    for i, (where, _, _) in enumerate(steps):
        for s, (seq, t) in enumerate(where):
            seq.advantages[t], seq.returns[t] = float(advantages[i, s]), float(returns[i, s])
    for seq in samples.flat():
        if config.mask_truncated and seq.truncated:
            seq.mask = [False] * len(seq.completion_ids)
    kept = [[seq for trajectory in group for seq in trajectory] for group in samples.sequences]
    return Batch(kept, torch.ones(groups, dtype=torch.bool), rewards, metrics)
