"""The scorer's own logic: code extraction, reward arithmetic, dedupe, sandbox-failure handling.

The pool here is a stand-in that returns prepared results (unit test of pure logic); the real
pool is exercised by tests/test_sandbox.py and the end-to-end test.
"""
import pytest
import ray

from coderloo.tasksets.synthetic import synthetic_suite
from reward_service.extract import extract_code
from reward_service.scorer import RewardScorer, SandboxInfraError, compiles
from sandbox_pool import ExecutionResult, Limits, Status

TASK = synthetic_suite()["train"][0]


class ScriptedPool:
    """Answers each submitted request with the next prepared status."""

    def __init__(self, statuses):
        self.statuses = list(statuses)
        self.submitted = []

    def submit(self, requests):
        self.submitted.append(requests)
        out = []
        for request in requests:
            status = self.statuses.pop(0)
            passed = status == Status.passed
            tests = [{"passed": passed, "error": None}] * len(request.tests)
            out.append(ray.put(ExecutionResult(status=status, tests=tests, num_tests=len(request.tests), duration_s=0.0, stdout="", stderr="", detail="scripted")))
        return out


def test_extract_code_cases():
    assert extract_code("    return x\n", prompt_is_code=True) == "    return x\n"
    assert extract_code("Here:\n```python\ndef f():\n    return 1\n```\nDone.", False) == "def f():\n    return 1\n"
    assert extract_code("```\na = 1\n```\n```python\nb = 2\n```", False) == "a = 1\n"
    assert extract_code("```python\ndef f(:\n    trunc", False) == "def f(:\n    trunc"
    assert extract_code("def f():\n    return 2\n", False) == "def f():\n    return 2\n"


def test_compiles():
    assert compiles("def f(x):\n    return x\n")
    assert not compiles("def f(x:\n")
    assert not compiles("x = 1\x00")


def test_reward_components_and_dedupe(ray_cluster):
    pool = ScriptedPool([Status.passed, Status.failed])
    scorer = RewardScorer(pool, Limits(), syntax_weight=0.1, functionality_weight=1.0)
    right = TASK.reference[len(TASK.prompt):]
    rewards = scorer.score([TASK, TASK, TASK], [right, "    return (\n", right])
    assert len(pool.submitted[0]) == 2  # the repeated program ran once
    assert [r.passed for r in rewards] == [True, False, True]
    assert rewards[0].total == pytest.approx(1.1) and rewards[0].syntax == 1.0
    assert rewards[1].total == 0.0 and rewards[1].syntax == 0.0 and rewards[1].functionality == 0.0


def test_sandbox_failure_is_retried_then_raised(ray_cluster):
    scorer = RewardScorer(ScriptedPool([Status.infra_error, Status.passed]), Limits(), 0.1, 1.0)
    assert scorer.score([TASK], ["    return 0\n"])[0].passed  # retried once, then fine
    scorer = RewardScorer(ScriptedPool([Status.infra_error, Status.infra_error]), Limits(), 0.1, 1.0)
    with pytest.raises(SandboxInfraError, match="1 of 1 programs hit a sandbox failure twice"):
        scorer.score([TASK], ["    return 0\n"])
