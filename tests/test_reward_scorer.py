"""The scorer's own logic: code extraction, reward arithmetic, dedupe, sandbox-failure handling.

The pool here is a stand-in that returns prepared results (unit test of pure logic); the real
pool is exercised by tests/test_sandbox.py and the end-to-end test.
"""
import pytest
import ray

from coderloo.tasksets.synthetic import synthetic_suite
from reward_service.extract import extract
from reward_service.lint import syntax_error
from reward_service.scorer import RewardScorer, SandboxInfraError
from reward_service.weights import RewardWeights
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


def test_extract_cases():
    assert extract("    return x\n", prompt_is_code=True).code == "    return x\n"
    assert extract("Here:\n```python\ndef f():\n    return 1\n```\nDone.", False).code == "def f():\n    return 1\n"
    assert extract("```\na = 1\n```\n```python\nb = 2\n```", False).code == "a = 1\n"
    assert extract("```python\ndef f(:\n    trunc", False).code == "def f(:\n    trunc"
    assert extract("def f():\n    return 2\n", False).code == "def f():\n    return 2\n"


def test_syntax_error_means_does_not_compile():
    assert syntax_error("def f(x):\n    return x\n") is None
    assert syntax_error("def f(x:\n") is not None
    assert syntax_error("x = 1\x00") is not None


def test_reward_components_and_dedupe(ray_cluster):
    pool = ScriptedPool([Status.passed, Status.failed])
    scorer = RewardScorer(pool, Limits(), RewardWeights())
    right = TASK.reference[len(TASK.prompt):]
    wrong = "    return None\n"
    rewards = scorer.score([TASK, TASK, TASK, TASK], [right, "    return (\n", right, wrong])
    # the repeated program ran once, and the one that does not compile never reached the pool
    assert [r.program for r in pool.submitted[0]] == [TASK.prompt + right, TASK.prompt + wrong]
    assert [r.passed for r in rewards] == [True, False, True, False]
    assert [r.status for r in rewards] == [Status.passed, Status.syntax_error, Status.passed, Status.failed]
    assert rewards[0].total == pytest.approx(1.1) and rewards[0].components.syntax == 1.0
    assert rewards[1].total == 0.0 and rewards[1].components.syntax == 0.0 and rewards[1].components.functionality == 0.0
    assert rewards[1].feedback.startswith("SyntaxError: '(' was never closed (line ")


def test_sandbox_failure_is_raised_not_scored(ray_cluster):
    # the pool has run the request again already (sandbox_pool.pool): a failure here is final
    scorer = RewardScorer(ScriptedPool([Status.passed, Status.infra_error]), Limits(), RewardWeights())
    with pytest.raises(SandboxInfraError, match="1 of 2 programs hit a sandbox failure; first: task"):
        scorer.score([TASK, TASK], ["    return 0\n", "    return 1\n"])


def test_weights_model_and_lint_component(ray_cluster):
    """Lint runs the real Ruff; its penalty is weighted, saturates, and is reported on its own."""
    weights = RewardWeights(syntax=0.1, functionality=1.0, lint=0.5, lint_saturation=2)
    scorer = RewardScorer(ScriptedPool([Status.passed, Status.passed, Status.failed]), Limits(), weights=weights)
    clean = "    return x + 1\n"
    one = "    import os\n    return x + 1\n"  # F401
    bad = "    return (\n"  # a syntax error: no lint rules, lint 0
    rewards = scorer.score([TASK, TASK, TASK], [clean, one, bad])
    assert [r.components.lint for r in rewards] == [0.0, 0.5, 0.0]
    assert [d.code for d in rewards[1].diagnostics] == ["F401"]
    assert rewards[1].total == pytest.approx(0.1 + 1.0 - 0.5 * 0.5)
    assert [d.code for d in rewards[2].diagnostics] == ["syntax"] and rewards[2].components.syntax == 0.0
    # lint off by default: not run, not reported
    default = RewardScorer(ScriptedPool([Status.passed]), Limits(), RewardWeights())
    assert default.weights == RewardWeights() and default.score([TASK], [one])[0].components.lint is None


def test_security_rules_and_saturation():
    from reward_service.lint import ruff_check, syntax_error

    found = ruff_check("import os\nimport pickle\ndef f(s):\n    return eval(s), pickle.loads(s)\n", ["E4", "E7", "E9", "F", "S"])
    assert sorted(d.code for d in found) == ["F401", "S301", "S307"]
    s307 = next(d for d in found if d.code == "S307")
    assert (s307.row, s307.column, s307.end_row, s307.end_column) == (4, 12, 4, 19)
    err = syntax_error("def f(:\n    pass\n")
    assert (err.row, err.column) == (1, 7)


def test_weights_need_a_positive_weight():
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        RewardWeights(syntax=0.0, functionality=0.0)


def test_execution_feedback_names_the_first_failing_test_and_is_bounded():
    from reward_service.scorer import FEEDBACK_CHARS, execution_feedback

    task = TASK.model_copy(update={"tests": ["assert f(1) == 2", "assert f(2) == 3", "assert f(3) == 4"]})

    def result(status, tests, detail=""):
        return ExecutionResult(status=status, tests=tests, num_tests=3, duration_s=0.0, detail=detail)

    ok, bad = {"passed": True, "error": None}, {"passed": False, "error": "AssertionError"}
    assert execution_feedback(task, result(Status.passed, [ok] * 3)) == ""
    assert execution_feedback(task, result(Status.failed, [ok, bad, bad], "2 of 3 tests failed")) == (
        "2 of 3 tests failed\nfirst failing test: assert f(2) == 3\nAssertionError"
    )
    # an error before the tests: only why the run ended
    assert execution_feedback(task, result(Status.runtime_error, [], "the program raised NameError: name 'g' is not defined")) == (
        "the program raised NameError: name 'g' is not defined"
    )
    assert len(execution_feedback(task, result(Status.failed, [bad] * 3, "x" * 5000))) == FEEDBACK_CHARS
