"""CPU sets per role (common/cpus.py): the syntax, the check before a run, the pinning of every
thread of a process and what it starts, and a sandbox executor's runs on its set."""
import os
import subprocess
import sys
import textwrap

import pytest

from coderloo.config import ConfigError, load_config
from coderloo.ops.cluster_files import cpu_set_problems
from common.cpus import parse_cpus

LAST_CPU = max(os.sched_getaffinity(0))


@pytest.mark.parametrize("text, cpus", [("0", [0]), ("0-3", [0, 1, 2, 3]), ("3,0-1", [0, 1, 3]), (" 2 , 2", [2])])
def test_cpu_lists_read_as_cpusets_are_written(text, cpus):
    assert parse_cpus(text) == cpus


@pytest.mark.parametrize("text, says", [("a", "'a' in 'a' is not a CPU id"), ("3-1", "'3-1' in '3-1': a range a-b needs"),
                                        ("0,", "'' in '0,' is not a CPU id"), ("-1", "'-1' in '-1' is not a CPU id")])
def test_a_bad_cpu_list_is_refused_naming_the_field(text, says):
    with pytest.raises(ConfigError) as error:
        load_config("configs/default.yaml", [f"learner.cpus={text!r}"])
    assert "learner.cpus" in str(error.value) and says in str(error.value)


def test_a_cpu_the_machine_lacks_is_named_with_its_field():
    config = load_config("configs/async-pinned.yaml")
    assert cpu_set_problems(config, available={0, 1}) == []
    problems = cpu_set_problems(config, available={1})
    assert problems == ["reward.cpus '0': CPU 0 not on this node (its CPUs: 1)",
                        "reward.pool.cpus '0': CPU 0 not on this node (its CPUs: 1)"]
    assert cpu_set_problems(load_config("configs/default.yaml"), available={0}) == []  # no sets: nothing to check


def test_a_single_cpu_may_be_a_number():
    assert load_config("configs/default.yaml", ["learner.cpus=1"]).learner.cpus == "1"


def test_the_pinned_preset_gives_each_role_its_cpus():
    config = load_config("configs/async-pinned.yaml")
    assert (config.reward.cpus, config.reward.pool.cpus) == ("0", "0")
    assert (config.rollout.cpus, config.learner.cpus, config.train.driver_cpus) == ("1", "1", "1")
    assert (config.learner.threads, config.train.max_staleness) == (1, 1)


def test_docker_containers_are_not_pinned_by_the_pool():
    with pytest.raises(ConfigError, match="cpus pins the process backend's executors"):
        load_config("configs/default.yaml", ["reward.pool.cpus=0", "reward.pool.backend.type=docker"])


def test_pinning_reaches_every_thread_and_what_the_process_starts_later():
    # A thread started before the pin (as Ray's and torch's are) and a child process started after it.
    script = textwrap.dedent(f"""
        import os, subprocess, sys, threading, time
        from common.cpus import pin_process
        stop = threading.Event()
        threading.Thread(target=stop.wait, daemon=True).start()
        pin_process("{LAST_CPU}", "learner.cpus")
        for tid in os.listdir("/proc/self/task"):
            print("thread", sorted(os.sched_getaffinity(int(tid))))
        child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                               capture_output=True, text=True, check=True)
        print("child", child.stdout.strip())
        try:
            pin_process("{LAST_CPU + 1}", "learner.cpus")
        except ValueError as e:
            print("refused", e)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()}).stdout.splitlines()
    threads = [line for line in out if line.startswith("thread")]
    assert len(threads) >= 2 and set(threads) == {f"thread [{LAST_CPU}]"}
    assert f"child [{LAST_CPU}]" in out
    assert f"refused learner.cpus '{LAST_CPU + 1}': CPU {LAST_CPU + 1} not on this node" in out[-1]


def test_a_pinned_executor_runs_its_programs_on_its_cpus(ray_cluster):
    from sandbox_pool.pool import PoolSettings, SandboxPool
    from sandbox_pool.results import ExecutionRequest, Status

    program = "import os\nprint(sorted(os.sched_getaffinity(0)))\n"
    pool = SandboxPool(PoolSettings(min_executors=1, max_executors=1, cpus=str(LAST_CPU)))
    try:
        [result] = pool.run([ExecutionRequest(program=program, tests=["assert True"])])
    finally:
        pool.shutdown()
    assert result.status is Status.passed, result.detail
    assert result.stdout == f"[{LAST_CPU}]\n"
    unpinned = SandboxPool(PoolSettings(min_executors=1, max_executors=1))
    try:
        [result] = unpinned.run([ExecutionRequest(program=program, tests=["assert True"])])
    finally:
        unpinned.shutdown()
    assert result.stdout == f"{sorted(os.sched_getaffinity(0))}\n"  # the control: all of the machine's
