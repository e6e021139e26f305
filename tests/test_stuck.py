"""Stuck, not dead: a rollout worker and a reward replica that stop answering (SIGSTOP) are found
within their timeouts and replaced as if they had died, and training goes on; a learner rank that
stops answering in a collective ends the run with an error naming the timeout, not a hang."""
import os
import signal
import threading

import pytest
import ray

from coderloo.config import load_config
from coderloo.controller import train
from learner.group import LearnerError
from tests.test_fault_tolerance import SMALL, named, rl_steps, wait_for_step


def stop(prefix: str) -> int:
    """SIGSTOP the live actor whose name starts with `prefix`; its pid."""
    (name, namespace), = named(prefix)
    pid = ray.get(ray.get_actor(name, namespace=namespace).__ray_call__.remote(lambda self: os.getpid()))
    os.kill(pid, signal.SIGSTOP)
    return pid


def resume_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass  # killed as stuck, as it should be


def test_stuck_rollout_worker_and_reward_replica_are_replaced(ray_cluster, tiny_model, tmp_path):
    out = tmp_path / "stuck"
    config = load_config("configs/default.yaml", [
        f"model.path={tiny_model}", f"train.output_dir={out}", "train.steps=5", "train.checkpoint_every=0", *SMALL,
        "rollout.stuck_timeout_s=10", "rollout.weight_sync.timeout_s=20",
        "reward.request_timeout_s=10", "reward.health_check_period_s=1", "reward.health_check_timeout_s=5"])
    stopped: list[int] = []

    def stopper():
        wait_for_step(out, 1)
        stopped.append(stop("coderloo-rollout-0-stuck"))
        wait_for_step(out, 3)
        stopped.append(stop("SERVE_REPLICA::coderloo-rewards"))

    thread = threading.Thread(target=stopper, daemon=True)
    thread.start()
    try:
        summary = train(config)
    finally:
        thread.join(timeout=5)
        resume_all(stopped)
    assert len(stopped) == 2
    steps = rl_steps(out)
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]  # no step lost or repeated
    assert all(r["samples"] == 16 for r in steps)  # the stuck worker's prompts were generated again, once
    assert steps[-1]["rollout_workers_stuck"] >= 1
    assert steps[-1]["reward_requests_retried"] >= 1  # the stuck replica's requests were sent again
    assert summary["final"]


def test_stuck_learner_rank_stops_the_run_naming_the_timeout(ray_cluster, tiny_model, tmp_path):
    out = tmp_path / "stuck-learner"
    config = load_config("configs/default.yaml", [
        f"model.path={tiny_model}", f"train.output_dir={out}", "train.steps=4", "train.checkpoint_every=0", *SMALL,
        "learner.num_ranks=2", "learner.step_timeout_s=20"])
    stopped: list[int] = []

    def stopper():
        wait_for_step(out, 1)
        stopped.append(stop("coderloo-learner-1-stuck-learner"))

    thread = threading.Thread(target=stopper, daemon=True)
    thread.start()
    try:
        with pytest.raises(LearnerError) as error:
            train(config)
    finally:
        thread.join(timeout=5)
        resume_all(stopped)
    message = str(error.value)
    assert "rank 1" in message and "learner.step_timeout_s=20" in message and "stuck" in message, message
    assert [r["step"] for r in rl_steps(out)] == [1]
