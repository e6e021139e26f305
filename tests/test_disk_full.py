"""A disk that fills while a checkpoint is written: the run stops with an error that says so, its
partial files are removed, `latest` still names the last whole checkpoint, metrics.jsonl still
reads, and `--resume` finishes the run once there is space again. The disk is a small tmpfs
mounted as train.output_dir (root: CI runs as root), filled for real by a file the test writes."""
import os
import subprocess
import threading
import time

import pytest

from coderloo.checkpoint import CheckpointError, latest_checkpoint
from coderloo.config import load_config
from coderloo.controller import train
from coderloo.metrics import read_metrics
from tests.test_fault_tolerance import SMALL, rl_steps

FREE_AFTER_FILLING = 2 * 2**20  # under a checkpoint of the tiny model (its weights alone are ~3.5 MiB), over a metrics line


@pytest.fixture
def small_disk(tmp_path):
    path = tmp_path / "disk"
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(path)], capture_output=True, text=True, check=False)
    assert mounted.returncode == 0, f"mounting a tmpfs needs root: {mounted.stderr}"
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(disk, leave: int) -> None:
    """A file that takes all of `disk`'s space but `leave` bytes."""
    stat = os.statvfs(disk)
    with open(disk / "ballast", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, stat.f_bavail * stat.f_frsize - leave)


def test_disk_full_during_a_checkpoint_stops_cleanly_and_resumes(ray_cluster, tiny_model, small_disk):
    out = small_disk / "run"
    args = [f"model.path={tiny_model}", f"train.output_dir={out}", "train.steps=4", "train.checkpoint_every=1", *SMALL]
    config = load_config("configs/default.yaml", args)
    latest = out / "checkpoints" / "latest"

    def fill_after_first_checkpoint():
        deadline = time.time() + 600
        while not (latest.exists() and latest.read_text() == "step_1") and time.time() < deadline:
            time.sleep(0.05)
        fill(small_disk, FREE_AFTER_FILLING)

    filler = threading.Thread(target=fill_after_first_checkpoint, daemon=True)
    filler.start()
    with pytest.raises(CheckpointError) as error:
        train(config)
    filler.join(timeout=5)
    message = str(error.value)
    assert "checkpoint step_2" in message and "the disk is full" in message and "`latest` still names step_1" in message, message
    checkpoints = out / "checkpoints"
    assert latest_checkpoint(checkpoints) == checkpoints / "step_1"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step_1"]  # the partial step_2 is gone
    assert [r["step"] for r in rl_steps(out)] == [1, 2]  # every line whole: the file reads
    read_metrics(out / "samples.jsonl")

    (small_disk / "ballast").unlink()  # space is back
    summary = train(config, resume=True)
    assert [r["step"] for r in rl_steps(out)] == [1, 2, 3, 4]
    assert latest_checkpoint(checkpoints) == checkpoints / "step_4"
    assert (checkpoints / "final" / "model.safetensors").exists() and summary["final"]
