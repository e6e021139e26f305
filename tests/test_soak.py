"""The soak's verdict (coderloo/ops/soak.py) on made-up series, and the resource sampler
(coderloo/ops/resources.py) on the real shared Ray cluster."""
from __future__ import annotations

import json
import os
import random

import pytest

from coderloo.ops.resources import ResourceSampler, actor_label, node_actors
from coderloo.ops.soak import judge, main, resource_series, write_section


def noisy(n: int, level: float, noise: float, slope: float = 0.0, every: int = 10, seed: int = 0) -> list[tuple[int, float]]:
    rng = random.Random(seed)
    return [(i * every, level + slope * i * every + rng.gauss(0, noise)) for i in range(1, n + 1)]


def test_flat_noisy_memory_is_flat():
    assert judge("rss_mb/learner-0", noisy(100, 800.0, 15.0)).verdict == "flat"


def test_linear_leak_grows():
    # 0.2 MB per step: 160 MB over the 800 judged steps, well above the 50 MB floor
    verdict = judge("rss_mb/learner-0", noisy(100, 800.0, 15.0, slope=0.2))
    assert verdict.verdict == "grows" and verdict.failed
    assert verdict.slope_per_100 == pytest.approx(20.0, rel=0.2)


def test_growth_below_tolerance_is_flat():
    # significant but tiny: 0.02 MB per step is 16 MB over the run, under the 50 MB floor
    assert judge("rss_mb/driver", noisy(100, 800.0, 1.0, slope=0.02)).verdict == "flat"


def test_step_change_in_warm_up_is_flat():
    points = [(s, 300.0 if s <= 200 else 900.0) for s, _ in noisy(100, 0.0, 0.0)]
    assert judge("rss_mb/rollout-0", points).verdict == "flat"


def test_step_change_after_warm_up_is_not_hidden_by_the_median_tolerance():
    # a descriptor leak of one per sample: +80 over the judged steps
    points = [(s, 40.0 + i) for i, (s, _) in enumerate(noisy(100, 0.0, 0.0))]
    assert judge("fds/sandbox-0", points).verdict == "grows"


def test_too_few_samples_is_no_verdict():
    verdict = judge("fds/driver", noisy(4, 30.0, 0.0))
    assert verdict.verdict == "too few samples" and not verdict.failed


def test_records_within_and_over_budget():
    assert judge("records_mb", [(s, 0.01 * s) for s in range(10, 1001, 10)]).verdict == "within budget"
    assert judge("records_mb", [(s, 1.0 * s) for s in range(10, 1001, 10)]).verdict == "over budget"


def test_checkpoints_kept_without_retention_grow_and_with_it_are_flat():
    every_one = [(s, 13.6 * (s // 100)) for s in range(10, 1001, 10)]  # keep_checkpoints 0: one more each 100 steps
    newest_two = [(s, 13.6 * min(s // 100, 2)) for s in range(10, 1001, 10)]  # keep_checkpoints 2
    assert judge("checkpoints_mb", every_one).verdict == "grows"
    assert judge("checkpoints_mb", newest_two).verdict == "flat"


def test_cli_reads_resources_and_fails_on_growth(tmp_path, capsys):
    records = [{"phase": "rl", "step": s, "time": 0.0, "reward_mean": 0.5} for s in range(1, 401)]
    records += [{"phase": "resources", "step": s, "time": 0.0, "fds/driver": 30.0 + s / 10, "rss_mb/driver": 500.0}
                for s in range(10, 401, 10)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert set(resource_series(tmp_path)) == {"fds/driver", "rss_mb/driver"}
    results = tmp_path / "results.md"
    results.write_text("# Benchmark results\n\n## soak\n\nold\n\n## other\n\nkept\n")
    assert main([str(tmp_path), "--chart", str(tmp_path / "soak.png"), "--results", str(results)]) == 1
    out = capsys.readouterr().out
    assert "GROWING: fds/driver" in out and "| rss_mb/driver |" in out
    text = results.read_text()
    assert "old" not in text and "## other\n\nkept" in text and "(soak.png)" in text and (tmp_path / "soak.png").stat().st_size


def test_write_section_appends_when_absent(tmp_path):
    path = tmp_path / "results.md"
    path.write_text("# Benchmark results\n")
    write_section(path, "## soak\n\nnew\n")
    assert path.read_text() == "# Benchmark results\n\n## soak\n\nnew\n"


def test_actor_labels():
    assert actor_label("Learner", "coderloo-learner-1-soak") == ("learner", 1)
    assert actor_label("RolloutWorker", "coderloo-rollout-0-soak") == ("rollout", 0)
    assert actor_label("SandboxExecutor", "coderloo-sandbox-ab12cd34-7") == ("sandbox", None)
    assert actor_label("ServeReplica:rewards:RewardService", "SERVE_REPLICA::rewards#RewardService#x") == ("reward-replica", None)
    assert actor_label("SomeThing", "") == ("something", None)


def test_sampler_finds_an_actor_it_is_given(ray_cluster, tmp_path):
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    class Learner:
        def pid(self) -> int:
            return os.getpid()

    actor = Learner.options(name="coderloo-learner-3-soaktest").remote()
    try:
        pid = ray.get(actor.pid.remote())
        sampler = ResourceSampler(tmp_path)
        assert node_actors()["learner-3"] == pid
        (tmp_path / "metrics.jsonl").write_text("x" * 2**20)
        values = sampler.sample()
        assert values["rss_mb/learner-3"] > 10 and values["fds/learner-3"] > 3
        assert values["rss_mb/driver"] > 10 and values["fds/driver"] > 3
        assert values["peak_rss_mb/learner-3"] >= values["rss_mb/learner-3"] > 0  # the peak since it started
        assert values["records_mb"] == pytest.approx(1.0)
        assert values["sandbox_leaked_processes"] == 0  # no sandbox process outlives its run (tests/test_hostile.py makes them try)
        assert "dev_shm_mb" in values and "checkpoints_mb" in values
    finally:
        ray.kill(actor)
