"""Refinement through the real parts (vLLM, the reward service and its sandbox pool, DeepSpeed):
the strategy's trajectories and what the algorithm makes of them, a short training run's
per-round metrics, and the eval command's pass@1 by round."""
import json

import pytest
import ray

from coderloo.config import load_config
from coderloo.controller import train
from coderloo.metrics import read_metrics
from coderloo.tasksets.synthetic import synthetic_suite
from learner.algorithm import build_batch, to_sequences
from learner.config import LearnerConfig
from reward_service.client import RewardClient
from rollout_workers import GenerationParams, RolloutGroup, start_workers
from rollout_workers.config import RefineConfig, RolloutConfig
from rollout_workers.strategies import Refinement

ROUNDS, K = 3, 4


def test_refinement_trajectories_reach_the_batch_with_their_advantage(ray_cluster, tiny_model):
    config = load_config("configs/default.yaml", [])
    rewards = RewardClient(config.reward)
    workers = start_workers(str(tiny_model), RolloutConfig(threads=1), seed=0)
    try:
        strategy = Refinement(RolloutGroup(workers), rewards, RefineConfig(enabled=True, rounds=ROUNDS))
        tasks = synthetic_suite()["train"][:2]
        rollouts = strategy.run(tasks, GenerationParams(n=K, max_new_tokens=16, stop=config.rollout.stop), seed=3)
    finally:
        for w in workers:
            ray.kill(w)
        rewards.close()
    trajectories = rollouts.trajectories()
    assert len(trajectories) == 2 * K and sum(len(t.turns) for t in trajectories) > 2 * K  # the untrained model fails: round 2 happened
    for t in trajectories:
        # a later attempt only while none has passed; it stops at a pass or at ROUNDS
        outcomes = [turn.reward.passed for turn in t.turns]
        assert not any(outcomes[:-1]) and len(t.turns) <= ROUNDS and (outcomes[-1] or len(t.turns) == ROUNDS)
        assert t.outcome is t.turns[-1].reward
        assert all(later.prompt_ids != t.turns[0].prompt_ids for later in t.turns[1:])  # its own prompt, with the feedback
    rates = [rollouts.metrics[f"pass@1_round{r}"] for r in range(1, ROUNDS + 1)]
    assert rates == sorted(rates) and rollouts.metrics["rounds_mean"] == sum(len(t.turns) for t in trajectories) / len(trajectories)
    # every turn of a trajectory trains with the trajectory's advantage
    samples = to_sequences(rollouts.groups)
    samples.turn_kl = [[0.01 * i] + [0.0] * (len(seq.completion_ids) - 1) for i, seq in enumerate(samples.flat())]  # sets apart groups whose outcomes all fail
    batch = build_batch(samples, LearnerConfig(kl_coef=0.5, kl_in="reward", filter_uninformative=False), step=1)
    sequences = iter(batch.sequences)
    for t in trajectories:
        advantages = [next(sequences).advantages for _ in t.turns]
        assert len({a[0] for a in advantages}) == 1 and all(len(set(a)) == 1 for a in advantages)


def test_refinement_training_run(ray_cluster, tiny_model, tmp_path):
    out = tmp_path / "run"
    config = load_config("configs/default.yaml", [
        f"model.path={tiny_model}", f"train.output_dir={out}",
        "refine.enabled=true", f"refine.rounds={ROUNDS}",
        "sft.steps=2", "sft.batch_size=8", "train.steps=2", "train.prompts_per_step=2", "train.eval_every=0", "train.checkpoint_every=0",
        f"rollout.samples_per_prompt={K}", "rollout.max_new_tokens=16",
        # a trajectory's KL sums its attempts; after SFT, it sets the trajectories apart even where all fail
        "learner.optimizer_steps=1", "learner.kl_coef=0.05", "learner.kl_in=reward",
        "learner.filter_uninformative=false",
        "tasks.max_eval_tasks=3", "eval.samples_per_task=2", "eval.k=[1]", "eval.greedy=false",
    ])
    summary = train(config)
    rl = [r for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "rl"]
    assert len(rl) == 2
    for record in rl:
        rates = [record[f"pass@1_round{r}"] for r in range(1, ROUNDS + 1)]
        assert rates == sorted(rates) and rates[-1] == record["pass_rate"]  # the outcome is the last attempt's
        assert 1.0 < record["rounds_mean"] <= ROUNDS and record["time_refine_s"] > 0
        assert record["grad_norm"] > 0 and "kl_sequence_mean" in record
    evals = [r for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "eval"]
    assert len(evals) == 3
    for record in evals:
        rates = [record[f"pass@1_round{r}"] for r in range(1, ROUNDS + 1)]
        assert rates == sorted(rates) and rates[-1] == pytest.approx(record["pass@1"]) and rates[-1] <= 1.0
    assert "pass@1_round3" in summary["final"]


def test_eval_command_reports_pass_at_1_by_round(ray_cluster, tiny_model, tmp_path):
    from coderloo.cli import main

    out = tmp_path / "report.json"
    args = ["eval", "--model", str(tiny_model), "--out", str(out), "refine.enabled=true", "refine.rounds=3",
            "tasks.max_eval_tasks=3", "eval.samples_per_task=2", "eval.k=[1]", "eval.greedy=false", "eval.max_new_tokens=16"]
    assert main(args) == 0
    report = json.loads(out.read_text())
    rates = [report[f"pass@1_round{r}"] for r in (1, 2, 3)]
    assert rates == sorted(rates) and rates[-1] == pytest.approx(report["pass@1"])  # pass@1 is the trajectories' outcome
