"""Held-out evaluation: pass@k with the unbiased estimator, and greedy pass@1."""
from __future__ import annotations

from math import comb

import numpy as np

from coderloo.tasksets.task import Task
from reward_service.client import RewardClient
from rollout_workers import GenerationParams, RolloutGroup


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn from n (c of them correct) is correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def evaluate(
    rollouts_group: RolloutGroup,
    rewards_service: RewardClient,
    tasks: list[Task],
    n: int,
    ks: list[int],
    temperature: float,
    max_new_tokens: int,
    stop: list[str],
    greedy: bool,
    seed: int | None = None,
    sampled: bool = True,
) -> dict[str, float]:
    """pass@k over `tasks` from n samples each (unless not `sampled`); with `greedy`, also greedy pass@1."""
    prompts = [t.prompt for t in tasks]
    metrics: dict[str, float] = {}
    if sampled:
        params = GenerationParams(n=n, max_new_tokens=max_new_tokens, temperature=temperature, stop=stop)
        rollouts = rollouts_group.generate(prompts, params, seed)
        pairs = [(task, s.text) for task, r in zip(tasks, rollouts) for s in r.samples]
        rewards = rewards_service.score([p[0] for p in pairs], [p[1] for p in pairs])
        correct = np.array([r.passed for r in rewards]).reshape(len(tasks), n).sum(axis=1)
        metrics.update({f"pass@{k}": float(np.mean([pass_at_k(n, int(c), k) for c in correct])) for k in ks})
    if greedy:
        params = GenerationParams(n=1, max_new_tokens=max_new_tokens, temperature=0.0, stop=stop)
        rollouts = rollouts_group.generate(prompts, params)
        rewards = rewards_service.score(tasks, [r.samples[0].text for r in rollouts])
        metrics["greedy_pass@1"] = float(np.mean([r.passed for r in rewards]))
    return metrics
