"""Executors scaled on demand, on a cluster of several nodes on this machine (cluster-local.yaml,
Ray's fake multi-node provider): sandbox nodes come when the sandbox queue grows and go when they
stay idle, and every request is answered, none lost.

The cluster is a Ray instance of its own, apart from the tests' shared one; a driver process
(this file, run as a script) connects to it."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coderloo.ops import local_cluster
from coderloo.runtime import LOOPBACK_ENV
from common.placement import free_port

REQUESTS = 48
MAX_EXECUTORS = 3  # cluster-local.yaml: up to 3 sandbox nodes of one executor (4 units) each


@pytest.fixture
def fake_cluster():
    cluster = local_cluster.start(port=free_port(), dashboard_port=free_port(), update_interval_s=1)
    yield cluster
    cluster.stop()


@pytest.mark.slow  # a Ray cluster of its own, started by `ray start` in a subprocess
def test_sandbox_nodes_follow_the_queue(fake_cluster, tmp_path):
    out = tmp_path / "report.json"  # not stdout: Ray prints the autoscaler's events there
    done = subprocess.run(
        [sys.executable, __file__, fake_cluster.gcs_address, str(out)], env={**os.environ, **LOOPBACK_ENV},
        capture_output=True, text=True, timeout=420, check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    nodes = [n for _, n in report["timeline"]]
    changes = [(t, n) for i, (t, n) in enumerate(report["timeline"]) if i == 0 or n != nodes[i - 1]]
    print(f"sandbox nodes over time (s, nodes): {changes}; results at {report['results_at']:.1f} s")

    assert nodes[0] == 0  # the cluster starts with no sandbox node (min_workers 0)
    assert report["peak_nodes"] == MAX_EXECUTORS  # the queue asked for every node the file allows
    assert report["passed"] == REQUESTS  # every request answered, each by its own program
    assert report["stats"]["delivered"] == REQUESTS and report["stats"]["reruns"] == 0
    assert report["stats"]["executors_started"] == MAX_EXECUTORS == report["stats"]["executors_removed"]
    assert report["end_nodes"] == 0  # idle nodes were removed after the work


def drive(address: str) -> dict:
    """Queue more programs than one sandbox node runs at once; watch the nodes until they are gone."""
    import threading
    import time

    import ray

    from sandbox_pool import ExecutionRequest, PoolSettings, SandboxPool

    ray.init(address=address, logging_level="ERROR")
    start = time.monotonic()

    def sandbox_nodes() -> int:
        return sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("sandbox"))

    timeline, stop = [], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            timeline.append((round(time.monotonic() - start, 2), sandbox_nodes()))
            stop.wait(0.5)

    watcher = threading.Thread(target=watch)
    watcher.start()
    pool = SandboxPool(PoolSettings(min_executors=0, max_executors=MAX_EXECUTORS, concurrency_per_executor=4,
                                    idle_s=2.0, start_timeout_s=180))
    # each program returns its own number, so a result cannot stand in for another's
    requests = [ExecutionRequest(program=f"import time\ndef f():\n    time.sleep(0.5)\n    return {i}\n",
                                 tests=[f"assert f() == {i}"]) for i in range(REQUESTS)]
    results = pool.run(requests)
    results_at = time.monotonic() - start
    deadline = time.monotonic() + 180
    while sandbox_nodes() and time.monotonic() < deadline:
        time.sleep(1)
    stop.set()
    watcher.join()
    timeline.append((round(time.monotonic() - start, 2), sandbox_nodes()))
    stats = pool.stats()
    pool.shutdown()
    peak = max(n for _, n in timeline)
    return {
        "timeline": timeline, "passed": sum(r.status.value == "passed" for r in results), "stats": stats,
        "peak_nodes": peak, "results_at": results_at, "end_nodes": timeline[-1][1],
    }


if __name__ == "__main__":
    Path(sys.argv[2]).write_text(json.dumps(drive(sys.argv[1])))
