"""Reading a run's trackers back with each tracker's own reader (tests/test_loggers.py,
tests/test_end_to_end.py): each tracker's numbers as {(name, step): value}."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from coderloo.loggers import mlflow_name, numbers, series


def logged_numbers(records: list[dict]) -> dict[tuple[str, int], float]:
    """What metrics.jsonl's records should have put in a tracker, under the trackers' names."""
    out = {}
    for r in records:
        values = {k: v for k, v in r.items() if k not in ("phase", "step", "time")}
        out.update({(name, r["step"]): value for name, value in numbers(values, series(r["phase"], values)).items()})
    return out


def tensorboard_runs(run_dir: Path) -> dict:
    """Each TensorBoard run in tensorboard/ (`rl`, `sft`), read by TensorBoard's EventAccumulator."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = {}
    for directory in sorted((run_dir / "tensorboard").iterdir()):
        runs[directory.name] = EventAccumulator(str(directory), size_guidance={"scalars": 0, "tensors": 0})
        runs[directory.name].Reload()
    return runs


def tensorboard_numbers(run_dir: Path) -> dict[tuple[str, int], float]:
    return {(tag, e.step): e.value for events in tensorboard_runs(run_dir).values()
            for tag in events.Tags()["scalars"] for e in events.Scalars(tag)}


def wandb_records(run_dir: Path) -> list[dict]:
    """Every record of the run's W&B transaction logs (one per session: a resumed run has two),
    as W&B's own reader prints them (`wandb leet inspect --json`)."""
    records = []
    for log in sorted((run_dir / "wandb").glob("*run-*/run-*.wandb")):
        # cwd: the reader writes its debug log under ./wandb
        printed = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log)],
                                 cwd=run_dir, capture_output=True, text=True, check=True).stdout
        records += [json.loads(line) for line in printed.splitlines() if line.strip()]
    return records


def wandb_numbers(records: list[dict]) -> dict[tuple[str, int], float]:
    """The history's numbers, each at its series' own step (`rl/reward_mean` at `rl/step`)."""
    out = {}
    for r in records:
        if r["type"] == "history":
            item = r["history"]["item"]
            for key, value in item.items():
                if not key.startswith("_") and not key.endswith("/step"):
                    out[(key, item[key.split("/")[0] + "/step"])] = value
    return out


def mlflow_run(run_dir: Path):
    """(client, the one run) of the run's MLflow store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow' / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("coderloo").experiment_id])
    return client, run


def mlflow_numbers(client, run) -> dict[tuple[str, int], float]:
    return {(m.key, m.step): m.value for key in run.data.metrics for m in client.get_metric_history(run.info.run_id, key)}


def as_mlflow(expected: dict[tuple[str, int], float]) -> dict[tuple[str, int], float]:
    return {(mlflow_name(name), step): value for (name, step), value in expected.items()}
