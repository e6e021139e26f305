"""Stuck, not dead: a rollout worker and a reward replica that stop answering (SIGSTOP) are found
within their timeouts and replaced as if they had died, and training goes on (in the same run, the
rollout worker is first killed for memory: tests/test_oom.py); a learner rank that stops answering
in a collective ends the run with an error naming the timeout, not a hang."""
import os
import signal
import threading
import time

import pytest
import ray

from coderloo.config import load_config
from coderloo.controller import train
from common.memory import oom_kills
from learner.group import LearnerError
from tests.test_fault_tolerance import SMALL, named, rl_steps, wait_for_record, wait_for_step
from tests.test_oom import LIMIT_MB, blow_up, cgroup_of


def pid_of(prefix: str, timeout: float = 600) -> int:
    """The pid of the live actor whose name starts with `prefix`, once it exists (a call to it: it
    answers between the calls it is given)."""
    deadline = time.time() + timeout
    while not (found := named(prefix)):
        if time.time() > deadline:
            raise TimeoutError(f"no actor named {prefix}*")
        time.sleep(0.2)
    (name, namespace), = found
    return ray.get(ray.get_actor(name, namespace=namespace).__ray_call__.remote(lambda self: os.getpid()))


def stop(prefix: str) -> int:
    """SIGSTOP the live actor whose name starts with `prefix`; its pid."""
    pid = pid_of(prefix)
    os.kill(pid, signal.SIGSTOP)
    return pid


def resume_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass  # killed as stuck, as it should be


def test_rollout_worker_killed_for_memory_then_stuck_and_a_stuck_reward_replica_are_survived(ray_cluster, tiny_model, tmp_path):
    out = tmp_path / "stuck"
    config = load_config("configs/default.yaml", [
        f"model.path={tiny_model}", f"train.output_dir={out}", "train.steps=7", "train.checkpoint_every=0", *SMALL,
        f"rollout.memory_limit_mb={LIMIT_MB}", "rollout.stuck_timeout_s=10", "rollout.weight_sync.timeout_s=60",
        "reward.request_timeout_s=10", "reward.health_check_period_s=1", "reward.health_check_timeout_s=5"])
    stopped: list[int] = []
    cgroup = str(cgroup_of("coderloo-rollout-0-stuck"))
    oom_kills_before: list[int] = []  # a cgroup of this name may be left from an earlier run on this machine
    replica_stopped_after: list[int] = []

    def faults():
        wait_for_step(out, 1)
        oom_kills_before.append(oom_kills(cgroup))
        blow_up("coderloo-rollout-0-stuck")  # the kernel kills it in its cgroup; Ray restarts it
        wait_for_step(out, 3)
        stopped.append(stop("coderloo-rollout-0-stuck"))  # the restarted one
        # Only once the stuck worker is replaced: while it is being found (10 s) and restarted, Serve's
        # health check could replace the stopped replica before any request reached it.
        wait_for_record(out, lambda r: r.get("rollout_workers_stuck", 0) >= 1, "the stuck worker's recovery")
        stopped.append(stop("SERVE_REPLICA::coderloo-rewards"))
        replica_stopped_after.append(rl_steps(out)[-1]["step"])

    thread = threading.Thread(target=faults, daemon=True)
    thread.start()
    try:
        summary = train(config)
    finally:
        thread.join(timeout=5)
        resume_all(stopped)
    assert len(stopped) == 2
    assert oom_kills(cgroup) == oom_kills_before[0] + 1  # the kernel's OOM killer, in the worker's cgroup
    steps = rl_steps(out)
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6, 7]  # no step lost or repeated
    assert replica_stopped_after[0] < 7  # a step's rewards were still to come from the stopped replica
    assert all(r["samples"] == 16 for r in steps)  # the lost prompts were generated again, once
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
        # its pid first: a call to the rank waits for the step it is in, and step 2 would end first
        pid = pid_of("coderloo-learner-1-stuck-learner")
        wait_for_step(out, 1)
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)

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
