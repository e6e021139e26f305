"""Held-out evaluation through a rollout strategy: pass@k with the unbiased estimator, greedy
pass@1, the pass rate by difficulty and by task family, and with a critic, critic-guided
best-of-n against a random pick of the same samples."""
from __future__ import annotations

from collections.abc import Callable
from math import comb

import numpy as np
from tqdm import tqdm

from coderloo.config import EvalConfig
from learner.critic import OnlineCritic
from reward_service.tasks import Task
from rollout_workers import GenerationParams
from rollout_workers.strategies import RolloutStrategy
from rollout_workers.types import Trajectory, last_answer


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


def pass_rate_by(tasks: list[Task], passed: np.ndarray, key: Callable[[Task], object]) -> dict[str, float]:
    """The pass rate of the tasks' samples (row i of `passed` holds task i's) for each value of
    `key`, keyed by its string: JSON object keys, whatever the value's type. Tasks whose key is
    None are left out."""
    rows: dict[str, list[np.ndarray]] = {}
    for task, row in zip(tasks, passed, strict=True):
        if (value := key(task)) is not None:
            rows.setdefault(str(value), []).append(row)
    return {name: float(np.mean(rows[name])) for name in sorted(rows)}


def evaluate(
    strategy: RolloutStrategy, tasks: list[Task], config: EvalConfig, max_new_tokens: int, stop: list[str],
    seed: int | None = None, critic: OnlineCritic | None = None, label: str = "eval", single: RolloutStrategy | None = None,
    random_choice: RolloutStrategy | None = None, out: list[Trajectory] | None = None,
) -> dict[str, float | dict[str, float]]:
    """Held-out metrics of the trajectories `strategy` makes for `tasks`, judged by their outcomes:
    pass@k from `config.samples_per_task` samples each (with `config.sampled`), greedy pass@1
    (with `config.greedy`), and what the strategy measured of the sampled ones (multi-turn:
    pass@1 within 1..R attempts, pass@1_round1..R, never falling, round 1 the first attempts; turns
    and tool calls per trajectory). With `single` (a single-attempt strategy on the same policy,
    for the interpreter; refinement's round 1 is its single attempt), its pass@1 from as many samples with the same seed
    (single_turn_pass@1), and greedy (single_turn_greedy_pass@1). With `random_choice` (for
    refinement whose critic chooses which failed attempts go on: the same refinement choosing at
    random), its pass@1 from as many samples with the same seed (pass@1_random_choice).

    With a `critic`, pass@1 of its pick among each task's first `select_n` samples
    (pass@1_critic), of a uniformly random pick among the same ones (pass@1_random), of a majority
    vote among them (pass@1_vote) and of a vote weighted by the critic (pass@1_critic_vote).
    With `out`, the greedy trajectories are appended to it, one per task, or without a greedy
    evaluation the sampled ones, `samples_per_task` per task.

    And the pass rate by difficulty level (by_difficulty), by task family (by_family) and by kind
    of test (by_kind: assert, stdio, call) of the sampled evaluation's samples, or of the greedy
    ones when there is no sampled evaluation; and, for the tasks that have them, by the source's
    own difficulty name (by_level) and by month of publication (by_month, 'YYYY-MM').

    A progress bar named `label` counts the tasks whose samples are generated; it takes the line
    of the training's bar while it runs (nested, it would add a line per update to a log file)."""
    metrics: dict[str, float | dict[str, float]] = {}
    breakdown = None  # (tasks, samples) passed, for the pass rates by difficulty and family
    if config.sampled:
        breakdown = _sampled(metrics, strategy, tasks, config, max_new_tokens, stop, seed, critic, label, single, random_choice,
                             None if config.greedy else out)
    if config.greedy:
        params = GenerationParams(n=1, max_new_tokens=max_new_tokens, temperature=0.0, stop=stop)
        groups = _groups(strategy, tasks, params, None, f"{label}: greedy")
        greedy = np.array([[t.outcome.passed for t in group] for group in groups])
        if out is not None:
            out += [group[0] for group in groups]
        metrics["greedy_pass@1"] = float(greedy.mean())
        breakdown = greedy if breakdown is None else breakdown
        if single is not None:
            alone = single.run(tasks, params, None)
            metrics["single_turn_greedy_pass@1"] = float(np.mean([[t.outcome.passed for t in group] for group in alone.groups]))
    if breakdown is not None:
        metrics.update(_pass_rates_by_task(tasks, breakdown))
    return metrics


def _sampled(metrics: dict, strategy: RolloutStrategy, tasks: list[Task], config: EvalConfig, max_new_tokens: int, stop: list[str],
             seed: int | None, critic: OnlineCritic | None, label: str, single: RolloutStrategy | None,
             random_choice: RolloutStrategy | None, out: list[Trajectory] | None) -> np.ndarray:
    """The sampled evaluation's metrics into `metrics` (see `evaluate`), its trajectories onto `out`;
    its samples passed, a row per task."""
    n = config.samples_per_task
    params = GenerationParams(n=n, max_new_tokens=max_new_tokens, temperature=config.temperature, stop=stop)
    with tqdm(total=len(tasks), desc=f"{label}: {n} samples", unit="task", leave=False, position=0, dynamic_ncols=True) as bar:
        rollouts = strategy.run(tasks, params, seed, bar.update)
    if out is not None:
        out += rollouts.trajectories()
    metrics.update({key: value for key, value in rollouts.metrics.items()
                    if key.startswith("pass@") or key in ("turns_mean", "tool_calls_mean")})
    passed = np.array([[t.outcome.passed for t in group] for group in rollouts.groups])
    metrics.update({f"pass@{k}": float(np.mean([pass_at_k(n, int(c), k) for c in passed.sum(axis=1)])) for k in config.k})
    if critic is not None:
        metrics.update(_critic_picks(critic, rollouts.groups, passed))
    if single is not None:
        metrics["single_turn_pass@1"] = float(_passed(single, tasks, params, seed, f"{label}: {n} single-turn samples").mean())
    if random_choice is not None:
        metrics["pass@1_random_choice"] = float(_passed(random_choice, tasks, params, seed, f"{label}: refined by a random choice").mean())
    return passed


def _passed(strategy: RolloutStrategy, tasks: list[Task], params: GenerationParams, seed: int | None, desc: str) -> np.ndarray:
    """Whether each of the trajectories `strategy` makes passed, a row per task (a progress bar named `desc`)."""
    return np.array([[t.outcome.passed for t in group] for group in _groups(strategy, tasks, params, seed, desc)])


def _groups(strategy: RolloutStrategy, tasks: list[Task], params: GenerationParams, seed: int | None, desc: str) -> list[list[Trajectory]]:
    with tqdm(total=len(tasks), desc=desc, unit="task", leave=False, position=0, dynamic_ncols=True) as bar:
        return strategy.run(tasks, params, seed, bar.update).groups


def _critic_picks(critic: OnlineCritic, groups: list, passed: np.ndarray) -> dict[str, float]:
    """pass@1 of the critic's pick among each task's first `select_n` samples, of a random pick, a
    majority vote and a vote weighted by the critic among the same ones."""
    m = critic.config.select_n
    prompts, programs = zip(*(last_answer(t.turns) for group in groups for t in group[:m]), strict=True)
    odds = critic.log_odds(list(prompts), list(programs)).reshape(len(groups), m)
    p_passed = 1 / (1 + np.exp(-odds))
    texts = [[t.turns[-1].text for t in group[:m]] for group in groups]
    return {
        "pass@1_critic": pass_rate_of_pick(passed[:, :m], odds),  # the log-odds order what P(passed) may round to ties
        "pass@1_vote": pass_rate_of_pick(passed[:, :m], vote_scores(texts, np.ones_like(p_passed))),
        "pass@1_critic_vote": pass_rate_of_pick(passed[:, :m], vote_scores(texts, p_passed)),
        "pass@1_random": float(passed[:, :m].mean()),
    }


def _pass_rates_by_task(tasks: list[Task], passed: np.ndarray) -> dict[str, dict[str, float]]:
    """The pass rates by difficulty, family and kind of test; by the source's level and by month of
    publication when the tasks have them."""
    rates = {
        "by_difficulty": pass_rate_by(tasks, passed, lambda task: task.difficulty),
        "by_family": pass_rate_by(tasks, passed, lambda task: task.family),
        "by_kind": pass_rate_by(tasks, passed, lambda task: task.test_kind),
    }
    optional = {"by_level": pass_rate_by(tasks, passed, lambda task: task.level),
                "by_month": pass_rate_by(tasks, passed, lambda task: task.date and f"{task.date:%Y-%m}")}
    return {**rates, **{name: by for name, by in optional.items() if by}}
