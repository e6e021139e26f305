"""The controller is killed with SIGKILL on a real local Ray cluster and `coderloo train --resume`
finishes the run; and what the runs with faults share (the actors' faults, in one run:
tests/test_faults.py)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import ray

from coderloo.config import load_config
from coderloo.controller import train
from coderloo.metrics import read_metrics

ROOT = Path(__file__).resolve().parent.parent

SMALL = [
    "sft.steps=2",
    "sft.batch_size=8",
    "train.prompts_per_step=4",
    "train.eval_every=0",
    "rollout.samples_per_prompt=4",
    "rollout.max_new_tokens=16",
    "learner.advantage.filter_uninformative=false",
    "tasks.max_eval_tasks=2",
    "eval.samples_per_task=2",
    "eval.k=[1]",
    "eval.greedy=false",
]


def rl_steps(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [r for r in read_metrics(path) if r["phase"] == "rl"] if path.exists() else []


def wait_for_step(out: Path, step: int, timeout: float = 600) -> None:
    wait_for_record(out, lambda r: r["step"] >= step, f"step {step}", timeout)


def wait_for_record(out: Path, where, what: str, timeout: float = 600) -> dict:
    """The first RL record in `out` for which `where` holds, once one is written."""
    deadline = time.time() + timeout
    while not (found := [r for r in rl_steps(out) if where(r)]):
        if time.time() > deadline:
            raise TimeoutError(f"{what} not reached in {out}")
        time.sleep(0.2)
    return found[0]


def named(prefix: str) -> list[tuple[str, str]]:
    return [(a["name"], a["namespace"]) for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)]


KILL_AFTER_CHECKPOINT = """
import sys
from coderloo.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_killed_controller_resumes_from_the_last_checkpoint(ray_cluster, tiny_model, tmp_path):
    out = tmp_path / "killed"
    # The controller in its own process, a driver of the test's Ray cluster: when it dies, Ray
    # removes the actors it owned.
    gcs = ray.get_runtime_context().gcs_address
    args = ["train", f"model.path={tiny_model}", f"train.output_dir={out}", "train.steps=4", "train.checkpoint_every=2",
            f"ray_address={gcs}", *SMALL]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    terminal = (tmp_path / "terminal.txt").open("w")
    proc = subprocess.Popen([sys.executable, "-c", KILL_AFTER_CHECKPOINT, *args], cwd=ROOT, env=env,
                            stdout=terminal, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 600
        while not (out / "checkpoints" / "latest").exists():
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.time() < deadline
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert json.loads((out / "checkpoints" / "step_2" / "trainer_state.json").read_text())["step"] == 2
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
    config = load_config("configs/default.yaml", args[1:])
    try:
        summary = train(config, resume=True)
    finally:
        # The killed driver had started Serve on this cluster (its HTTP proxy on a port of its
        # choosing); later tests start their own.
        from ray import serve

        serve.shutdown()
    assert [r["step"] for r in rl_steps(out)] == [1, 2, 3, 4]
    assert summary["policy_version"] >= 5
    assert (out / "checkpoints" / "final" / "model.safetensors").exists()
