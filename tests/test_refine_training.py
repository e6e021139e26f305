"""A short training run with multi-round refinement, through Ray, vLLM, DeepSpeed and the sandbox
pool: what each round generated, what reached the learner, and the per-round metrics."""
import json

from coderloo.config import load_config
from coderloo.controller import train
from coderloo.metrics import read_metrics
from coderloo.pipeline import RolloutJob
from learner.group import LearnerGroup

ROUNDS, K = 3, 4


def test_refinement_training_run(ray_cluster, tiny_model, tmp_path, monkeypatch):
    batches, trained = [], []
    wait, train_step = RolloutJob.wait, LearnerGroup.train_step

    def recording_wait(self):
        batches.append(wait(self))
        return batches[-1]

    def recording_train_step(self, sequences, *args, **kwargs):
        trained.append([(s.prompt_ids, s.completion_ids, s.advantage) for s in sequences])
        return train_step(self, sequences, *args, **kwargs)

    monkeypatch.setattr(RolloutJob, "wait", recording_wait)
    monkeypatch.setattr(LearnerGroup, "train_step", recording_train_step)
    out = tmp_path / "run"
    config = load_config("configs/default.yaml", [
        f"model.path={tiny_model}", f"train.output_dir={out}",
        "refine.enabled=true", f"refine.rounds={ROUNDS}",
        "sft.steps=2", "sft.batch_size=8", "train.steps=2", "train.prompts_per_step=2", "train.eval_every=0", "train.checkpoint_every=0",
        f"rollout.samples_per_prompt={K}", "rollout.max_new_tokens=16",
        # a trajectory's KL sums its attempts; after SFT, it sets the trajectories apart even where all fail
        "learner.optimizer_steps=1", "learner.kl_coef=0.05", "learner.kl_in=reward",
        "learner.filter_uninformative=false",  # every group reaches the learner, in order
        "tasks.max_eval_tasks=3", "eval.samples_per_task=2", "eval.k=[1]", "eval.greedy=false",
    ])
    summary = train(config)

    assert len(batches) == 2 and len(trained) == 2
    rl = [r for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "rl"]
    for batch, sequences, record in zip(batches, trained, rl, strict=True):
        first = batch.first_rewards()
        assert len(batch.later) == len(first) == 2 * K
        for t, attempts in enumerate(batch.later):
            # a later round only for a trajectory that has not passed yet; it stops at a pass or at ROUNDS
            outcomes = [first[t].passed] + [a.reward.passed for a in attempts]
            assert not any(outcomes[:-1]) and len(attempts) <= ROUNDS - 1
            assert outcomes[-1] or len(attempts) == ROUNDS - 1
        assert sum(map(len, batch.later)) > 0  # the untrained model fails: round 2 happened
        # what reached the learner: each group's k first attempts, then its trajectories' later
        # attempts (their own prompts, with the feedback) with the trajectory's advantage
        position, later_advantages = 0, []
        for g, rollout in enumerate(batch.rollouts):
            group_first = sequences[position : position + K]
            assert [s[1] for s in group_first] == [s.token_ids for s in rollout.samples]
            position += K
            for j in range(K):
                for attempt in batch.later[g * K + j]:
                    prompt_ids, token_ids, advantage = sequences[position]
                    assert (prompt_ids, token_ids) == (attempt.prompt_ids, attempt.sample.token_ids)
                    assert prompt_ids != rollout.prompt_ids and advantage == group_first[j][2]
                    later_advantages.append(advantage)
                    position += 1
        assert position == len(sequences) and any(a != 0 for a in later_advantages)
        rates = [record[f"pass_rate_round{r}"] for r in range(1, ROUNDS + 1)]
        assert rates == sorted(rates) and rates[0] == record["pass_rate"]
        assert record["rounds_mean"] == 1 + sum(map(len, batch.later)) / len(first)
        assert record["grad_norm"] > 0 and "kl_sequence_mean" in record
    evals = [r for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "eval"]
    assert len(evals) == 3
    for record in evals:
        rates = [record[f"pass@1_round{r}"] for r in range(1, ROUNDS + 1)]
        # round 1 is the evaluation's own samples, not a second draw of them
        assert rates == sorted(rates) and rates[0] == record["pass@1"] and rates[-1] <= 1.0
    assert "pass@1_round3" in summary["final"]


def test_eval_command_reports_pass_at_1_by_round(ray_cluster, tiny_model, tmp_path):
    from coderloo.cli import main

    out = tmp_path / "report.json"
    args = ["eval", "--model", str(tiny_model), "--out", str(out), "refine.enabled=true", "refine.rounds=3",
            "tasks.max_eval_tasks=3", "eval.samples_per_task=2", "eval.k=[1]", "eval.greedy=false", "eval.max_new_tokens=16"]
    assert main(args) == 0
    report = json.loads(out.read_text())
    rates = [report[f"pass@1_round{r}"] for r in (1, 2, 3)]
    assert rates == sorted(rates) and rates[0] == report["pass@1"]  # round 1 is the plain samples' pass rate
