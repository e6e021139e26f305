"""Metrics: one JSON line per event, and a PNG of reward and held-out pass rate at the end."""
from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

from coderloo.checkpoint import atomic_write
from reward_service.tasks import TaskFileError, jsonl_records


class MetricsLog:
    """Appends JSON lines. `resume_from=step` keeps the records up to a checkpoint's RL step and
    drops the rest (written after the checkpoint by a run that then died), so no step appears twice."""

    def __init__(self, path: str | Path, resume_from: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_from is None or not self.path.exists():
            self.path.write_text("")
            return
        kept = [r for r in read_metrics(self.path) if r["phase"] == "sft" or r["step"] <= resume_from]
        atomic_write(self.path, "".join(json.dumps(r) + "\n" for r in kept))  # a full disk leaves the file as it was

    def write(self, phase: str, step: int, **values) -> None:
        """Append one line, whole or not at all: a write cut short (a full disk) is taken back, so
        that the file still reads, and `--resume`, once there is space again, finds every line."""
        record = {"phase": phase, "step": step, "time": round(time.time(), 3), **values}
        line = (json.dumps(record) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            end = os.fstat(fd).st_size
            try:
                if os.write(fd, line) != len(line):
                    raise OSError(errno.ENOSPC, f"{self.path}: a line was written in part", str(self.path))
            except OSError:
                os.ftruncate(fd, end)
                raise
        finally:
            os.close(fd)


class MetricsFileError(ValueError):
    """A metrics (or samples) file that cannot be read; the message names the file and the line."""


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a MetricsLog file: each a JSON object with a phase and a step."""
    records = []
    try:
        for where, record in jsonl_records(Path(path)):
            if not isinstance(record, dict) or not isinstance(record.get("phase"), str) or not isinstance(record.get("step"), int):
                raise MetricsFileError(f"{where}: expected a JSON object with a phase and a step, got {json.dumps(record):.80}")
            records.append(record)
    except TaskFileError as e:  # the one JSONL reader names the file and line
        raise MetricsFileError(str(e)) from None
    return records


def plot_training(metrics_path: str | Path, png_path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    train = [r for r in records if r["phase"] == "rl"]
    evals = [r for r in records if r["phase"] == "eval" and r["stage"] == "rl"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot([r["step"] for r in train], [r["reward_mean"] for r in train], label="mean reward")
    ax1.plot([r["step"] for r in train], [r["pass_rate"] for r in train], label="train pass rate")
    ax1.set_xlabel("RL step")
    ax1.set_title("Training")
    ax1.legend()
    for key in sorted({k for r in evals for k in r if k.startswith(("pass@", "greedy_pass@"))}):
        ax2.plot([r["step"] for r in evals], [r[key] for r in evals], marker="o", label=key)
    ax2.set_xlabel("RL step (0: end of SFT)")
    ax2.set_ylim(0, 1)
    ax2.set_title("Held-out evaluation")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


# A training step's record (coderloo.controller) -> the gauge that carries it on Ray's metrics
# endpoint. Ray prefixes each name with `ray_`; configs/grafana-dashboard.json plots them.
STEP_GAUGES = {
    "version": ("coderloo_policy_version", "Policy version the rollout workers hold."),
    "samples_per_s": ("coderloo_samples_per_second", "Completions generated, scored and learned from per second (last step)."),
    "reward_mean": ("coderloo_reward_mean", "Mean reward of the step's completions."),
    "pass_rate": ("coderloo_pass_rate", "Share of the step's completions that pass every test."),
    "syntax_rate": ("coderloo_syntax_rate", "Share of the step's completions that parse."),
    "staleness_mean": ("coderloo_staleness_mean", "Policy versions between a learned sample's sampler and the learner (mean)."),
    "staleness_max": ("coderloo_staleness_max", "Policy versions between a learned sample's sampler and the learner (max)."),
    "learner_idle_fraction": ("coderloo_learner_idle_fraction", "Share of the step the learner was not at its work."),
}
# The learner's numbers of a step that trained (a step whose groups were all uniform has none).
LEARNER_GAUGES = {
    "entropy": ("coderloo_policy_entropy", "Mean token entropy of the policy on the step's trained tokens (nats)."),
    "clip_fraction_low": ("coderloo_clip_fraction_low", "Share of trained tokens clipped below 1 - clip_eps_low (negative advantage)."),
    "clip_fraction_high": ("coderloo_clip_fraction_high", "Share of trained tokens clipped above 1 + clip_eps_high (positive advantage)."),
}
# The step timeline: one gauge, a `phase` tag per part.
STEP_PHASES = {
    "time_generate_s": "generate",
    "time_score_tail_s": "score_tail",
    "time_env_s": "environment",
    "time_wait_rollouts_s": "wait_rollouts",
    "time_wait_generation_s": "wait_generation",
    "time_wait_scoring_s": "wait_scoring",
    "time_wait_refill_s": "wait_refill",
    "time_learn_s": "learn",
    "time_sync_s": "sync",
    "time_step_s": "step",
}


class RunMetrics:
    """A run's numbers as custom metrics through Ray's metrics API, exported on Ray's Prometheus
    endpoint with Ray's own (every metric carries the run's name as the `run` tag). The sandbox
    pool publishes its queue and executors the same way (sandbox_pool.pool)."""

    def __init__(self, run: str):
        from ray.util.metrics import Counter, Gauge

        self.tags = {"run": run}
        self.gauges = {key: Gauge(name, description=text, tag_keys=("run",)) for key, (name, text) in STEP_GAUGES.items()}
        self.learner = {key: Gauge(name, description=text, tag_keys=("run",)) for key, (name, text) in LEARNER_GAUGES.items()}
        self.step = Gauge("coderloo_rl_step", description="Last finished RL step.", tag_keys=("run",))
        self.phases = Gauge("coderloo_step_phase_seconds", description="Seconds of each part of the last step.",
                            tag_keys=("run", "phase"))
        self.samples = Counter("coderloo_samples", description="Completions learned from, in all.", tag_keys=("run",))
        self.eval = Gauge("coderloo_eval_score", description="Held-out evaluation (pass@k, greedy pass@1) at its last run.",
                          tag_keys=("run", "metric"))

    def step_done(self, step: int, record: dict) -> None:
        self.step.set(step, tags=self.tags)
        for key, gauge in self.gauges.items():
            gauge.set(float(record[key]), tags=self.tags)
        for key, gauge in self.learner.items():
            if record.get(key) is not None:
                gauge.set(float(record[key]), tags=self.tags)
        for key, phase in STEP_PHASES.items():
            if key in record:  # a multi-turn strategy's rollouts have an environment's time, a single attempt's a scoring tail
                self.phases.set(float(record[key]), tags={**self.tags, "phase": phase})
        self.samples.inc(record["samples"], tags=self.tags)

    def eval_done(self, result: dict[str, float | dict[str, float]]) -> None:
        for metric, value in result.items():
            if not isinstance(value, dict):  # the pass rates by difficulty and family stay in metrics.jsonl
                self.eval.set(value, tags={**self.tags, "metric": metric})
