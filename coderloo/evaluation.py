"""Held-out evaluation: pass@k with the unbiased estimator, greedy pass@1, and with a critic,
critic-guided best-of-n against a random pick of the same samples."""
from __future__ import annotations

from math import comb

import numpy as np

from coderloo.refine import RefineConfig, pass_rates_by_round, refine
from coderloo.tasksets.task import Task
from learner.critic import OnlineCritic
from reward_service.client import RewardClient
from rollout_workers import GenerationParams, RolloutGroup


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn from n (c of them correct) is correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_rate_of_pick(passed: np.ndarray, scores: np.ndarray) -> float:
    """Pass rate when each task (row) keeps its highest-scoring sample (the first, on a tie)."""
    return float(passed[np.arange(len(passed)), scores.argmax(axis=1)].mean())


def vote_scores(texts: list[list[str]], weights: np.ndarray) -> np.ndarray:
    """Each sample's vote: the summed weight of the task's samples with the same program (up to
    leading and trailing whitespace). With weights 1 it is a majority vote; with the critic's
    P(passed), a program written many times is not outvoted by many distinct wrong ones, each
    with one noisy score, as it is when the single highest score wins."""
    scores = np.zeros_like(weights, dtype=float)
    for row, programs in enumerate(texts):
        keys = [p.strip() for p in programs]
        totals: dict[str, float] = {}
        for key, w in zip(keys, weights[row]):
            totals[key] = totals.get(key, 0.0) + float(w)
        scores[row] = [totals[key] for key in keys]
    return scores


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
    critic: OnlineCritic | None = None,
    refinement: RefineConfig | None = None,
) -> dict[str, float]:
    """pass@k over `tasks` from n samples each (unless not `sampled`); with `greedy`, also greedy
    pass@1; with a `critic`, pass@1 of its pick among each task's first `select_n` samples
    (pass@1_critic), of a uniformly random pick among the same ones (pass@1_random), of a majority
    vote among them (pass@1_vote) and of a vote weighted by the critic (pass@1_critic_vote).

    With `refinement`, pass@1 after each round (pass@1_round1..R): the samples above (the greedy
    one when not `sampled`) are the first attempts, each rewritten from its execution feedback
    until it passes or has made `refinement.rounds` attempts; a trajectory counts at round r if one
    of its first r attempts passed, so the rates never fall, and round 1 is pass@1 itself."""
    prompts = [t.prompt for t in tasks]
    metrics: dict[str, float] = {}
    first_attempts = None  # (params, tasks, completions, rewards) that refinement starts from
    if sampled:
        params = GenerationParams(n=n, max_new_tokens=max_new_tokens, temperature=temperature, stop=stop)
        rollouts = rollouts_group.generate(prompts, params, seed)
        pairs = [(task, s.text) for task, r in zip(tasks, rollouts) for s in r.samples]
        rewards = rewards_service.score([p[0] for p in pairs], [p[1] for p in pairs])
        first_attempts = (params, [p[0] for p in pairs], [p[1] for p in pairs], rewards)
        passed = np.array([r.passed for r in rewards]).reshape(len(tasks), n)
        metrics.update({f"pass@{k}": float(np.mean([pass_at_k(n, int(c), k) for c in passed.sum(axis=1)])) for k in ks})
        if critic is not None:
            m = critic.config.select_n
            p_passed = critic.p_passed([r.prompt_ids for r in rollouts for _ in r.samples[:m]],
                                       [s.token_ids for r in rollouts for s in r.samples[:m]])
            p_passed = p_passed.reshape(len(tasks), m)
            texts = [[s.text for s in r.samples[:m]] for r in rollouts]
            metrics["pass@1_critic"] = pass_rate_of_pick(passed[:, :m], p_passed)
            metrics["pass@1_vote"] = pass_rate_of_pick(passed[:, :m], vote_scores(texts, np.ones_like(p_passed)))
            metrics["pass@1_critic_vote"] = pass_rate_of_pick(passed[:, :m], vote_scores(texts, p_passed))
            metrics["pass@1_random"] = float(passed[:, :m].mean())
    if greedy:
        params = GenerationParams(n=1, max_new_tokens=max_new_tokens, temperature=0.0, stop=stop)
        rollouts = rollouts_group.generate(prompts, params)
        completions = [r.samples[0].text for r in rollouts]
        rewards = rewards_service.score(tasks, completions)
        first_attempts = first_attempts or (params, tasks, completions, rewards)
        metrics["greedy_pass@1"] = float(np.mean([r.passed for r in rewards]))
    if refinement is not None and first_attempts is not None:
        params, flat_tasks, completions, rewards = first_attempts
        later = refine(rollouts_group.generate, rewards_service, flat_tasks, completions, rewards, refinement, params, seed)
        rates = pass_rates_by_round(rewards, later, refinement.rounds)
        metrics.update({f"pass@1_round{r}": rate for r, rate in enumerate(rates, start=1)})
    return metrics
