"""Checkpoints and resume: a kill -9 while writing one never corrupts the latest, and one chain of
runs shows `--resume` continues a run exactly (the same samples, losses and weights as a run that
never stopped) with everything a checkpoint carries at once: the policy's LoRA adapter and its
base, a PPO value model, the CodeRL critic. The chain is interrupted twice, as runs are: its
controller is killed with SIGKILL after a checkpoint, then the disk fills while a later
checkpoint is written (a small tmpfs, filled for real; root: CI runs as root)."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import ray
import torch
from safetensors.torch import load_file

from coderloo.checkpoint import CheckpointError, latest_checkpoint, prune_checkpoints, read_state, write_checkpoint
from coderloo.config import load_config
from coderloo.controller import train
from coderloo.metrics import read_metrics
from tests.runs import named, rl_steps

ROOT = Path(__file__).resolve().parent.parent

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



# configs/ppo.yaml (a value model, GAE over dense rewards, a per-token KL) with one sample a prompt,
# configs/lora.yaml's adapter on the SFT'd policy, and the critic: all of a checkpoint's parts.
CHAIN = [
    "train.steps=4", "train.checkpoint_every=1", "train.eval_every=0", "train.prompts_per_step=6",
    "rollout.samples_per_prompt=1", "rollout.max_new_tokens=16",
    "sft.steps=80",  # some programs pass: the adapter's evaluation below compares real numbers
    "learner.lr=1e-3", "learner.lora.start=rl", "learner.lora.sync=adapter",
    "critic.enabled=true", "critic.select_n=2",
    "train.max_staleness=0",  # exact: no step's samples are in flight at a checkpoint
    "tasks.max_eval_tasks=12", "eval.samples_per_task=2", "eval.k=[1]",
]
FREE_AFTER_FILLING = 2 * 2**20  # under a checkpoint of the tiny model (its weights alone are ~3.5 MiB), over a metrics line
CONTROLLER = """
import sys
from coderloo.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def small_disk(tmp_path):
    path = tmp_path / "disk"
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", str(path)], capture_output=True, text=True, check=False)
    assert mounted.returncode == 0, f"mounting a tmpfs needs root: {mounted.stderr}"
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(disk: Path, leave: int) -> None:
    """A file that takes all of `disk`'s space but `leave` bytes."""
    stat = os.statvfs(disk)
    with open(disk / "ballast", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, stat.f_bavail * stat.f_frsize - leave)


def chain_args(tiny_model, out) -> list[str]:
    return [f"model.path={tiny_model}", f"train.output_dir={out}", *CHAIN]


def kill_controller_after_its_first_checkpoint(args: list[str], terminal: Path, config: str = "configs/ppo.yaml") -> str:
    """The controller in its own process, a driver of the test's Ray cluster, killed with SIGKILL
    once a checkpoint is written (when it dies, Ray removes the actors it owned); the checkpoint
    `latest` named then."""
    gcs = ray.get_runtime_context().gcs_address
    latest = Path(args[1].split("=", 1)[1]) / "checkpoints" / "latest"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with terminal.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-c", CONTROLLER, "train", "--config", config, *args,
                                 f"ray_address={gcs}"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            deadline = time.time() + 600
            while not latest.exists():
                assert proc.poll() is None, "the run ended before its first checkpoint"
                assert time.time() < deadline
                time.sleep(0.2)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    return latest.read_text()


@pytest.mark.timeout(1800)  # four runs in one test
def test_resume_continues_exactly_after_a_killed_controller_and_a_full_disk(ray_cluster, tiny_model, tmp_path, small_disk, capsys):
    from coderloo.cli import main

    straight_out, out = tmp_path / "straight", small_disk / "run"
    straight = train(load_config("configs/ppo.yaml", chain_args(tiny_model, straight_out)))

    # 1. the controller is killed
    args = chain_args(tiny_model, out)
    killed_at = kill_controller_after_its_first_checkpoint(args, tmp_path / "terminal.txt")
    killed_step = int(killed_at.removeprefix("step_"))
    checkpoints = out / "checkpoints"
    assert json.loads((checkpoints / killed_at / "trainer_state.json").read_text())["step"] == killed_step
    # the quiet console: the run's own lines on its terminal, the actors' and Serve's in logs/
    shown = (tmp_path / "terminal.txt").read_text()
    assert "rl:" in shown and "[eval base step 0]" in shown, shown[-2000:]
    assert "pid=" not in shown and "CALL score" not in shown and "INFO" not in shown, shown[-2000:]
    actors_log = (out / "logs" / "actors.log").read_text()
    assert "(RolloutWorker pid=" in actors_log and "(Learner pid=" in actors_log

    def drivers_actors():
        return named("coderloo-rollout-") + named("coderloo-learner-")

    deadline = time.time() + 60
    while drivers_actors() and time.time() < deadline:  # the dead driver's actors go away
        time.sleep(0.5)
    assert not drivers_actors(), drivers_actors()

    # 2. resumed, the disk fills once the next checkpoint is written: the one after it fails
    config = load_config("configs/ppo.yaml", args)
    full_at = killed_step + 1
    latest = checkpoints / "latest"

    def fill_after_the_next_checkpoint():
        deadline = time.time() + 600
        while not (latest.exists() and latest.read_text() == f"step_{full_at}") and time.time() < deadline:
            time.sleep(0.05)
        fill(small_disk, FREE_AFTER_FILLING)

    filler = threading.Thread(target=fill_after_the_next_checkpoint, daemon=True)
    filler.start()
    try:
        with pytest.raises(CheckpointError) as error:
            train(config, resume=True)
        filler.join(timeout=5)
        message = str(error.value)
        assert f"checkpoint step_{full_at + 1}" in message and "the disk is full" in message, message
        assert f"`latest` still names step_{full_at}" in message, message
        assert latest_checkpoint(checkpoints) == checkpoints / f"step_{full_at}"
        assert not [p.name for p in checkpoints.iterdir() if p.name.startswith(".")]  # the partial one is gone
        assert [r["step"] for r in rl_steps(out)] == list(range(1, full_at + 2))  # every line whole: the file reads
        read_metrics(out / "samples.jsonl")

        # 3. space is back: resumed again, it finishes
        (small_disk / "ballast").unlink()
        resumed = train(config, resume=True)
    finally:
        # The killed driver had started Serve on this cluster (its HTTP proxy on a port of its
        # choosing); later tests start their own.
        from ray import serve

        serve.shutdown()
    assert latest_checkpoint(checkpoints) == checkpoints / "step_4"

    a, b = rl_steps(straight_out), rl_steps(out)
    # Both runs compute along one path (this machine's kernels, the same shapes and order), so the
    # samples are the same to the bit; the losses and weights are held to rounding nonetheless.
    assert [r["step"] for r in b] == [1, 2, 3, 4]  # no step lost or counted twice
    for ra, rb in zip(a, b):
        assert ra["reward_mean"] == rb["reward_mean"], ra["step"]  # the same samples
        assert ra["version"] == rb["version"]
        for key in ("loss", "value_loss", "critic_loss"):
            assert abs(ra[key] - rb[key]) < 1e-5, (ra["step"], key, ra[key], rb[key])
    assert resumed["policy_version"] == straight["policy_version"]
    assert resumed["final"] == straight["final"]
    final, straight_final = checkpoints / "final", straight_out / "checkpoints" / "final"
    before = load_file(tiny_model / "model.safetensors")
    for part in ("model.safetensors", "adapter/adapter_model.safetensors", "base/model.safetensors"):
        wa, wb = load_file(straight_final / part), load_file(final / part)
        assert set(wa) == set(wb), part
        for name in wa:
            assert torch.allclose(wa[name], wb[name], atol=1e-5), (part, name)
    merged = load_file(final / "model.safetensors")
    assert any(not torch.allclose(merged[n], before[n]) for n in merged)

    # PPO with k = 1: every sample trains, the value model starts at zero, learns and resumes
    for r in b:
        assert r["samples"] == 6 and r["groups_filtered"] == 0 and r["grad_norm"] is not None  # no group baseline to filter by
        assert r["value_loss"] >= 0 and 0 <= r["value_clip_fraction"] <= 1 and r["value_grad_norm"] > 0
        assert r["kl_sequence_mean"] is not None and r["learner_rss_mb_max"] > 0
    assert b[0]["value_estimate_mean"] == 0.0  # the head starts at zero
    assert b[-1]["value_estimate_mean"] != 0.0  # and after a resume it is the trained one, not a new one
    assert (checkpoints / "step_4" / "deepspeed_value").is_dir()
    assert not any("value" in name for name in merged)

    # LoRA: each RL push carries only the adapter; the checkpoint holds the adapter in PEFT's format
    # next to its base and the merged model
    full_bytes = sum(t.numel() * t.element_size() for t in before.values())
    for r in b:
        assert 0 < r["sync_bytes"] < full_bytes / 5, "a push of more than the adapter"
    assert (final / "adapter" / "adapter_config.json").is_file()
    assert set(merged) <= set(before) and set(load_file(final / "base" / "model.safetensors")) <= set(before)
    # `coderloo eval --model base --adapter adapter` gives the run's own final evaluation
    capsys.readouterr()
    report_path = tmp_path / "adapter-eval.json"
    eval_args = ["eval", "--config", "configs/ppo.yaml", "--model", str(final / "base"), "--adapter", str(final / "adapter"),
                 "--out", str(report_path), *args]
    assert main(eval_args) == 0
    report = json.loads(report_path.read_text())
    assert report["adapter"] == str(final / "adapter") and report["tasks"] == 12
    assert report["greedy_pass@1"] == resumed["final"]["greedy_pass@1"]
    assert resumed["final"]["greedy_pass@1"] > 0, "nothing passes: the comparison says little"
    assert main(["eval", "--model", str(tiny_model), "--adapter", str(tmp_path)]) == 2
    assert "no adapter_config.json" in capsys.readouterr().err


PARTIAL = [
    "train.steps=4", "train.checkpoint_every=2", "train.eval_every=0", "train.prompts_per_step=4",
    "train.max_staleness=1", "rollout.update_in_flight=true", "train.partial_rollouts=true",
    "sft.steps=10", "tasks.max_eval_tasks=4", "eval.samples_per_task=2", "eval.k=[1]",
]


def test_partial_rollouts_resume_reissues_exactly_the_groups_not_trained(ray_cluster, tiny_model, tmp_path):
    """Partial rollouts, the controller killed after a checkpoint while groups are in flight:
    `--resume` generates exactly the groups no step had taken, and over the whole run no group is
    trained twice or lost (each is trained, dropped for staleness and counted, or still in flight
    at the end). The synthetic train set holds more tasks than the run draws, so a task id names
    one group."""
    out = tmp_path / "run"
    args = [f"model.path={tiny_model}", f"train.output_dir={out}", *PARTIAL]
    try:
        killed_at = kill_controller_after_its_first_checkpoint(args, tmp_path / "terminal.txt", config="configs/default.yaml")
        checkpoints = out / "checkpoints"
        state = read_state(checkpoints / killed_at)
        in_flight = [i for ids in state["in_flight"] for i in ids]
        assert state["step"] == 2 and len(in_flight) == 4, state["in_flight"]  # a pool of 8, 4 taken by step 2
        deadline = time.time() + 60
        while named("coderloo-rollout-") and time.time() < deadline:  # the dead driver's actors go away
            time.sleep(0.5)
        train(load_config("configs/default.yaml", args), resume=True)
    finally:
        from ray import serve

        serve.shutdown()  # the killed driver's Serve
    steps = {r["step"]: r for r in read_metrics(out / "samples.jsonl") if r["phase"] == "rl"}
    assert sorted(steps) == [1, 2, 3, 4]
    trained = [i for s in sorted(steps) for i in steps[s]["trained"]]
    assert len(trained) == 16 and len(set(trained)) == 16, trained  # no group trained twice
    before, after = [i for s in (1, 2) for i in steps[s]["trained"]], [i for s in (3, 4) for i in steps[s]["trained"]]
    assert not set(in_flight) & set(before)  # what the checkpoint reissues had not trained
    dropped = [i for s in (3, 4) for i in steps[s]["dropped"]]
    left = [i for ids in read_state(checkpoints / "final")["in_flight"] for i in ids]
    assert set(in_flight) <= set(after) | set(dropped) | set(left)  # none lost
    assert not set(left) & set(trained) and not set(dropped) & set(trained)
    metrics = [r for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "rl"]
    assert [r["pool_dropped_groups"] for r in metrics if r["step"] > 2] == [len(steps[s]["dropped"]) for s in (3, 4)]
