"""Memory given back: what a learner step frees stays with the process until its heap is trimmed.
(Actors killed for memory in their cgroups, rollout worker and learner rank: tests/test_faults.py.)"""


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
