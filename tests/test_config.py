"""Configs: the shipped YAML files validate against the schema; bad input names the field and the
reason; a field of an earlier shape names its new place."""
import json
import re
from pathlib import Path

import pytest
import yaml

from coderloo.config import MOVED, ConfigError, config_schema, load_config, parse_overrides

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_validate(path):
    load_config(path)


def test_the_schema_defaults_are_what_make_train_runs():
    assert load_config(None) == load_config("configs/default.yaml")


def test_overrides_are_typed_and_nested():
    cfg = load_config("configs/default.yaml", ["learner.lr=1e-5", 'rollout.stop=["\\n\\n"]', "reward.limits.memory_mb=256",
                                               "learner.advantage.normalize=false", "learner.loss.eps_high=0.28"])
    assert cfg.learner.lr == 1e-5
    assert cfg.rollout.stop == ["\n\n"]
    assert cfg.reward.limits.memory_mb == 256
    assert cfg.learner.advantage.normalize is False
    # a variant's section without its type is the default variant's
    assert (cfg.learner.loss.type, cfg.learner.loss.eps_low, cfg.learner.loss.eps_high) == ("clip", 0.2, 0.28)


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
        ("learner.advantage.type=a2c", "learner.advantage", "'rloo', 'grpo', 'dr_grpo', 'reinforce_pp', 'reinforce', 'ppo'"),
        ("learner.loss.type=ppo", "learner.loss", "'clip', 'cispo', 'sapo', 'vespo'"),
        ("learner.loss.eps_low=1.5", "learner.loss.clip.eps_low", "less than 1"),
        ("learner.kl.into=reward", "learner.kl.coef", "Field required"),
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


STREAMED = ["train.stream_groups=true"]


@pytest.mark.parametrize("overrides, reason", [
    (["learner.zero_stage=2"], "learner.zero_stage=2"),
    (["learner.dtype=bfloat16"], "learner.dtype=bfloat16"),
    (["learner.advantage.type=reinforce_pp"], "learner.advantage.type=reinforce_pp"),
    (["learner.kl.coef=0.05", "learner.kl.into=reward"], "learner.kl.into=reward"),
    (["learner.kl.coef=0.05"], "learner.kl.into=loss with learner.advantage.normalize"),
    (["critic.enabled=true", "critic.reward_coef=0.1"], "critic.reward_coef"),
    (["train.replay_groups=1"], "train.replay_groups"),
    (["train.max_refill_rounds=1"], "train.max_refill_rounds"),
    (["train.max_staleness=1", "rollout.update_in_flight=true", "train.partial_rollouts=true"], "train.partial_rollouts"),
])
def test_streamed_groups_refuse_what_needs_the_whole_batch(overrides, reason):
    with pytest.raises(ConfigError, match=re.escape(f"train.stream_groups with {reason}")):
        load_config("configs/default.yaml", [*STREAMED, *overrides])
    if reason.startswith("learner.kl.into=loss"):  # a KL term in the loss streams when advantages are not whitened
        load_config("configs/default.yaml", [*STREAMED, *overrides, "learner.advantage.normalize=false"])


@pytest.mark.parametrize("overrides, field", [
    (["learner.loss.type=sapo", "learner.loss.eps_low=0.1"], "learner.loss.sapo.eps_low"),
    (["learner.loss.type=vespo", "learner.loss.importance_level=sequence"], "learner.loss.vespo.importance_level"),
    (["learner.advantage.type=grpo", "learner.advantage.dense={}"], "learner.advantage.grpo.dense"),
    (["learner.advantage.value_model=shared"], "learner.advantage.rloo.value_model"),
    (["learner.advantage.type=ppo", "learner.advantage.filter_uninformative=false"], "learner.advantage.ppo.filter_uninformative"),
])
def test_a_variant_takes_only_its_own_fields(overrides, field):
    with pytest.raises(ConfigError, match=re.escape(f"  {field}: Extra inputs are not permitted")):
        load_config("configs/default.yaml", overrides)


def _schema_has(schema: dict, dotted: str) -> bool:
    """Whether the dotted path is a field of the config's schema (in any variant of a union)."""
    nodes = [schema]
    for key in dotted.split("."):
        found = []
        while nodes:
            node = nodes.pop()
            if "$ref" in node:
                nodes.append(schema["$defs"][node["$ref"].rsplit("/", 1)[-1]])
                continue
            nodes += node.get("oneOf", []) + node.get("anyOf", [])
            if key in node.get("properties", {}):
                found.append(node["properties"][key])
        nodes = found
    return bool(nodes)


@pytest.mark.parametrize("old", list(MOVED))
def test_a_moved_field_names_its_new_place_in_a_file_and_an_override(old, tmp_path):
    new = MOVED[old]
    tree = value = {}
    keys = old.split(".")
    for key in keys[:-1]:
        value = value.setdefault(key, {})
    value[keys[-1]] = 1
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(tree))
    with pytest.raises(ConfigError, match=re.escape(f"config file {path}: {old} was moved: use {new}")):
        load_config(path)
    (tmp_path / "child.yaml").write_text("extends: old.yaml\n")  # a file it extends, too
    with pytest.raises(ConfigError, match=re.escape(f"{old} was moved")):
        load_config(tmp_path / "child.yaml")
    with pytest.raises(ConfigError, match=re.escape(f"override: {old} was moved: use {new}")):
        load_config("configs/default.yaml", [f"{old}=1"])
    # every place it names is a field of the schema
    schema = config_schema()
    places = re.findall(r"\b(?:learner|env)(?:\.\w+)+", new) or [new.split()[0]]
    assert places and all(_schema_has(schema, p) for p in places), places


def test_the_sandbox_backend_is_a_variant_with_the_containers_limits_its_own():
    config = load_config("configs/default.yaml", ["reward.pool.backend.type=docker", "reward.pool.backend.memory_mb=4096"])
    assert (config.reward.pool.backend.type, config.reward.pool.backend.memory_mb, config.reward.pool.backend.pids) == ("docker", 4096, 128)
    assert load_config("configs/default.yaml").reward.pool.backend.type == "process"
    with pytest.raises(ConfigError, match=re.escape("backend: {type: docker} (an override: reward.pool.backend.type=docker)")):
        load_config("configs/default.yaml", ["reward.pool.backend=docker"])  # the earlier shape
    with pytest.raises(ConfigError, match=r"reward\.pool\.backend\.process\.memory_mb: Extra inputs are not permitted"):
        load_config("configs/default.yaml", ["reward.pool.backend.memory_mb=4096"])  # the process backend has none


def test_the_schema_checks_every_shipped_file_and_names_the_variants(capsys):
    jsonschema = pytest.importorskip("jsonschema")
    schema = config_schema()
    for path in CONFIGS:
        jsonschema.validate(yaml.safe_load(path.read_text()) or {}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"learner": {"loss": {"type": "sapo", "eps_low": 0.1}}}, schema)
    learner = schema["$defs"]["LearnerConfig"]["properties"]
    assert set(learner["loss"]["discriminator"]["mapping"]) == {"clip", "cispo", "sapo", "vespo"}
    assert set(learner["advantage"]["discriminator"]["mapping"]) == {"rloo", "grpo", "dr_grpo", "reinforce_pp", "reinforce", "ppo"}
    env = schema["properties"]["env"]
    assert env["discriminator"]["propertyName"] == "name"
    assert set(env["discriminator"]["mapping"]) == {"single", "refine", "interpreter"}
    from coderloo.cli import main

    assert main(["config", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == schema


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

    assert main(["train", "--config", "configs/default.yaml", "learner.loss.eps_low=2"]) == 2
    assert "learner.loss.clip.eps_low: Input should be less than 1" in capsys.readouterr().err


def test_the_learning_rate_warms_up_linearly_then_stays():
    assert [load_config(None).learner.lr_at(s) for s in (1, 50)] == [2e-4, 2e-4]
    config = load_config(None, ["learner.lr=1e-3", "learner.warmup_steps=4"])
    assert [config.learner.lr_at(s) for s in (1, 2, 4, 5, 60)] == pytest.approx([2.5e-4, 5e-4, 1e-3, 1e-3, 1e-3])


def test_kl_is_absent_by_default_and_its_schedule_is_linear_then_flat():
    assert load_config(None).learner.kl is None and load_config(None).learner.kl_coef_at(1) == 0.0
    config = load_config(None, ["learner.kl.coef=0.1", "learner.kl.coef_final=0.0", "learner.kl.schedule_steps=10"])
    assert [round(config.learner.kl_coef_at(s), 3) for s in (1, 6, 11, 50)] == [0.1, 0.05, 0.0, 0.0]
    assert load_config(None, ["learner.kl.coef=0.2"]).learner.kl_coef_at(99) == 0.2
    # a KL in the reward is the algorithm's: none of it in the loss
    assert load_config(None, ["learner.kl.coef=0.2", "learner.kl.into=reward"]).learner.loss_kl_coef(1) == 0.0


def test_dense_rewards_give_the_reward_service_the_policy_tokenizer():
    from coderloo.runtime import REPO_ROOT

    assert load_config("configs/default.yaml").reward.tokenizer_path is None  # no per-token rewards: no cost
    cfg = load_config("configs/default.yaml", ["learner.advantage.dense={}"])
    assert cfg.reward.tokenizer_path == str(REPO_ROOT / ".cache/tiny-qwen2")  # absolute: the replicas' cwd may differ
    cfg = load_config("configs/real-135m.yaml", ["learner.advantage.dense={}"])  # a fetched model: under ~
    assert cfg.reward.tokenizer_path == str(Path.home() / ".cache/coderloo/models/smollm2-135m-instruct")
    cfg = load_config(None, ["learner.advantage.dense={}", "model.path=/models/m", "reward.tokenizer_path=/tok"])
    assert cfg.reward.tokenizer_path == "/tok"
    with pytest.raises(ConfigError, match="learner.advantage.rloo.dense.gamma"):
        load_config(None, ["learner.advantage.dense.gamma=1.5"])


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


def test_in_flight_updates_need_overlap_the_vllm_engine_and_whole_weight_pushes():
    assert load_config("configs/async-pinned.yaml", ["rollout.update_in_flight=true"]).rollout.update_in_flight
    with pytest.raises(ConfigError, match="rollout.update_in_flight with train.max_staleness 0"):
        load_config("configs/default.yaml", ["rollout.update_in_flight=true"])
    with pytest.raises(ConfigError, match="rollout.update_in_flight: the transformers backend"):
        load_config("configs/async-pinned.yaml", ["rollout.update_in_flight=true", "rollout.backend=transformers"])
    with pytest.raises(ConfigError, match="rollout.update_in_flight with a LoRA adapter push"):
        load_config("configs/lora.yaml", ["rollout.update_in_flight=true", "train.max_staleness=1"])
    assert load_config("configs/lora.yaml", ["rollout.update_in_flight=true", "train.max_staleness=1", "learner.lora.sync=merged"])


def test_partial_rollouts_need_in_flight_updates():
    on = ["rollout.update_in_flight=true", "train.partial_rollouts=true"]
    assert load_config("configs/async-pinned.yaml", on).train.partial_rollouts
    with pytest.raises(ConfigError, match="train.partial_rollouts needs rollout.update_in_flight"):
        load_config("configs/async-pinned.yaml", ["train.partial_rollouts=true"])
    assert load_config("configs/refine.yaml", [*on, "train.max_staleness=1"]).env.multi_turn


def test_placement_options_leave_ray_defaults_alone():
    from common.placement import placement_options

    # no option at all: the actor holds no CPU while it runs (2 cores fit learner + worker + replica)
    assert placement_options(0, {}) == {}
    assert placement_options(1, {"rollout_gpu": 1}) == {"num_gpus": 1, "resources": {"rollout_gpu": 1}}


def test_a_config_extends_another_section_by_section(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("learner:\n  lr: 1.0e-3\n  loss:\n    eps_low: 0.1\n    eps_high: 0.1\ntrain:\n  steps: 7\n")
    (tmp_path / "sub").mkdir()
    child = tmp_path / "sub" / "child.yaml"
    child.write_text("extends: ../base.yaml\nlearner:\n  loss:\n    eps_high: 0.3\n")
    config = load_config(child, ["train.steps=9"])
    assert (config.learner.lr, config.learner.loss.eps_low, config.learner.loss.eps_high, config.train.steps) == (1e-3, 0.1, 0.3, 9)
    (tmp_path / "loop.yaml").write_text("extends: loop.yaml\n")
    with pytest.raises(ConfigError, match="extends loop.yaml makes a cycle"):
        load_config(tmp_path / "loop.yaml")
    (tmp_path / "orphan.yaml").write_text("extends: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=r"nowhere.yaml does not exist \(extended by .*orphan.yaml\)"):
        load_config(tmp_path / "orphan.yaml")


@pytest.mark.parametrize("name", ["dapo", "dr-grpo", "gspo", "ppo"])
def test_method_presets_change_only_the_algorithm_and_the_run_directory(name):
    preset, default = load_config(f"configs/{name}.yaml"), load_config("configs/default.yaml")
    assert preset.rollout == default.rollout and preset.sft == default.sft and preset.tasks == default.tasks
    assert preset.train.output_dir == f"runs/{name}"  # never the default's run directory


def test_estimators_that_take_one_sample_per_prompt_and_what_ppo_cannot_do():
    # k = 1: the estimators without a group baseline take it, the others name the field
    for estimator in ("ppo", "reinforce"):
        assert load_config("configs/default.yaml", [f"learner.advantage.type={estimator}", "rollout.samples_per_prompt=1"])
    with pytest.raises(ConfigError, match="rollout.samples_per_prompt=1: advantage rloo compares the samples"):
        load_config("configs/default.yaml", ["rollout.samples_per_prompt=1"])
    with pytest.raises(ConfigError, match="train.replay_groups with advantage ppo"):
        load_config("configs/ppo.yaml", ["train.replay_groups=2"])
    with pytest.raises(ConfigError, match="max_refill_rounds: advantage ppo keeps every group"):
        load_config("configs/ppo.yaml", ["train.max_refill_rounds=2"])
    assert load_config("configs/ppo.yaml").reward.tokenizer_path is not None  # the dense rewards' tokenizer


def test_a_moving_kl_reference_needs_weights_of_its_own_and_a_mix():
    moving = load_config("configs/default.yaml", ["learner.kl={coef: 0.01, reference_mix: 0.01, reference_every: 4}"]).learner
    assert moving.own_reference and moving.kl.reference_every == 4
    with pytest.raises(ConfigError, match="reference_every is set but reference_mix is 0"):
        load_config("configs/default.yaml", ["learner.kl={coef: 0.01, reference_every: 4}"])
    with pytest.raises(ConfigError, match="lora with kl.reference_mix"):
        load_config("configs/lora.yaml", ["learner.kl={coef: 0.01, reference_mix: 0.01}"])
    assert not load_config("configs/lora.yaml", ["learner.kl={coef: 0.01}"]).learner.own_reference


@pytest.mark.parametrize("native", [True, False])
def test_dtype_auto_is_bfloat16_where_it_is_computed_and_float32_where_emulated(monkeypatch, native):
    import common.cpus

    monkeypatch.setattr(common.cpus, "computes_bf16", lambda: native)
    auto = ["rollout.dtype=auto", "learner.dtype=auto"]
    cpu = load_config("configs/default.yaml", auto)
    assert (cpu.rollout.dtype, cpu.learner.dtype) == (("bfloat16",) * 2 if native else ("float32",) * 2)
    gpu = load_config("configs/default.yaml", [*auto, "rollout.gpus_per_worker=1", "learner.device=cuda"])
    assert (gpu.rollout.dtype, gpu.learner.dtype) == ("bfloat16", "bfloat16")
    cpu.learner.dtype = cpu.rollout.dtype = "auto"  # set in code, as benches do
    assert (cpu.rollout.dtype, cpu.learner.dtype) == (("bfloat16",) * 2 if native else ("float32",) * 2)
    # the transformers backend generates in float32 only
    assert load_config("configs/default.yaml", [*auto, "rollout.backend=transformers"]).rollout.dtype == "float32"
