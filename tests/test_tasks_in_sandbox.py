"""Loaded tasks run in the real sandbox: every competitive-programming fixture task's right program
passes and its wrong one fails with the failing case named, on both backends; every synthetic
reference passes its shown and its held tests, and a program that echoes its input fails; the held
tests alone decide. (The loaders' own tests,
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
        assert passed.num_tests == len(task.held)  # the held cases alone decide
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
        assert result.status is Status.passed and result.num_tests == len(task.held), (task.id, result.detail)
        assert examples.status is Status.passed and examples.num_tests == task.public_tests > 0, (task.id, examples.detail)
    assert not any(result.status is Status.passed for result in echoes)


def test_the_held_tests_alone_decide(sandbox):
    """A program right on the held inputs and wrong on the shown ones passes; the reverse fails."""
    _, run = sandbox
    task = synthetic_suite()["train"][0]  # solve(x) = x + 1, shown inputs 17 and -5
    shown_args = [int(t.split("solve(", 1)[1].split(")", 1)[0]) for t in task.shown]
    right_on_held = task.prompt + f"    return 0 if x in {shown_args} else x + 1\n"
    right_on_shown = task.prompt + f"    return x + 1 if x in {shown_args} else 0\n"
    held, shown = run([task.execution_request(right_on_held, LIMITS), task.execution_request(right_on_shown, LIMITS)])
    assert held.status is Status.passed and shown.status is Status.failed, (held.detail, shown.detail)
