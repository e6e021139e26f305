"""The cluster files against Ray's cluster schema, and the GPU configs against cluster.yaml's node types."""
from pathlib import Path

import pytest
import yaml

from coderloo.ops.cluster_files import ClusterFileError, main, placement_problems, validate_cluster_file
from coderloo.config import load_config

ROOT = Path(__file__).resolve().parent.parent
GPU_CONFIGS = ["configs/qwen2.5-coder-1.5b.yaml", "configs/qwen2.5-coder-7b.yaml",
               "configs/qwen2.5-coder-1.5b-short.yaml", "configs/eval-qwen2.5-coder-1.5b.yaml"]


@pytest.mark.parametrize("name", ["cluster.yaml", "cluster-local.yaml"])
def test_cluster_files_match_rays_schema(name):
    config = validate_cluster_file(ROOT / name)
    types = config["available_node_types"]
    assert config["head_node_type"] in types
    # sandbox nodes: none at rest, added on demand for the `sandbox` resource
    sandbox = [t for t in types.values() if t["resources"].get("sandbox")]
    assert sandbox and all(t.get("min_workers", 0) == 0 and t["max_workers"] >= 2 for t in sandbox)


def test_aws_cluster_has_the_node_types_the_design_needs():
    config = validate_cluster_file(ROOT / "cluster.yaml")
    assert config["provider"]["type"] == "aws"
    types = config["available_node_types"]
    assert types["rollout_gpu"]["resources"]["GPU"] >= 1 and types["rollout_gpu"]["resources"]["rollout_gpu"] >= 1
    assert types["learner_a100"]["resources"]["learner_gpu"] >= 1
    assert types["learner_a100"]["node_config"]["InstanceType"].startswith("p4")  # A100s
    setup = "\n".join(config["setup_commands"])
    assert "pip install" in setup and "sandbox_pool.image build" in setup  # the project and the executor image
    assert "--metrics-export-port" in " ".join(config["head_start_ray_commands"])


def test_fake_cluster_file_uses_the_fake_provider():
    config = validate_cluster_file(ROOT / "cluster-local.yaml")
    assert config["provider"]["type"] == "fake_multinode"
    assert config["head_node_type"] == "ray.head.default"  # the only head type the fake provider knows


@pytest.mark.parametrize("path", GPU_CONFIGS)
def test_gpu_configs_fit_the_cluster(path):
    config = load_config(path)
    assert placement_problems(validate_cluster_file(ROOT / "cluster.yaml"), config) == []
    assert config.rollout.gpus_per_worker >= 1 and config.rollout.dtype == "bfloat16"


def test_placement_problems_name_what_does_not_fit():
    cluster = validate_cluster_file(ROOT / "cluster.yaml")
    config = load_config("configs/qwen2.5-coder-7b.yaml", ["rollout.num_workers=9", "learner.resources={tpu: 1}"])
    problems = placement_problems(cluster, config)
    assert any(p.startswith("rollout: 9 x 1 `rollout_gpu` needed") for p in problems), problems
    assert any("learner.resources asks for `tpu`" in p for p in problems), problems


@pytest.mark.parametrize("edit, field", [
    (lambda c: c["available_node_types"]["sandbox_cpu"].pop("resources"), "available_node_types/sandbox_cpu"),
    (lambda c: c["available_node_types"]["sandbox_cpu"]["resources"].update(sandbox=-1), "sandbox"),
    (lambda c: c.update(max_workers="many"), "max_workers"),
])
def test_a_broken_cluster_file_is_refused_with_the_field(tmp_path, edit, field):
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    edit(config)
    broken = tmp_path / "cluster.yaml"
    broken.write_text(yaml.safe_dump(config))
    with pytest.raises(ClusterFileError, match=field):
        validate_cluster_file(broken)


def test_command_line_check(capsys):
    assert main(["cluster.yaml", "--config", "configs/qwen2.5-coder-7b.yaml"]) == 0
    assert main(["cluster-local.yaml", "--config", "configs/qwen2.5-coder-7b.yaml"]) == 2  # no GPU nodes there
    assert "learner.resources asks for `learner_gpu`" in capsys.readouterr().err
