"""The scorer's own logic: code extraction, reward arithmetic, dedupe, sandbox-failure handling.

The pool here is a stand-in that returns prepared results (unit test of pure logic); the real
pool is exercised by tests/test_sandbox.py and the end-to-end test.
"""
from concurrent.futures import Future

import pytest

from coderloo.tasksets.synthetic import synthetic_suite
from reward_service.extract import extract
from reward_service.lint import syntax_error
from reward_service.scorer import RewardScorer, SandboxInfraError, did_not_compile
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
            out.append(Future())
            out[-1].set_result(ExecutionResult(status=status, tests=tests, num_tests=len(request.tests), duration_s=0.0,
                                               stdout="", stderr="", detail="scripted"))
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


def test_reward_components_and_dedupe():
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
    assert rewards[1].feedback.startswith("Does not compile: SyntaxError: '(' was never closed (line ")


def test_sandbox_failure_is_raised_not_scored():
    # the pool has run the request again already (sandbox_pool.pool): a failure here is final
    scorer = RewardScorer(ScriptedPool([Status.passed, Status.infra_error]), Limits(), RewardWeights())
    with pytest.raises(SandboxInfraError, match="1 of 2 programs hit a sandbox failure; first: task"):
        scorer.score([TASK, TASK], ["    return 0\n", "    return 1\n"])


def test_weights_model_and_lint_component():
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


FEEDBACK_TASK = TASK.model_copy(update={"tests": ["assert f(1) == 2", "assert f(2) == 3", "assert f(3) == 4"], "public_tests": 0})
OK, BAD = {"passed": True, "error": None}, {"passed": False, "error": "AssertionError"}


def result(status, tests=(), detail="", stderr=""):
    return ExecutionResult(status=status, tests=list(tests), num_tests=3, duration_s=0.0, detail=detail, stderr=stderr)


def test_execution_feedback_says_why_the_run_ended_and_names_the_first_failing_test():
    from reward_service.scorer import execution_feedback

    limits = Limits(wall_timeout_s=2.5, cpu_time_s=3, memory_mb=256)
    assert execution_feedback(FEEDBACK_TASK, result(Status.passed, [OK] * 3), limits) == ""
    assert execution_feedback(FEEDBACK_TASK, result(Status.failed, [OK, BAD, BAD], "2 of 3 tests failed"), limits) == (
        "Failed: 2 of 3 tests did not pass\nfirst failing test: assert f(2) == 3\nAssertionError"
    )
    # an error before the tests: the program's own exception, and the end of its stderr
    raised = result(Status.runtime_error, detail="the program raised NameError: name 'g' is not defined",
                    stderr="working...\nTraceback (most recent call last):\n  File x\nNameError: g\n")
    assert execution_feedback(FEEDBACK_TASK, raised, limits) == (
        "Runtime error: the program raised NameError: name 'g' is not defined\n"
        "the program's stderr ends with:\nworking...\nTraceback (most recent call last):\n  File x\nNameError: g"
    )
    killed = result(Status.runtime_error, detail="the program was killed by SIGSEGV (signal 11)")
    assert execution_feedback(FEEDBACK_TASK, killed, limits) == "Runtime error: the program was killed by SIGSEGV (signal 11)"
    # a limit is named with the request's value, whatever the detail says
    timeout = result(Status.timeout, [OK], "exceeded the wall-clock limit of 2.5 s")
    assert execution_feedback(FEEDBACK_TASK, timeout, limits) == (
        "Timed out: the program exceeded its time limit (2.5 s of wall-clock time, 3 s of CPU time)"
    )
    # a task's own time limit is each case's: the feedback names it, not the run's start-up limit
    per_case = limits.model_copy(update={"case_timeout_s": 2.0})
    assert execution_feedback(FEEDBACK_TASK, result(Status.timeout, [OK], "case 1: exceeded the case time limit of 2 s"),
                              per_case) == "Timed out: a test exceeded its time limit of 2 s"
    memory = result(Status.memory_exceeded, [OK, {"passed": False, "error": "MemoryError"}], "a test raised MemoryError")
    assert execution_feedback(FEEDBACK_TASK, memory, limits) == (
        "Out of memory: the program exceeded its memory limit of 256 MiB\n"
        "first failing test: assert f(2) == 3\nMemoryError"
    )
    # the service's own compile of the program (did_not_compile) is the program's diagnosis
    syntax = did_not_compile(FEEDBACK_TASK, syntax_error("def f(:\n    pass\n"))
    assert execution_feedback(FEEDBACK_TASK, syntax, limits) == (
        "Does not compile: SyntaxError: invalid syntax (line 1, column 7)"
    )


def test_execution_feedback_of_stdin_and_call_cases():
    from reward_service.scorer import execution_feedback
    from sandbox_pool import CallTest, IOTest

    limits = Limits()
    stdio = TASK.model_copy(update={"tests": [IOTest(stdin="1 2\n", stdout="3\n")] * 3, "entry_point": None, "public_tests": 0})
    wrong = result(Status.failed, [OK, {"passed": False, "error": "wrong output: '-1\\n'"}, BAD],
                   "case 1: wrong output: '-1\\n' (2 of 3 cases failed)")
    assert execution_feedback(stdio, wrong, limits) == (
        "Failed: 2 of 3 tests did not pass\nfirst failing test: input '1 2', expected output '3'\nwrong output: '-1\\n'"
    )
    crashed = result(Status.runtime_error, [{"passed": False, "error": "the program exited with code 1: ValueError: x"}],
                     "case 0: the program exited with code 1: ValueError: x (3 of 3 cases failed)", stderr="ValueError: x\n")
    assert execution_feedback(stdio, crashed, limits).startswith(
        "Runtime error: case 0: the program exited with code 1: ValueError: x (3 of 3 cases failed)\n"
        "first failing test: input '1 2', expected output '3'")
    calls = TASK.model_copy(update={"tests": [CallTest(args=[[1, 2], 3], accepted=[[0, 1]])] * 3, "public_tests": 0})
    assert "first failing test: arguments [1, 2], 3, expected [0, 1]" in execution_feedback(calls, wrong, limits)


def test_execution_feedback_never_carries_the_sandboxs_internals():
    from reward_service.scorer import execution_feedback

    internals = "the sandbox supervisor failed: OSError: mount tmpfs on /tmp: /sys/fs/cgroup/pids/coderloo-sandbox-123"
    setup_line = "sandbox set-up failed: PermissionError: [Errno 1] /sys/fs/cgroup/pids/coderloo-sandbox-123/cgroup.procs"
    for status in Status:
        if status == Status.passed:
            continue
        for tests in ([], [OK, BAD, BAD]):
            feedback = execution_feedback(
                FEEDBACK_TASK, result(status, tests, internals, stderr=f"mine\n{setup_line}\n"), Limits())
            assert feedback and "sandbox-123" not in feedback and "supervisor" not in feedback, (status, feedback)
    assert execution_feedback(FEEDBACK_TASK, result(Status.infra_error, [], internals), Limits()) == (
        "Not run: the sandbox failed; this says nothing about the program"
    )
    # a runtime_error whose detail is not of the program's forms gets the status's own sentence
    assert execution_feedback(FEEDBACK_TASK, result(Status.runtime_error, [], internals), Limits()) == (
        "Runtime error: the program crashed or exited before its tests finished"
    )


def test_execution_feedback_is_bounded():
    from reward_service.scorer import FEEDBACK_CHARS, execution_feedback

    huge_error = {"passed": False, "error": "AssertionError: " + "e" * 10_000}
    huge_stderr = ("x" * 999 + "\n") * 10_000  # 10 MB
    huge_task = FEEDBACK_TASK.model_copy(update={"tests": ["assert f(1) == " + "9" * 10_000] * 3})
    for status in Status:
        for task in (FEEDBACK_TASK, huge_task):
            feedback = execution_feedback(task, result(status, [huge_error] * 3, "x" * 5000, huge_stderr), Limits())
            assert len(feedback) <= FEEDBACK_CHARS
    # every part is cut on its own, and the end of stderr, the traceback's last line, is kept
    crashed = result(Status.runtime_error, [huge_error], "the program raised ValueError: " + "v" * 5000,
                     huge_stderr + "ValueError: the end\n")
    bounded = execution_feedback(huge_task, crashed, Limits())
    assert len(bounded) <= FEEDBACK_CHARS and bounded.count("[...]") == 3 and bounded.endswith("\nValueError: the end")
