"""One short training run through Ray, vLLM, DeepSpeed and the sandbox pool."""
import json
import re
import threading
import urllib.request
from pathlib import Path

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from safetensors.torch import load_file

from coderloo.config import load_config
from coderloo.controller import train
from coderloo.metrics import read_metrics
from coderloo.runtime import metrics_endpoint
from common.hf import load_causal_lm
from tests.rounding import logprob_bound
from tracker_readers import (as_mlflow, logged_numbers, mlflow_numbers, mlflow_run, tensorboard_numbers, wandb_numbers,
                             wandb_records)

DASHBOARD = Path(__file__).resolve().parent.parent / "configs" / "grafana-dashboard.json"


class MetricsScraper:
    """Reads Ray's Prometheus endpoint every second, as Prometheus would, while a run goes on:
    every coderloo sample seen, by metric name."""

    def __init__(self, url: str):
        self.url, self.seen, self.errors = url, {}, []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.done.wait(1.0):
            try:
                text = urllib.request.urlopen(self.url, timeout=5).read().decode()
            except OSError as e:
                self.errors.append(repr(e))
                continue
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name.startswith("ray_coderloo_"):
                        self.seen.setdefault(sample.name, []).append((sample.labels, sample.value))

    def stop(self) -> dict:
        self.done.set()
        self.thread.join()
        return self.seen


def test_short_training_run(ray_cluster, tiny_model, tmp_path):
    out = tmp_path / "run"
    config = load_config(
        "configs/default.yaml",
        [
            f"model.path={tiny_model}",
            f"train.output_dir={out}",
            "sft.steps=2",
            "sft.batch_size=8",
            "train.steps=2",
            "train.prompts_per_step=4",
            "train.eval_every=1",
            "train.checkpoint_every=2",
            "rollout.samples_per_prompt=4",
            "rollout.max_new_tokens=16",
            "learner.optimizer_steps=2",
            "learner.kl.coef=0.05",
            "learner.advantage.dense={}",  # per-token advantages from the reward service's attribution
            # an untrained model's groups are mostly all-fail: keep them so that the steps learn
            "learner.advantage.filter_uninformative=false",
            "train.replay_groups=1",  # step 2 also learns from one replayed group of step 1
            "train.max_staleness=1",  # the asynchronous pipeline
            "rollout.update_in_flight=true",  # its pushes reach the engine while it generates
            # configs/mixed.yaml's tasks: the 48 held-out stdin/stdout tasks come first, then 2 function ones
            "tasks.synthetic_kinds=[stdio,function]",
            "tasks.max_eval_tasks=50",
            "eval.samples_per_task=2",
            "eval.k=[1,2]",
            "train.loggers=[jsonl,tensorboard,wandb,mlflow]",
        ],
    )
    scraper = MetricsScraper(metrics_endpoint())
    summary = train(config)
    seen = scraper.stop()

    # the version advanced: one push after SFT, one per RL step
    assert summary["policy_version"] == 3
    # the weights changed
    before = load_file(tiny_model / "model.safetensors")
    after = load_file(out / "checkpoints" / "final" / "model.safetensors")
    assert set(before) == set(after)
    assert any(not torch.equal(before[name], after[name]) for name in before)
    assert (out / "checkpoints" / "step_2" / "model.safetensors").exists()
    # the metrics were written
    records = read_metrics(out / "metrics.jsonl")
    rl = [r for r in records if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == [1, 2]
    # two float32 engines' logprobs (tests/rounding.py), in contexts up to the model's longest; the
    # final weights stand for step 1's (two small RL steps apart)
    final = load_causal_lm(out / "checkpoints" / "final")
    bound = logprob_bound(final, final.config.max_position_embeddings)
    assert [r["version"] for r in rl] == [2, 3]
    # max_staleness 1: step 2 was generated while step 1 trained, one version behind
    assert [r["staleness_max"] for r in rl] == [0, 1]
    assert rl[1]["sampler_logprob_diff_mean"] > 1e-4  # the learner had moved on: TIS has work to do
    for r in rl:
        assert r["pass_rate"] * r["samples"] == pytest.approx(round(r["pass_rate"] * r["samples"]))  # a share of the 16 samples
        assert r["grad_norm"] is not None and r["grad_norm"] > 0
        if r["staleness_max"] == 0:  # vLLM and the learner agree on the policy, to float32 rounding
            assert r["sampler_logprob_diff_mean"] <= bound
        assert r["mismatch_weight_mean"] > 0
        assert 0 <= r["staleness_token_mean"] <= r["staleness_max"]
        # what the learner waited for adds up to its wait for the rollouts
        waited = r["time_wait_generation_s"] + r["time_wait_scoring_s"] + r["time_wait_refill_s"]
        assert waited == pytest.approx(r["time_wait_rollouts_s"], abs=0.01)
        assert "kl" in r and r["groups_filtered"] == 0
        # every sample's token rewards came back, one per token (else the step raises), and they
        # moved the advantages off the sequence's
        assert r["dense_advantage_abs_mean"] > 0
    assert len([r for r in records if r["phase"] == "sft"]) == 2
    evals = [r for r in records if r["phase"] == "eval"]
    assert [(r["stage"], r["step"]) for r in evals] == [("base", 0), ("rl", 0), ("rl", 1), ("rl", 2)]
    assert all({"pass@1", "pass@2", "greedy_pass@1"} <= set(r) for r in evals)
    # stdin/stdout tasks went through the reward service's handle and the sandbox pool like the
    # function ones, and every evaluation reports the pass rate of each kind
    for stage in ("base", "after_sft", "final"):
        assert set(summary[stage]["by_kind"]) == {"assert", "stdio"}, stage
        assert all(0.0 <= rate <= 1.0 for rate in summary[stage]["by_kind"].values())
    families = set(summary["final"]["by_family"])
    assert {f for f in families if f.startswith("synthetic-stdio/")} and {f for f in families if f.startswith("synthetic/")}
    assert (out / "training.png").stat().st_size > 0
    assert (out / "report.html").stat().st_size > 0  # coderloo/report.py; tests/test_report.py opens one in Chromium
    assert json.loads((out / "summary.json").read_text())["final"] == summary["final"]
    # every number of every SFT step, RL step and evaluation reached each tracker (tests/test_loggers.py)
    logged = logged_numbers(records)
    assert {("sft/sft_loss", 2), ("rl/reward_mean", 1), ("rl/reward_mean", 2), ("eval_base/pass@1", 0), ("eval/pass@1", 0),
            ("eval/pass@1", 1), ("eval/greedy_pass@1", 2)} <= set(logged)
    assert tensorboard_numbers(out) == pytest.approx(logged)
    assert wandb_numbers(wandb_records(out)) == pytest.approx(logged)
    assert mlflow_numbers(*mlflow_run(out)) == pytest.approx(as_mlflow(logged))

    # Ray's Prometheus endpoint carried the run's metrics while it ran: every one the Grafana
    # dashboard plots, with this run's values
    panels = json.loads(DASHBOARD.read_text())["panels"]
    plotted = {name for p in panels for t in p["targets"] for name in re.findall(r"ray_coderloo_\w+", t["expr"])}
    assert plotted - set(seen) == set(), f"not on the endpoint: {plotted - set(seen)} (scrape errors: {scraper.errors[-3:]})"
    ours = {name: [v for labels, v in samples if labels.get("run") == out.name] for name, samples in seen.items()}
    assert max(ours["ray_coderloo_policy_version"]) >= 2 and max(ours["ray_coderloo_rl_step"]) >= 1
    assert max(ours["ray_coderloo_samples_total"]) >= 16  # step 1's 4 prompts x 4 samples
    assert max(ours["ray_coderloo_samples_per_second"]) > 0
    phases = {labels["phase"] for labels, _ in seen["ray_coderloo_step_phase_seconds"] if labels.get("run") == out.name}
    assert phases == {"generate", "score_tail", "wait_rollouts", "wait_generation", "wait_scoring", "wait_refill", "learn", "sync", "step"}
    assert {"pass@1", "greedy_pass@1"} <= {labels["metric"] for labels, _ in seen["ray_coderloo_eval_score"]}
    # the sandbox pool published its executors (the reward service's pool, on its own actor)
    assert max(v for labels, v in seen["ray_coderloo_sandbox_executors"] if labels["state"] == "ready") >= 1


def test_eval_command_reports_pass_at_k(ray_cluster, tiny_model, capsys, tmp_path):
    from coderloo.cli import main

    args = ["eval", "--model", str(tiny_model), "tasks.max_eval_tasks=4", "eval.samples_per_task=2", "eval.k=[1,2]",
            "--samples", str(tmp_path / "samples.jsonl")]
    assert main(args) == 0
    out = capsys.readouterr().out  # Ray may print worker logs around the report
    start = out.index('{\n  "model"')
    report = json.loads(out[start : out.index("\n}", start) + 2])
    assert report["tasks"] == 4 and report["model"] == str(tiny_model)
    assert {"pass@1", "pass@2", "greedy_pass@1"} <= set(report)
    assert report["pass@1"] == 0.0  # an untrained model passes nothing
    # the greedy completions, each with the program that ran (the task's code prompt, then the completion's code) and its verdict
    from coderloo.tasksets.synthetic import synthetic_suite

    prompts = {t.id: t.prompt for t in synthetic_suite()["heldout"]}
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and {s["set"] for s in samples} == {"synthetic"}
    assert all(s["solution"].startswith(prompts[s["task_id"]]) for s in samples)
    assert sum(s["passed"] for s in samples) / 4 == report["greedy_pass@1"]


@pytest.mark.parametrize("partial", [False, True], ids=["pipeline", "partial-rollouts"])
def test_dapo_preset_refills_uniform_groups_with_the_asynchronous_pipeline(ray_cluster, tiny_model, tmp_path, partial):
    """configs/dapo.yaml on a short run with one step's rollouts in flight: steps whose groups are
    mostly uniform draw more prompts, up to max_refill_rounds rounds, while the next step's rollouts
    are being generated, and train on the informative groups they found. The same with partial
    rollouts (its pool of groups in flight instead of a step's job)."""
    out = tmp_path / "dapo"
    pool = ["rollout.update_in_flight=true", "train.partial_rollouts=true"] if partial else []
    config = load_config("configs/dapo.yaml", [*pool,
        f"model.path={tiny_model}", f"train.output_dir={out}",
        "sft.steps=20", "sft.batch_size=16",  # enough for some syntax-valid programs: outcomes that differ
        "train.steps=3", "train.prompts_per_step=4", "train.eval_every=0", "train.checkpoint_every=0",
        "train.max_refill_rounds=2", "train.max_staleness=1",
        "rollout.samples_per_prompt=4", "rollout.max_new_tokens=16", "learner.overlong_buffer=4",
        "tasks.max_eval_tasks=4", "eval.sampled=false",
    ])
    train(config)
    rl = [r for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == [1, 2, 3]
    # the pipeline ran ahead while steps refilled: a step's first round was sampled before the step
    # before it trained (one version behind, when that step trained and pushed)
    for before, r in zip(rl, rl[1:]):
        assert r["staleness_max"] == (1 if before.get("grad_norm") is not None else 0), (before, r)
    assert any(r["staleness_max"] == 1 for r in rl)
    for r in rl:
        assert 0 <= r["refill_rounds"] <= 2 and 0 <= r["informative_groups"] <= 4
        # each step's samples: its own 4 prompts and the refills', less a last round's surplus, 4 samples each
        assert r["samples"] == 4 * (4 + r["refill_prompts"] - r["refill_surplus_groups"])
        assert r["groups_filtered"] == r["samples"] // 4 - r["informative_groups"]
        if r["informative_groups"] < 4:
            assert r["refill_rounds"] == 2  # it kept drawing until its limit
        assert "overlong_penalty_mean" in r and "truncated_fraction" in r
    assert any(r["refill_prompts"] > 0 for r in rl)
    assert all(r["pool_dropped_groups"] == 0 for r in rl) if partial else not any("pool_dropped_groups" in r for r in rl)
    trained = [r for r in rl if r.get("grad_norm") is not None]
    assert trained and all(r["entropy"] > 0 and "clip_fraction_high" in r for r in trained)


def test_the_kl_reference_starts_at_the_sft_policy_and_follows_the_policy_every_n_steps(ray_cluster, tiny_model, tmp_path):
    """With the KL in the reward, each step measures its samples' KL before it trains: 0 at the
    first step (the reference is the policy RL starts from, after the SFT warm-up) and after each
    move of the reference onto the policy (reference_mix 1, every 2 steps: after step 2), above 0
    where the policy trained since (step 2, step 4)."""
    out = tmp_path / "run"
    config = load_config("configs/default.yaml", [
        f"model.path={tiny_model}", f"train.output_dir={out}",
        "sft.steps=4", "train.steps=4", "train.prompts_per_step=2", "train.eval_every=0", "train.checkpoint_every=0",
        "rollout.samples_per_prompt=2", "rollout.max_new_tokens=12", "learner.optimizer_steps=1", "learner.lr=1e-3",
        "learner.kl={coef: 0.05, into: reward, reference_mix: 1.0, reference_every: 2}",
        # every step trains: the per-token rewards differ where the outcomes do not
        "learner.advantage.dense={}", "learner.advantage.filter_uninformative=false",
        "tasks.max_eval_tasks=2", "eval.sampled=false",
    ])
    train(config)
    rl = [r for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "rl"]
    assert all(r["grad_norm"] is not None for r in rl)
    kl = [r["kl_sequence_mean"] for r in rl]
    assert abs(kl[0]) < 1e-6 and abs(kl[2]) < 1e-6, kl
    assert kl[1] > 1e-4 and kl[3] > 1e-4, kl


def test_a_plugged_in_reward_component_reaches_the_metrics_and_the_report_and_one_that_raises_stops_the_run(
        ray_cluster, tiny_model, tmp_path):
    """configs/dataflow.yaml (CodeBLEU's data-flow match with the reference, with dense rewards) and
    the coverage term on a short run: each step's record has the samples' mean score of each, the
    report's data charts them. The
    same run with a component that raises (json.loads given a Scored item) stops at its first step,
    naming it: no program is scored 0 for it."""
    from coderloo.report import report_data

    short = [f"model.path={tiny_model}", "sft.steps=80", "sft.batch_size=16", "train.steps=2", "train.prompts_per_step=4",
             "train.eval_every=0", "train.checkpoint_every=0", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=16",
             "learner.advantage.filter_uninformative=false", "tasks.max_eval_tasks=4", "eval.sampled=false"]
    out = tmp_path / "dataflow"
    # with the coverage term too: the sandbox records the lines each program's tests ran (the SFT
    # warm-up is long enough for programs that compile and run)
    train(load_config("configs/dataflow.yaml", [*short, f"train.output_dir={out}", "reward.weights.coverage=0.1"]))
    rl = [r for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == [1, 2]
    assert all(0.0 < r["component_dataflow_mean"] <= 1.0 and 0.0 < r["component_coverage_mean"] <= 1.0 for r in rl)
    assert all(r["dense_advantage_abs_mean"] > 0 for r in rl)
    assert report_data(out)["train"]["components"] == {
        name: [r[f"component_{name}_mean"] for r in rl] for name in ("coverage", "dataflow")}

    broken = "reward.components=[{name: broken, path: 'json:loads', weight: 0.1}]"
    with pytest.raises(Exception, match=r"reward component 'broken' \(json:loads\) on task \S+ raised TypeError") as error:
        train(load_config("configs/default.yaml", [*short, f"train.output_dir={tmp_path / 'broken'}", broken]))
    records = read_metrics(tmp_path / "broken" / "metrics.jsonl")
    assert not [r for r in records if r["phase"] == "rl"], error.value  # no step trained on its samples
