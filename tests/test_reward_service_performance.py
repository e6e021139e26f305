"""The performance component through the real sandbox pool: run time against the reference's."""
import pytest

from coderloo.tasksets.synthetic import synthetic_suite
from reward_service.scorer import RewardScorer
from reward_service.weights import RewardWeights
from sandbox_pool import Limits, SandboxPool

TASK = synthetic_suite()["train"][0]  # solve(x) = x + 1, 9 asserts


@pytest.fixture(scope="module")
def pool(ray_cluster):
    pool = SandboxPool()
    yield pool
    pool.shutdown()


def test_slow_right_code_earns_less_and_wrong_code_none(pool):
    scorer = RewardScorer(pool, Limits(), weights=RewardWeights(performance=0.5))
    right = TASK.reference[len(TASK.prompt):]
    slow = "    import time\n    time.sleep(0.05)\n    return x + 1\n"  # 9 calls: about 0.45 s
    fast, sluggish, wrong = scorer.score([TASK] * 3, [right, slow, "    return x\n"])
    assert 0 < sluggish.components.performance < 0.5 * fast.components.performance
    assert wrong.components.performance == 0.0
    assert sluggish.total == pytest.approx(0.1 + 1.0 + 0.5 * sluggish.components.performance)
    assert TASK.id in scorer._reference_s  # timed once, reused by later batches


def test_performance_off_by_default(pool):
    reward = RewardScorer(pool, Limits(), RewardWeights()).score([TASK], ["    return x + 1\n"])[0]
    assert reward.components.performance is None and reward.total == pytest.approx(1.1)
