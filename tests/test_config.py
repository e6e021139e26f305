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
        ("rollout.samples_per_prompt=0", "rollout.samples_per_prompt", "greater than or equal to 1"),
        ("learner.zero_stage=4", "learner.zero_stage", "less than or equal to 3"),
        ("learner.typo=1", "learner.typo", "Extra inputs are not permitted"),
        ("rollout.backend=tgi", "rollout.backend", "'vllm' or 'transformers'"),
        ("eval.k=[1,16]", "eval", "each k must be between 1 and samples_per_task=8"),
        ("tasks.train_set=mbpp", "tasks", "train_path is required"),
        ("learner.num_ranks=512", "config", "cannot fill learner.optimizer_steps x learner.num_ranks = 1024"),
        ("learner.advantage_estimator=a2c", "learner.advantage_estimator", "'rloo', 'grpo', 'dr_grpo', 'reinforce_pp', 'reinforce' or 'ppo'"),
        ("rollout.weight_sync.transport=mpi", "rollout.weight_sync.transport", "'gloo' or 'nccl'"),
        ("rollout.dtype=float16", "rollout.dtype", "'float32' or 'bfloat16'"),
        ("rollout.gpu_memory_utilization=1.5", "rollout.gpu_memory_utilization", "less than or equal to 1"),
        ("metrics_export_port=70000", "metrics_export_port", "less than or equal to 65535"),
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


def test_dense_rewards_give_the_reward_service_the_policy_tokenizer_and_need_rloo():
    from coderloo.runtime import REPO_ROOT

    assert load_config("configs/default.yaml").reward.tokenizer_path is None  # no per-token rewards: no cost
    cfg = load_config("configs/default.yaml", ["learner.dense_rewards=true"])
    assert cfg.reward.tokenizer_path == str(REPO_ROOT / ".cache/tiny-qwen2")  # absolute: the replicas' cwd may differ
    cfg = load_config(None, ["learner.dense_rewards=true", "model.path=/models/m", "reward.tokenizer_path=/tok"])
    assert cfg.reward.tokenizer_path == "/tok"
    with pytest.raises(ConfigError, match="dense_rewards needs advantage_estimator 'rloo'.*got 'grpo'"):
        load_config(None, ["learner.dense_rewards=true", "learner.advantage_estimator=grpo"])
    with pytest.raises(ConfigError, match="learner.dense_gamma"):
        load_config(None, ["learner.dense_gamma=1.5"])


def test_engine_options_and_placement_fields():
    gpu = load_config("configs/default.yaml", ["rollout.gpus_per_worker=1", "rollout.dtype=bfloat16",
                                               "rollout.max_model_len=2048", "rollout.resources={rollout_gpu: 1}"])
    assert gpu.rollout.engine_options() == {"dtype": "bfloat16", "max_model_len": 2048, "gpu_memory_utilization": 0.9}
    assert gpu.rollout.resources == {"rollout_gpu": 1.0}
    # no GPU: vLLM's memory share is left out (the CPU backend sizes its KV cache by VLLM_CPU_KVCACHE_SPACE)
    assert "gpu_memory_utilization" not in load_config("configs/default.yaml").rollout.engine_options()
    with pytest.raises(ConfigError, match="rollout.dtype applies to the vllm backend"):
        load_config("configs/default.yaml", ["rollout.backend=transformers", "rollout.dtype=bfloat16"])
    with pytest.raises(ConfigError, match="metrics_export_port sets the endpoint of a local cluster"):
        load_config("configs/default.yaml", ["metrics_export_port=9100", "ray_address=auto"])


def test_placement_options_leave_ray_defaults_alone():
    from common.placement import placement_options

    # no option at all: the actor holds no CPU while it runs (2 cores fit learner + worker + replica)
    assert placement_options(0, {}) == {}
    assert placement_options(1, {"rollout_gpu": 1}) == {"num_gpus": 1, "resources": {"rollout_gpu": 1}}


def test_a_config_extends_another_section_by_section(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("learner:\n  lr: 1.0e-3\n  clip_eps: 0.1\ntrain:\n  steps: 7\n")
    (tmp_path / "sub").mkdir()
    child = tmp_path / "sub" / "child.yaml"
    child.write_text("extends: ../base.yaml\nlearner:\n  clip_eps: 0.3\n")
    config = load_config(child, ["train.steps=9"])
    assert (config.learner.lr, config.learner.clip_eps, config.train.steps) == (1e-3, 0.3, 9)
    (tmp_path / "loop.yaml").write_text("extends: loop.yaml\n")
    with pytest.raises(ConfigError, match="extends loop.yaml makes a cycle"):
        load_config(tmp_path / "loop.yaml")
    (tmp_path / "orphan.yaml").write_text("extends: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=r"nowhere.yaml does not exist \(extended by .*orphan.yaml\)"):
        load_config(tmp_path / "orphan.yaml")


@pytest.mark.parametrize("name,expected", [
    ("dapo", {"clip_eps_low": 0.2, "clip_eps_high": 0.28, "aggregation": "token_mean"}),
    ("dr-grpo", {"aggregation": "seq_mean_token_sum_norm"}),
    ("gspo", {"importance_level": "sequence", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4, "aggregation": "seq_mean_token_mean"}),
])
def test_method_presets_are_the_default_with_their_papers_settings(name, expected):
    preset, default = load_config(f"configs/{name}.yaml"), load_config("configs/default.yaml")
    loss = preset.learner.loss_config(1, 1.0, preset.rollout.max_new_tokens)
    assert {key: getattr(loss, key) for key in expected} == expected
    assert preset.rollout == default.rollout and preset.sft == default.sft and preset.tasks == default.tasks
    assert preset.train.output_dir == f"runs/{name}"  # never the default's run directory
    estimator = {"dapo": "grpo", "dr-grpo": "dr_grpo", "gspo": "grpo"}[name]
    assert preset.learner.advantage_estimator == estimator and not preset.learner.normalize_advantages
    if name == "dapo":
        assert preset.train.max_refill_rounds == 3 and preset.learner.overlong_buffer == 10


def test_ppo_preset_and_the_estimators_that_take_one_sample_per_prompt():
    preset, default = load_config("configs/ppo.yaml"), load_config("configs/default.yaml")
    learner = preset.learner
    assert (learner.advantage_estimator, learner.value_model, learner.dense_rewards, learner.kl_in) == ("ppo", "separate", True, "reward")
    assert learner.loss_config(1, 1.0, 48).train_value and not default.learner.loss_config(1, 1.0, 48).train_value
    assert preset.rollout == default.rollout and preset.train.output_dir == "runs/ppo"
    assert preset.reward.tokenizer_path is not None  # the dense rewards' tokenizer, as for rloo+dense
    # k = 1: the estimators without a group baseline take it, the others name the field
    for estimator in ("ppo", "reinforce"):
        assert load_config("configs/default.yaml", [f"learner.advantage_estimator={estimator}", "rollout.samples_per_prompt=1"])
    with pytest.raises(ConfigError, match="rollout.samples_per_prompt=1: advantage_estimator rloo compares the samples"):
        load_config("configs/default.yaml", ["rollout.samples_per_prompt=1"])
    with pytest.raises(ConfigError, match="train.replay_groups with advantage_estimator ppo"):
        load_config("configs/ppo.yaml", ["train.replay_groups=2"])
    with pytest.raises(ConfigError, match="max_refill_rounds: advantage_estimator ppo keeps every group"):
        load_config("configs/ppo.yaml", ["train.max_refill_rounds=2"])
    with pytest.raises(ConfigError, match="dense_rewards needs advantage_estimator 'rloo'.* or 'ppo'"):
        load_config("configs/default.yaml", ["learner.dense_rewards=true", "learner.advantage_estimator=grpo"])
