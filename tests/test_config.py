"""Configs: the shipped YAML files validate; bad input names the field and the reason."""
from pathlib import Path

import pytest

from coderloo.config import ConfigError, load_config, parse_overrides

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_validate(path):
    load_config(path)


def test_overrides_are_typed_and_nested():
    cfg = load_config("configs/default.yaml", ["learner.lr=1e-5", 'rollout.stop=["\\n\\n"]', "reward.limits.memory_mb=256", "learner.normalize_advantages=false"])
    assert cfg.learner.lr == 1e-5
    assert cfg.rollout.stop == ["\n\n"]
    assert cfg.reward.limits.memory_mb == 256
    assert cfg.learner.normalize_advantages is False


@pytest.mark.parametrize(
    "override, field, reason",
    [
        ("learner.lr=-1", "learner.lr", "greater than 0"),
        ("learner.lr=fast", "learner.lr", "valid number"),
        ("rollout.samples_per_prompt=1", "rollout.samples_per_prompt", "greater than or equal to 2"),
        ("learner.zero_stage=4", "learner.zero_stage", "less than or equal to 3"),
        ("learner.typo=1", "learner.typo", "Extra inputs are not permitted"),
        ("rollout.backend=tgi", "rollout.backend", "'vllm' or 'transformers'"),
        ("eval.k=[1,16]", "eval", "each k must be between 1 and samples_per_task=8"),
        ("tasks.train_set=mbpp", "tasks", "train_path is required"),
        ("learner.num_ranks=512", "config", "cannot fill learner.optimizer_steps x learner.num_ranks = 1024"),
        ("learner.advantage_estimator=ppo", "learner.advantage_estimator", "'rloo', 'grpo', 'reinforce_pp' or 'reinforce'"),
        ("rollout.weight_sync.transport=mpi", "rollout.weight_sync.transport", "'gloo' or 'nccl'"),
    ],
)
def test_invalid_field_is_named_with_its_reason(override, field, reason):
    with pytest.raises(ConfigError) as err:
        load_config("configs/default.yaml", [override])
    assert f"  {field}" in str(err.value)
    assert reason in str(err.value)


def test_malformed_override_and_file(tmp_path):
    with pytest.raises(ConfigError, match="expected section.field=value"):
        parse_overrides(["learner.lr"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("learner: [1, 2\n")
    with pytest.raises(ConfigError, match="bad.yaml: invalid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_cli_rejects_invalid_config_before_starting(capsys):
    from coderloo.cli import main

    assert main(["train", "--config", "configs/default.yaml", "learner.clip_eps=2"]) == 2
    assert "learner.clip_eps: Input should be less than 1" in capsys.readouterr().err


def test_kl_schedule_is_linear_then_flat():
    config = load_config(None, ["learner.kl_coef=0.1", "learner.kl_coef_final=0.0", "learner.kl_schedule_steps=10"])
    assert [round(config.learner.kl_coef_at(s), 3) for s in (1, 6, 11, 50)] == [0.1, 0.05, 0.0, 0.0]
    assert load_config(None, ["learner.kl_coef=0.2"]).learner.kl_coef_at(99) == 0.2
