"""Loaded tasks run in the real sandbox: every competitive-programming fixture task's right program
passes and its wrong one fails with the failing case named, on both backends; every synthetic
reference passes its shown and its held tests, and a program that echoes its input fails; shown and
held tests both decide, as the benchmarks' graders count them. (The loaders' own tests,
tests/test_tasksets_competitive.py and tests/test_synthetic_stdio.py, check the data without
running it.)"""
from __future__ import annotations

import asyncio


from coderloo.tasksets.synthetic import synthetic_suite
from sandbox_pool import ForkServer, Limits, Status
from tests.test_tasksets_competitive import FIXTURES, PROGRAMS, load_fixture

LIMITS = Limits(wall_timeout_s=20.0)
FIXTURE_TASKS = [task for path, loader in FIXTURES for task in load_fixture(path, loader)]


def test_every_fixture_task_has_a_right_and_a_wrong_program():
    assert sorted(PROGRAMS) == sorted(task.id for task in FIXTURE_TASKS)
    assert {task.test_kind for task in FIXTURE_TASKS} == {"stdio", "call", "assert"}  # (assert: Code-R1's functional tests)


def test_right_programs_pass_and_wrong_ones_fail_naming_the_case(sandbox):
    _, run = sandbox
    right = run([t.execution_request(PROGRAMS[t.id]["right"], LIMITS) for t in FIXTURE_TASKS])
    wrong = run([t.execution_request(PROGRAMS[t.id]["wrong"], LIMITS) for t in FIXTURE_TASKS])
    for task, passed, failed in zip(FIXTURE_TASKS, right, wrong):
        assert passed.status is Status.passed, (task.id, passed.detail, passed.stderr[-300:])
        assert passed.num_tests == len(task.tests)  # shown and held cases all decide
        assert failed.status is not Status.passed and failed.status is not Status.infra_error, (task.id, failed.detail)
        first = next(i for i, t in enumerate(failed.tests) if not t.passed)
        named = "1 of 1 tests failed" if task.test_kind == "assert" else f"case {first}: "
        assert failed.detail.startswith(named), (task.id, failed.detail)


def test_references_are_the_right_programs():
    for task in FIXTURE_TASKS:
        if task.reference:
            assert task.reference == PROGRAMS[task.id]["right"], task.id


def test_synthetic_references_pass_their_shown_and_held_tests_and_an_echo_fails():
    """On the process backend (a check of the data; the fixtures above cover both backends)."""
    tasks = [t for split in synthetic_suite(kinds=["function", "stdio"]).values() for t in split]
    assert len(tasks) > 500 and {t.test_kind for t in tasks} == {"assert", "stdio"}
    stdio = [t for t in tasks if t.test_kind == "stdio"]
    server = ForkServer()

    async def run(requests):
        return await asyncio.gather(*(server.execute(r) for r in requests))

    try:
        held = asyncio.run(run([t.execution_request(t.reference, LIMITS) for t in tasks]))
        shown = asyncio.run(run([t.examples().execution_request(t.reference, LIMITS) for t in tasks]))
        echo = "import sys\nprint(sys.stdin.read())\n"
        echoes = asyncio.run(run([t.execution_request(echo, LIMITS) for t in stdio[::5]]))
    finally:
        server.close()
    for task, result, examples in zip(tasks, held, shown):
        assert result.status is Status.passed and result.num_tests == len(task.tests), (task.id, result.detail)
        assert examples.status is Status.passed and examples.num_tests == task.public_tests > 0, (task.id, examples.detail)
    assert not any(result.status is Status.passed for result in echoes)


def test_shown_and_held_tests_both_decide(sandbox):
    """A program wrong on the shown inputs alone fails, as one wrong on the held inputs alone does;
    one right on both passes."""
    _, run = sandbox
    task = synthetic_suite()["train"][0]  # solve(x) = x + 1, shown inputs 17 and -5
    shown_args = [int(t.split("solve(", 1)[1].split(")", 1)[0]) for t in task.shown]
    right_on_held = task.prompt + f"    return 0 if x in {shown_args} else x + 1\n"
    right_on_shown = task.prompt + f"    return x + 1 if x in {shown_args} else 0\n"
    held, shown, right = run([task.execution_request(p, LIMITS) for p in (right_on_held, right_on_shown, task.reference)])
    assert held.status is Status.failed and shown.status is Status.failed, (held.detail, shown.detail)
    assert [t.passed for t in held.tests[:len(task.shown)]] == [False] * len(task.shown), held.tests
    assert right.status is Status.passed and right.num_tests == len(task.tests), right.detail


# Six wrong MBPP solutions, each one small edit of the reference (task id, text, its replacement),
# that fail MBPP's first assert and pass its other two: the assert the prompt shows is the one
# that catches them, so a verdict without it would call them right ("2 of 2 tests passed").
MBPP_MUTANTS = [
    (48, "count += 1", "count += 0"),
    (58, "< 0)", "< -1)"),
    (68, "all(A[i] >= A[i + 1]", "all(A[i] >= A[i - 1]"),
    (92, "n[i - 2]", "n[i - 3]"),
    (94, "itemgetter(1)", "itemgetter(0)"),
    (98, "total/len(numbers)", "total//len(numbers)"),
]


def test_a_wrong_mbpp_solution_that_only_the_shown_assert_catches_fails(shared_data):
    """Counted as MBPP's grader counts it: all three asserts, the shown one first."""
    from coderloo.tasksets.benchmarks import load_mbpp

    tasks = {t.id: t for t in load_mbpp(shared_data / "mbpp.jsonl")}
    wrong = []
    for number, text, replacement in MBPP_MUTANTS:
        task = tasks[f"mbpp/{number}"]
        assert task.reference.count(text) == 1 and task.public_tests == 1 and len(task.tests) == 3, number
        wrong.append((task, task.reference.replace(text, replacement)))
    server = ForkServer()

    async def run(requests):
        return await asyncio.gather(*(server.execute(r) for r in requests))

    try:
        results = asyncio.run(run([t.execution_request(p, LIMITS) for t, p in wrong]))
        right = asyncio.run(run([t.execution_request(t.reference, LIMITS) for t, _ in wrong]))
    finally:
        server.close()
    for (task, program), result, reference in zip(wrong, results, right):
        assert reference.status is Status.passed, (task.id, reference.detail)
        assert result.status is Status.failed and result.num_tests == 3, (task.id, result.status, result.detail)
        assert [t.passed for t in result.tests] == [False, True, True], (task.id, program, result.tests)
