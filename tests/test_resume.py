"""Checkpoints: a kill -9 while writing one never corrupts the latest, and `--resume` continues
a run exactly (the same samples, losses and weights as a run that never stopped)."""
import signal
import subprocess
import sys

import torch
from safetensors.torch import load_file

from coderloo.checkpoint import latest_checkpoint, prune_checkpoints, read_state, write_checkpoint
from coderloo.config import load_config
from coderloo.controller import train
from coderloo.metrics import read_metrics

KILLED_MID_CHECKPOINT = """
import os, signal, sys
from pathlib import Path
from coderloo.checkpoint import write_checkpoint
root = Path(sys.argv[1])
write_checkpoint(root, "step_1", lambda d: (d / "model.bin").write_bytes(b"whole"), {"step": 1})
def dies_half_way(d):
    (d / "model.bin").write_bytes(b"half")
    os.kill(os.getpid(), signal.SIGKILL)
write_checkpoint(root, "step_2", dies_half_way, {"step": 2})
"""


def test_kill_9_during_a_checkpoint_leaves_the_latest_whole(tmp_path):
    root = tmp_path / "checkpoints"
    proc = subprocess.run([sys.executable, "-c", KILLED_MID_CHECKPOINT, str(root)], check=False)
    assert proc.returncode == -signal.SIGKILL
    latest = latest_checkpoint(root)
    assert latest == root / "step_1" and read_state(latest) == {"step": 1}
    assert (latest / "model.bin").read_bytes() == b"whole"
    assert not (root / "step_2").exists()
    # The next attempt replaces the partial one.
    write_checkpoint(root, "step_2", lambda d: (d / "model.bin").write_bytes(b"again"), {"step": 2})
    assert latest_checkpoint(root) == root / "step_2"


def config_for(tiny_model, out, steps):
    return load_config(
        "configs/default.yaml",
        [
            f"model.path={tiny_model}",
            f"train.output_dir={out}",
            f"train.steps={steps}",
            "sft.steps=2",
            "sft.batch_size=8",
            "train.prompts_per_step=4",
            "train.eval_every=0",
            "train.checkpoint_every=0",
            "rollout.samples_per_prompt=4",
            "rollout.max_new_tokens=16",
            "learner.kl.coef=0.05",
            "critic.enabled=true",  # its weights, optimizer and sampling state resume too
            "critic.select_n=2",
            "learner.advantage.filter_uninformative=false",
            "train.max_staleness=0",  # exact: no step's samples are in flight at a checkpoint
            "tasks.max_eval_tasks=2",
            "eval.samples_per_task=2",
            "eval.k=[1]",
            "eval.greedy=false",
        ],
    )


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 10, 11):  # by step, not by name (step_10 sorts before step_2)
        write_checkpoint(root, f"step_{step}", lambda d: (d / "model.bin").write_bytes(b"w"), {"step": step})
    (root / "final").symlink_to("step_1")
    (root / ".step_12.partial").mkdir()  # a checkpoint being written is not one to prune
    assert prune_checkpoints(root, keep=2) == ["step_2"]  # step_1 stays: `final` links to it
    assert sorted(p.name for p in root.iterdir()) == [".step_12.partial", "final", "latest", "step_1", "step_10", "step_11"]
    assert latest_checkpoint(root) == root / "step_11"
    assert prune_checkpoints(root, keep=0) == []  # 0 keeps all


def test_resume_continues_exactly(ray_cluster, tiny_model, tmp_path):
    straight = train(config_for(tiny_model, tmp_path / "straight", 4))
    train(config_for(tiny_model, tmp_path / "resumed", 2))
    resumed = train(config_for(tiny_model, tmp_path / "resumed", 4), resume=True)

    a = [r for r in read_metrics(tmp_path / "straight" / "metrics.jsonl") if r["phase"] == "rl"]
    b = [r for r in read_metrics(tmp_path / "resumed" / "metrics.jsonl") if r["phase"] == "rl"]
    assert [r["step"] for r in b] == [1, 2, 3, 4]  # no step lost or counted twice
    for ra, rb in zip(a, b):
        assert ra["reward_mean"] == rb["reward_mean"], ra["step"]  # the same samples
        assert abs(ra["loss"] - rb["loss"]) < 1e-5, (ra["step"], ra["loss"], rb["loss"])
        assert ra["version"] == rb["version"]
        assert abs(ra["critic_loss"] - rb["critic_loss"]) < 1e-5, (ra["step"], ra["critic_loss"], rb["critic_loss"])
    assert resumed["policy_version"] == straight["policy_version"] == 5
    wa = load_file(tmp_path / "straight" / "checkpoints" / "final" / "model.safetensors")
    wb = load_file(tmp_path / "resumed" / "checkpoints" / "final" / "model.safetensors")
    before = load_file(tiny_model / "model.safetensors")
    for name in wa:
        assert torch.allclose(wa[name], wb[name], atol=1e-5), name
    assert any(not torch.allclose(wa[n], before[n]) for n in wa)
