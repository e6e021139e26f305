"""train.loggers: the names the trackers get, and each real tracker read back by its own reader."""
import textwrap
from pathlib import Path

import psutil
import pytest
import yaml

from coderloo import loggers
from coderloo.config import ConfigError, dump_config, load_config
from coderloo.loggers import RunLog, check_installed, flat_config, mlflow_name, numbers, series
from coderloo.metrics import read_metrics
from tracker_readers import (as_mlflow, logged_numbers, mlflow_numbers, mlflow_run, tensorboard_numbers, tensorboard_runs,
                             wandb_numbers, wandb_records)

ALL = "train.loggers=[jsonl,tensorboard,wandb,mlflow]"


def test_names_group_by_phase_and_keep_the_base_evaluation_apart():
    assert series("rl", {"reward_mean": 0.5}) == "rl"
    assert series("sft", {}) == "sft"
    assert series("eval", {"stage": "rl"}) == "eval"
    assert series("eval", {"stage": "base"}) == "eval_base"  # also at step 0, with the first "eval"


def test_numbers_are_the_numeric_leaves():
    record = {"pass@1": 0.25, "version": 3, "stage": "rl", "grad_norm": None, "rewards": [1.0], "synced": True,
              "by_difficulty": {"1": 0.5, "2": {"x": 1}}, "by_family": {"synthetic/add": 0.0}}
    assert numbers(record, "eval") == {"eval/pass@1": 0.25, "eval/version": 3.0, "eval/by_difficulty/1": 0.5,
                                       "eval/by_difficulty/2/x": 1.0, "eval/by_family/synthetic/add": 0.0}


def test_config_flattens_to_string_params():
    assert flat_config({"learner": {"lr": 1e-5, "stop": ["\n"]}, "ray_address": None, "name": "x"}) == {
        "learner.lr": "1e-05", "learner.stop": '["\\n"]', "ray_address": "null", "name": "x"}


def test_mlflow_names():
    assert mlflow_name("eval/greedy_pass@1") == "eval/greedy_pass_at_1"
    assert mlflow_name("eval/by_set/humaneval+") == "eval/by_set/humaneval_"
    assert mlflow_name("rl/reward_mean") == "rl/reward_mean"


def test_loggers_field():
    assert load_config().train.loggers == ["jsonl"]
    assert load_config(overrides=[ALL]).train.loggers == ["jsonl", "tensorboard", "wandb", "mlflow"]
    for value, reason in (("[jsonl,neptune]", "train.loggers.1"), ("[tensorboard]", "jsonl is always written"),
                          ("[jsonl,wandb,wandb]", "each logger once")):
        with pytest.raises(ConfigError, match=reason):
            load_config(overrides=[f"train.loggers={value}"])


def test_a_tracker_not_installed_is_refused_with_its_extra(monkeypatch):
    check_installed(["jsonl", "tensorboard", "wandb", "mlflow"])  # this environment has the `loggers` extra
    monkeypatch.setitem(loggers.REQUIREMENTS, "wandb", ("wandb", "no_such_module_here"))
    with pytest.raises(ConfigError, match=r"train.loggers: wandb needs no_such_module_here.*pip install -e '\.\[wandb\]'"):
        check_installed(["jsonl", "wandb"])


# The records a run writes: SFT steps, the base model's and the post-SFT evaluation (both at RL
# step 0), RL steps (with a None and a list, as real ones have) and an evaluation with nested rates.
RECORDS = [
    ("eval", 0, {"stage": "base", "version": 0, "pass@1": 0.125, "by_difficulty": {"1": 0.25}}),
    ("sft", 1, {"sft_loss": 2.5, "grad_norm": 1.5}),
    ("sft", 2, {"sft_loss": 2.25, "grad_norm": 1.25}),
    ("eval", 0, {"stage": "rl", "version": 1, "pass@1": 0.375, "by_difficulty": {"1": 0.5}}),
    ("rl", 1, {"version": 2, "reward_mean": 0.5, "pass_rate": 0.25, "kl": None, "groups": [1, 2]}),
    ("rl", 2, {"version": 3, "reward_mean": 0.75, "pass_rate": 0.5, "kl": 0.01, "groups": [3]}),
    ("eval", 2, {"stage": "rl", "version": 3, "pass@1": 0.625, "by_difficulty": {"1": 0.75}}),
]


def open_log(tmp_path, resume_from=None, overrides=()):
    config = load_config(overrides=[ALL, f"train.output_dir={tmp_path}", *overrides])
    dump_config(config, tmp_path / "config.yaml")
    return config, RunLog(config, tmp_path, resume_from)


def wandb_processes():
    return [p for p in psutil.Process().children(recursive=True) if p.name().startswith("wandb")]


def test_every_tracker_holds_every_record_and_the_config(tmp_path):
    config, log = open_log(tmp_path)
    for phase, step, values in RECORDS:
        log.write(phase, step, **values)
    log.close()
    assert wandb_processes() == []  # W&B's service ended with the run

    expected = logged_numbers(read_metrics(tmp_path / "metrics.jsonl"))
    assert {("eval_base/pass@1", 0), ("eval/pass@1", 0), ("eval/by_difficulty/1", 2), ("rl/reward_mean", 2),
            ("sft/sft_loss", 1)} <= set(expected)
    assert ("rl/kl", 1) not in expected and ("rl/kl", 2) in expected  # None is not a number
    tree = config.model_dump(mode="json")

    # TensorBoard: the numbers (float32) in two runs, the config as text
    assert tensorboard_numbers(tmp_path) == pytest.approx(expected)
    runs = tensorboard_runs(tmp_path)
    assert set(runs) == {"rl", "sft"} and all(tag.startswith("sft/") for tag in runs["sft"].Tags()["scalars"])
    [text] = runs["rl"].Tensors("config/text_summary")
    assert yaml.safe_load(textwrap.dedent(text.tensor_proto.string_val[0].decode())) == tree

    # W&B: one offline run, named after the run directory, with the config
    records = wandb_records(tmp_path)
    assert wandb_numbers(records) == pytest.approx(expected)
    [run] = [r["run"] for r in records if r["type"] == "run"]
    assert run["display_name"] == tmp_path.name and run["project"] == "coderloo"
    assert {k: v for k, v in run["config"]["update"].items() if k != "_wandb"} == tree
    assert [r["exit"]["exit_code"] for r in records if r["type"] == "exit"] == [0]

    # MLflow: one finished run, the config as params and config.yaml as an artifact
    client, run = mlflow_run(tmp_path)
    assert mlflow_numbers(client, run) == pytest.approx(as_mlflow(expected))
    assert run.info.run_name == tmp_path.name and run.info.status == "FINISHED"
    assert run.data.params == flat_config(tree)
    artifact = client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path / "downloaded"))
    assert yaml.safe_load(Path(artifact).read_text()) == tree


def test_a_run_that_died_is_failed_and_its_resume_continues_each_trackers_run(tmp_path):
    _, log = open_log(tmp_path)
    with pytest.raises(RuntimeError):
        try:
            for phase, step, values in RECORDS:
                log.write(phase, step, **values)
            raise RuntimeError("the run died")
        finally:
            log.close()  # as the controller's `finally` does
    client, run = mlflow_run(tmp_path)
    assert run.info.status == "FAILED"
    assert [r["exit"]["exit_code"] for r in wandb_records(tmp_path) if r["type"] == "exit"] == [1]
    wandb_id = (tmp_path / "wandb" / "run_id").read_text()

    # resumed from the checkpoint at RL step 1: step 2 again (another value), then step 3
    _, log = open_log(tmp_path, resume_from=1, overrides=["train.steps=3"])
    log.write("rl", 2, reward_mean=0.875)
    log.write("rl", 3, reward_mean=1.0)
    log.close()

    expected = logged_numbers(read_metrics(tmp_path / "metrics.jsonl"))
    assert expected[("rl/reward_mean", 2)] == 0.875 and ("eval/pass@1", 2) not in expected
    # TensorBoard purged what came after the checkpoint (the first session's step 2 and its evaluation), not SFT's steps
    assert tensorboard_numbers(tmp_path) == pytest.approx(expected)
    # W&B: the same run, in a second offline session
    records = wandb_records(tmp_path)
    assert {r["run"]["run_id"] for r in records if r["type"] == "run"} == {wandb_id}
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 2
    assert wandb_numbers([r for r in records if r["type"] == "history"][-2:]) == {("rl/reward_mean", 2): 0.875, ("rl/reward_mean", 3): 1.0}
    # MLflow: the same run, finished again, its params those it started with
    client, run = mlflow_run(tmp_path)
    assert run.info.status == "FINISHED" and run.data.params["train.steps"] == "150"
    history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "rl/reward_mean"))
    assert history == [(1, 0.5), (2, 0.75), (2, 0.875), (3, 1.0)]  # MLflow cannot drop the first session's step 2
