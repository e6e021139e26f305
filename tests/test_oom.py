"""Out of memory, for real: each actor has a memory cgroup of its own (rollout.memory_limit_mb,
learner.memory_limit_mb), and the test makes it allocate past its limit, so that the kernel's OOM
killer kills it. A learner rank ends the run with an error that names it, its limit and what to
change, and no hang; a rollout worker comes back (Ray restarts it, its prompts are generated
again) and training goes on: in tests/test_stuck.py, in one run with the stuck faults."""
import threading
from pathlib import Path

import pytest
import ray

from coderloo.config import load_config
from coderloo.controller import train
from common.memory import PREFIX, _own_cgroup
from learner.group import LearnerError
from tests.test_fault_tolerance import SMALL, named, rl_steps, wait_for_step

LIMIT_MB = 3000  # well above what a tiny model's worker or learner rank holds; the test allocates past it


def blow_up(prefix: str) -> None:
    """Make the live actor named `prefix`* allocate past its limit (the kernel kills it meanwhile)."""
    (name, namespace), = named(prefix)
    with pytest.raises(ray.exceptions.RayActorError):
        # inside the actor: touch twice its limit
        ray.get(ray.get_actor(name, namespace=namespace).__ray_call__.remote(lambda self: len(b"\x01" * (2 * LIMIT_MB << 20))))


def cgroup_of(name: str) -> Path:
    """The actor's cgroup: made under the one it runs in, the one the test's Ray cluster (and the test) run in."""
    return _own_cgroup()[0] / f"{PREFIX}{name}"


def test_learner_killed_for_memory_stops_the_run_naming_its_limit(ray_cluster, tiny_model, tmp_path):
    out = tmp_path / "oom-learner"
    config = load_config("configs/default.yaml", [f"model.path={tiny_model}", f"train.output_dir={out}", "train.steps=4",
                                                  "train.checkpoint_every=0", *SMALL, f"learner.memory_limit_mb={LIMIT_MB}"])

    def killer():
        wait_for_step(out, 1)
        blow_up("coderloo-learner-0-oom-learner")

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    with pytest.raises(LearnerError) as error:
        train(config)
    thread.join(timeout=5)
    message = str(error.value)
    assert "learner rank 0 died" in message and "killed it for memory" in message, message
    assert f"learner.memory_limit_mb={LIMIT_MB}" in message and "learner.max_tokens_per_micro_batch" in message, message
    assert [r["step"] for r in rl_steps(out)] == [1]  # it died on the way to step 2


FRAGMENTED = """
import json
from common.memory import return_free_memory
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
blocks = [bytearray(65536) for _ in range(3000)]  # 192 MB of heap (under malloc's mmap threshold)
kept = blocks[::10]  # one block in ten stays: the heap's top cannot shrink, the freed runs between stay resident
del blocks
freed = rss_mb()
trimmed = return_free_memory()
print(json.dumps({"freed": freed, "trimmed": trimmed, "after": rss_mb()}))
"""


def test_return_free_memory_gives_a_fragmented_heap_back():
    """What a learner step frees between blocks it keeps stays resident until the heap is trimmed
    (the learner trims after each step: Learner.train_step)."""
    import json
    import subprocess
    import sys

    out = json.loads(subprocess.run([sys.executable, "-c", FRAGMENTED], capture_output=True, text=True, check=True).stdout)
    assert out["trimmed"]
    assert out["after"] < out["freed"] - 100, out  # of the 173 MB freed, most goes back
