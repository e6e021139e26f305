"""Where a run's records go (`train.loggers`): metrics.jsonl always, and any of TensorBoard, W&B and
MLflow, each in the run directory. The controller writes each record once, to `RunLog`; metrics.jsonl
keeps all of it, the trackers take its numbers.

A tracker names a record's numbers `<series>/<field>`, nested fields "/"-joined
(`eval/by_difficulty/1`), so that each UI groups them by phase; None, strings and lists are left to
metrics.jsonl. Each tracker also gets the config, and on --resume continues the run it started.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path

from tqdm import tqdm

from coderloo.config import Config, ConfigError
from coderloo.metrics import MetricsLog

# The modules each tracker imports; the pip extra that installs them has the tracker's name.
REQUIREMENTS = {
    "tensorboard": ("tensorboard",),
    "wandb": ("wandb",),
    "mlflow": ("mlflow", "sqlalchemy", "alembic"),
}


def check_installed(loggers: list[str]) -> None:
    """Refuse, before a run starts, a tracker whose packages this environment lacks."""
    for name in loggers:
        missing = [module for module in REQUIREMENTS.get(name, ()) if importlib.util.find_spec(module) is None]
        if missing:
            raise ConfigError(f"train.loggers: {name} needs {', '.join(missing)}, not installed here: "
                              f"pip install -e '.[{name}]' (or '.[loggers]' for every tracker)")


def series(phase: str, values: dict) -> str:
    """The name a record's numbers go under: its phase, but `eval_base` for the base model's
    evaluation. The base model and the policy after SFT are both evaluated at RL step 0; under one
    name they would be two values at one step of one curve. The base model's is one point, the
    reference the curves start from, so it has a group of its own."""
    return "eval_base" if phase == "eval" and values.get("stage") == "base" else phase


def numbers(values: dict, prefix: str) -> dict[str, float]:
    """The numeric leaves of a record, under "/"-joined names (booleans are not quantities)."""
    out = {}
    for key, value in values.items():
        name = f"{prefix}/{key}"
        if isinstance(value, dict):
            out.update(numbers(value, name))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)
    return out


def flat_config(tree: dict, prefix: str = "") -> dict[str, str]:
    """A config as dotted keys and string values (`learner.lr`: "1e-05"), as MLflow takes params."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(value)
    return out


def mlflow_name(name: str) -> str:
    """MLflow takes letters, digits, `_-. :/` in a metric's name: `pass@1` becomes `pass_at_1`."""
    return re.sub(r"[^\w./\- :]", "_", name.replace("@", "_at_"))


class TensorBoardTracker:
    """Event files in tensorboard/: SFT's steps in the `sft` run, the rest (RL steps, evaluations;
    step 0 is before RL) in the `rl` run. On resume the `rl` run purges from the step after the
    checkpoint, as TensorBoard does after a restart; its purge drops every tag's events at and after
    that step in the run, which is why SFT, on a step axis of its own, is in another run."""

    def __init__(self, out: Path, config: Config, resume_from: int | None):
        from torch.utils.tensorboard import SummaryWriter

        self.rl = SummaryWriter(out / "tensorboard" / "rl", purge_step=None if resume_from is None else resume_from + 1)
        self.sft = SummaryWriter(out / "tensorboard" / "sft") if resume_from is None else None  # a resumed run has done its SFT
        # indented: the text plugin renders Markdown, where that is a code block
        self.rl.add_text("config", "".join(f"    {line}\n" for line in (out / "config.yaml").read_text().splitlines()), 0)

    def write(self, phase: str, step: int, **values) -> None:
        writer = self.sft if phase == "sft" else self.rl
        for name, value in numbers(values, series(phase, values)).items():
            writer.add_scalar(name, value, step)

    def close(self, failed: bool) -> None:
        for writer in (self.rl, self.sft):
            if writer is not None:
                writer.close()


class WandbTracker:
    """A W&B run in wandb/, offline unless WANDB_MODE says otherwise (`wandb sync` uploads it).
    Each series is plotted over its own step (`rl/step`, `sft/step`, ...), as W&B's one step counter
    per run cannot hold SFT's steps and the RL steps after them. The run id is kept in
    wandb/run_id so that --resume continues the same run; steps written after the checkpoint by the
    run that died stay (rewinding a run needs W&B's server)."""

    def __init__(self, out: Path, config: Config, resume_from: int | None):
        mode = os.environ.get("WANDB_MODE", "offline")
        if mode in ("offline", "dryrun"):
            # offline means nothing leaves the machine: W&B's own telemetry would still probe its server
            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        import wandb

        id_file = out / "wandb" / "run_id"
        self.run = wandb.init(project=config.train.wandb_project, name=out.name, dir=out, mode=mode,
                              id=id_file.read_text().strip() if id_file.exists() else None, resume="allow",
                              config=config.model_dump(mode="json"), settings=wandb.Settings(silent=True))
        id_file.write_text(self.run.id)
        self.steps: set[str] = set()

    def write(self, phase: str, step: int, **values) -> None:
        name = series(phase, values)
        if name not in self.steps:
            self.run.define_metric(f"{name}/step")
            self.run.define_metric(f"{name}/*", step_metric=f"{name}/step")
            self.steps.add(name)
        self.run.log({f"{name}/step": step, **numbers(values, name)})

    def close(self, failed: bool) -> None:
        import wandb

        sync_dir, offline = self.run.settings.sync_dir, self.run.settings.mode in ("offline", "dryrun")
        self.run.finish(exit_code=1 if failed else 0)
        wandb.teardown()  # ends W&B's service process, which would otherwise live as long as ours
        if offline:  # W&B's own lines are silenced (they would fill the console): its one piece of advice
            tqdm.write(f"W&B offline run: `wandb sync {sync_dir}` uploads it")


class MlflowTracker:
    """An MLflow run in mlflow/: a SQLite store (MLflow 3 refuses its file store unless told to;
    SQLite is its local store now) in experiment "coderloo", the config as params and config.yaml
    as an artifact. The run id is kept in mlflow/run_id so that --resume continues the same run.
    A param cannot change once logged: a resumed run keeps its first params, and its config.yaml
    artifact is the one it resumed with. The full `mlflow` package browses it:
    `mlflow ui --backend-store-uri sqlite:///<run directory>/mlflow/mlflow.db`."""

    def __init__(self, out: Path, config: Config, resume_from: int | None):
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # a local store: nothing leaves the machine
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        directory = out / "mlflow"
        directory.mkdir(exist_ok=True)
        self.client = MlflowClient(tracking_uri=f"sqlite:///{directory / 'mlflow.db'}")
        id_file = directory / "run_id"
        if id_file.exists():
            self.run_id = id_file.read_text().strip()
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            experiment = self.client.get_experiment_by_name("coderloo")
            experiment_id = (experiment.experiment_id if experiment else
                             self.client.create_experiment("coderloo", artifact_location=(directory / "artifacts").as_uri()))
            self.run_id = self.client.create_run(experiment_id, run_name=out.name).info.run_id
            id_file.write_text(self.run_id)
            params = flat_config(config.model_dump(mode="json"))
            self.client.log_batch(self.run_id, params=[Param(key, value) for key, value in params.items()])
        self.client.log_artifact(self.run_id, str(out / "config.yaml"))

    def write(self, phase: str, step: int, **values) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_name(name), value, now, step) for name, value in numbers(values, series(phase, values)).items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


TRACKERS = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MlflowTracker}


class RunLog:
    """metrics.jsonl and the trackers of `train.loggers`: every record to each."""

    def __init__(self, config: Config, out: Path, resume_from: int | None):
        """After config.yaml is written (the trackers take it from there). `resume_from`: the
        checkpoint's RL step, when resuming; records after it are dropped (MetricsLog)."""
        self.jsonl = MetricsLog(out / "metrics.jsonl", resume_from=resume_from)
        self.trackers = [TRACKERS[name](out, config, resume_from) for name in config.train.loggers if name != "jsonl"]

    def write(self, phase: str, step: int, **values) -> None:
        self.jsonl.write(phase, step, **values)
        for tracker in self.trackers:
            tracker.write(phase, step, **values)

    def close(self) -> None:
        """Call it from a `finally`: an exception on its way out marks the run failed in W&B and MLflow."""
        failed = sys.exc_info()[0] is not None
        for tracker in self.trackers:
            tracker.close(failed)
