"""Loaded tasks run in the real sandbox: every competitive-programming fixture task's right program
passes and its wrong one fails with the failing case named, on both backends; every synthetic
stdin/stdout reference passes and a program that echoes its input fails. (The loaders' own tests,
tests/test_tasksets_competitive.py and tests/test_synthetic_stdio.py, check the data without
running it.)"""
from __future__ import annotations

import asyncio

import pytest

from coderloo.tasksets.synthetic import synthetic_suite
from sandbox_pool import ForkServer, Limits, Status
from tests.test_sandbox_docker import docker_backend_or_skip
from tests.test_tasksets_competitive import FIXTURES, PROGRAMS, load_fixture

LIMITS = Limits(wall_timeout_s=20.0)
FIXTURE_TASKS = [task for path, loader in FIXTURES for task in load_fixture(path, loader)]
LOOP = asyncio.new_event_loop()  # one for all runs: the Docker backend replaces containers in tasks of it


def teardown_module() -> None:
    LOOP.close()


def run_all(backend, requests):
    async def go():
        return await asyncio.gather(*(backend.execute(r) for r in requests))

    return LOOP.run_until_complete(go())


@pytest.fixture(scope="module", params=["process", "docker"])
def backend(request):
    if request.param == "process":
        server = ForkServer()
        yield server
        server.close()
    else:
        docker = docker_backend_or_skip(containers=2)
        yield docker
        docker.close()


def test_every_fixture_task_has_a_right_and_a_wrong_program():
    assert sorted(PROGRAMS) == sorted(task.id for task in FIXTURE_TASKS)
    assert {task.test_kind for task in FIXTURE_TASKS} == {"stdio", "call"}


def test_right_programs_pass_and_wrong_ones_fail_naming_the_case(backend):
    right = run_all(backend, [t.execution_request(PROGRAMS[t.id]["right"], LIMITS) for t in FIXTURE_TASKS])
    wrong = run_all(backend, [t.execution_request(PROGRAMS[t.id]["wrong"], LIMITS) for t in FIXTURE_TASKS])
    for task, passed, failed in zip(FIXTURE_TASKS, right, wrong):
        assert passed.status is Status.passed, (task.id, passed.detail, passed.stderr[-300:])
        assert passed.num_tests == len(task.tests)
        assert failed.status is not Status.passed and failed.status is not Status.infra_error, (task.id, failed.detail)
        first = next(i for i, t in enumerate(failed.tests) if not t.passed)
        assert failed.detail.startswith(f"case {first}: "), (task.id, failed.detail)


def test_references_are_the_right_programs():
    for task in FIXTURE_TASKS:
        if task.reference:
            assert task.reference == PROGRAMS[task.id]["right"], task.id


def test_synthetic_stdio_references_pass_and_an_echo_fails():
    tasks = [t for split in synthetic_suite(kinds=["stdio"]).values() for t in split]
    assert len(tasks) > 200 and {t.test_kind for t in tasks} == {"stdio"}
    server = ForkServer()
    try:
        references = run_all(server, [t.execution_request(t.reference, LIMITS) for t in tasks])
        echo = "import sys\nprint(sys.stdin.read())\n"
        echoes = run_all(server, [t.execution_request(echo, LIMITS) for t in tasks[::5]])
    finally:
        server.close()
    for task, result in zip(tasks, references):
        assert result.status is Status.passed, (task.id, result.detail)
    assert not any(result.status is Status.passed for result in echoes)
