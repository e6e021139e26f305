"""Metrics: one JSON line per event, and a PNG of reward and held-out pass rate at the end."""
from __future__ import annotations

import json
import time
from pathlib import Path


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
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def write(self, phase: str, step: int, **values) -> None:
        record = {"phase": phase, "step": step, "time": round(time.time(), 3), **values}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def read_metrics(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


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
