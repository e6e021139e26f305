"""The memory and placement plan (coderloo/ops/plan.py): its parameter and activation counts against real
Qwen2 models, what it accepts and refuses, the command, and the GPU configs' headers it wrote."""
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from coderloo.cli import main
from coderloo.ops.cluster_files import validate_cluster_file
from coderloo.config import load_config
from coderloo.ops.plan import HEADER_END, HEADER_START, PUBLISHED, Architecture, header, plan, plan_from_files
from tests import autograd_memory

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [  # hidden, intermediate, layers, heads, kv heads, tied
    (64, 192, 2, 4, 2, True), (96, 160, 3, 6, 3, False), (128, 384, 1, 8, 8, True),
]


def qwen2(shape, vocab=300) -> tuple[Qwen2ForCausalLM, Architecture]:
    hidden, intermediate, layers, heads, kv, tied = shape
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=tied)
    return Qwen2ForCausalLM(config), Architecture(vocab, hidden, intermediate, layers, heads, kv, tied)


@pytest.mark.parametrize("shape", SHAPES)
def test_parameter_count_is_the_models(shape):
    model, arch = qwen2(shape)
    assert arch.parameters() == sum(p.numel() for p in model.parameters())


def saved_bytes(model, tokens: int) -> int:
    """Bytes autograd keeps for one forward pass as the learner calls it: no mask, no cache, the head on one position."""
    ids = torch.randint(0, model.config.vocab_size, (1, tokens))
    return autograd_memory.saved_bytes(
        model, lambda: model(input_ids=ids, position_ids=torch.arange(tokens)[None], use_cache=False, logits_to_keep=1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES[:2])
def test_activations_per_token_per_layer_are_the_saved_tensors(shape, dtype):
    """A model of one more layer keeps exactly the formula's bytes more per token, at any length."""
    torch.manual_seed(0)
    hidden, intermediate, layers, heads, kv, tied = shape
    small, _ = qwen2((hidden, intermediate, 1, heads, kv, tied))
    large, arch = qwen2((hidden, intermediate, 2, heads, kv, tied))
    for tokens in (32, 96):
        per_layer = (saved_bytes(large.to(dtype), tokens) - saved_bytes(small.to(dtype), tokens)) / tokens
        assert per_layer == arch.activation_bytes_per_token_per_layer(torch.finfo(dtype).bits // 8)


def test_lora_parameters_are_peft_s():
    from learner import lora
    from learner.config import LoraSettings

    model, arch = qwen2(SHAPES[1])
    settings = LoraSettings(rank=4)
    trained = sum(p.numel() for p in lora.wrap(model, settings).parameters() if p.requires_grad)
    assert arch.lora_parameters(4, settings.target_modules) == trained


def test_published_shapes():
    assert PUBLISHED["qwen2.5-coder-0.5b"].parameters() == 494_032_768  # Qwen2.5-Coder-0.5B's 0.49B
    assert round(PUBLISHED["qwen2.5-coder-1.5b"].parameters() / 1e9, 2) == 1.54
    assert round(PUBLISHED["qwen2.5-coder-7b"].parameters() / 1e9, 2) == 7.62


def test_a_plan_fills_no_more_than_rays_memory_monitor_allows(monkeypatch):
    """Ray kills a worker once its node's memory use passes RAY_memory_usage_threshold (0.95 by
    default): that share of the machine is what a plan may fill."""
    import psutil

    total = psutil.virtual_memory().total
    assert plan(load_config("configs/default.yaml")).actors[1].capacity == pytest.approx(0.95 * total)
    monkeypatch.setenv("RAY_memory_usage_threshold", "0.5")
    assert plan(load_config("configs/default.yaml")).actors[1].capacity == pytest.approx(0.5 * total)


def test_default_config_fits_this_machine():
    p = plan(load_config("configs/default.yaml"))
    assert p.fits, p.problems
    names = [a.name for a in p.actors]
    assert names == ["driver", "learner rank", "rollout worker", "reward replica", "sandbox executor"]
    learner = p.actors[1]
    assert set(learner.components) >= {"weights", "gradients", "optimizer", "activations", "logits"}
    assert learner.components["weights"] == p.parameters * 4  # float32, not partitioned at ZeRO-0


def test_zero_partitions_the_states():
    base = load_config("configs/scale-0.5b.yaml")
    by_stage = {}
    for stage in range(4):
        config = base.model_copy(update={"learner": base.learner.model_copy(update={"zero_stage": stage})})
        by_stage[stage] = plan(config).actors[1].components
    n = by_stage[0]["weights"] / 2  # bf16
    assert by_stage[0]["optimizer"] == 12 * n and by_stage[1]["optimizer"] == 6 * n  # fp32 master + 2 moments, / 2 ranks
    assert by_stage[2]["gradients"] < by_stage[1]["gradients"]
    assert by_stage[3]["weights"] == by_stage[2]["weights"] / 2


def test_the_kl_reference_is_a_copy_in_the_training_dtype_and_a_moving_one_in_float32():
    frozen = plan(load_config("configs/scale-0.5b.yaml", ["learner.kl={coef: 0.01}"])).actors[1].components
    moving = plan(load_config("configs/scale-0.5b.yaml", ["learner.kl={coef: 0.01, reference_mix: 0.01}"])).actors[1].components
    assert frozen["reference"] == frozen["weights"]  # bf16, whole on each rank at ZeRO-2
    assert moving["reference"] == 2 * frozen["reference"]  # float32
    assert "reference" not in plan(load_config("configs/scale-0.5b.yaml")).actors[1].components


def test_seven_b_at_zero_stage_0_is_refused_naming_the_learner():
    cluster = validate_cluster_file(ROOT / "cluster.yaml")
    assert plan(load_config("configs/qwen2.5-coder-7b.yaml"), cluster).fits
    p = plan(load_config("configs/qwen2.5-coder-7b.yaml", ["learner.zero_stage=0"]), cluster)
    assert len(p.problems) == 1, p.problems
    assert p.problems[0].startswith("learner rank: needs") and "learner_a100" in p.problems[0]
    assert "learner.zero_stage" in p.problems[0]


def test_a_tiny_config_too_big_for_this_machine_is_refused_naming_the_actor(monkeypatch):
    p = plan(load_config("configs/default.yaml", ["learner.max_tokens_per_micro_batch=10000000"]))
    assert any(pr.startswith("learner rank:") and "learner.max_tokens_per_micro_batch" in pr for pr in p.problems), p.problems
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "100000")
    p = plan(load_config("configs/default.yaml", ["rollout.num_workers=2"]))
    assert any(pr.startswith("rollout worker:") and "VLLM_CPU_KVCACHE_SPACE" in pr for pr in p.problems), p.problems


def test_a_kv_cache_that_cannot_hold_one_sequence_is_refused(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.001")
    p = plan(load_config("configs/scale-0.5b.yaml"))
    assert any(pr.startswith("rollout worker: its KV cache") and "rollout.max_model_len=1,024" in pr for pr in p.problems)


def test_command(capsys):
    assert main(["plan", "--config", "configs/qwen2.5-coder-7b.yaml", "--cluster", "cluster.yaml"]) == 0
    out = capsys.readouterr().out
    assert "learner rank      8      learner_a100  gpu A100" in out and "Qwen2.5-Coder-7B" in out
    assert main(["plan", "--config", "configs/qwen2.5-coder-7b.yaml", "--cluster", "cluster.yaml", "learner.zero_stage=0"]) == 2
    assert "coderloo plan: learner rank: needs" in capsys.readouterr().err
    assert main(["plan", "--config", "configs/scale-0.5b.yaml"]) in (0, 2)  # made whether or not it fits this machine
    assert "model: 494,032,768 parameters" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-short", "qwen2.5-coder-7b"])
def test_gpu_config_headers_are_the_plans(name):
    path = f"configs/{name}.yaml"
    text = (ROOT / path).read_text()
    assert "Memory per GPU (estimated" not in text
    written = text[text.index(HEADER_START):text.index(HEADER_END)]
    command = f"coderloo plan --config {path} --cluster cluster.yaml --write-header"
    made = header(plan_from_files(load_config(ROOT / path), str(ROOT / "cluster.yaml")), command)
    # the model's source line depends on whether the weights are on this machine; its numbers do not
    drop = lambda block: [line.replace(str(ROOT) + "/", "") for line in block.splitlines() if "#   model:" not in line]  # noqa: E731
    assert drop(written) == drop(made[:made.index(HEADER_END)])
