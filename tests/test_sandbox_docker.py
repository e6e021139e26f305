"""The Docker backend for real: warm containers of the executor image (make sandbox-image).

Without a Docker engine these tests skip with the reason, except where CODERLOO_REQUIRE_DOCKER=1
(.ci/run sets it): there a missing engine or image is a failure.
"""
from __future__ import annotations

import asyncio
import os
import textwrap

import pytest

from sandbox_pool import ExecutionRequest, IOTest, Limits, Status


def docker_backend_or_skip(containers: int = 2, limits=None):
    from sandbox_pool.docker_backend import DockerBackend, DockerUnavailable

    try:
        return DockerBackend(containers, limits)
    except DockerUnavailable as e:
        if os.environ.get("CODERLOO_REQUIRE_DOCKER") == "1":
            pytest.fail(f"CODERLOO_REQUIRE_DOCKER=1 but: {e}")
        pytest.skip(str(e))


def run_all(requests: list[ExecutionRequest]):
    backend = docker_backend_or_skip()

    async def go():
        return [await backend.execute(r) for r in requests]

    try:
        return asyncio.run(go()), backend
    finally:
        backend.close()


def labelled_containers(owner: str) -> list:
    import docker

    return docker.from_env().containers.list(all=True, filters={"label": f"coderloo.sandbox={owner}"})


def test_statuses_forgeries_and_cpp_in_containers():
    add = "def add(a, b):\n    return a + b\n"
    cases = [
        (ExecutionRequest(program=add, tests=["assert add(1, 2) == 3"] * 3), Status.passed),
        (ExecutionRequest(program=add.replace("+", "-"), tests=["assert add(1, 2) == 3"]), Status.failed),
        (ExecutionRequest(program="def f(:\n", tests=["assert True"]), Status.syntax_error),
        (ExecutionRequest(program="import os\nos._exit(0)\n", tests=["assert add(1, 2) == 3"]), Status.runtime_error),
        (ExecutionRequest(program="import sys\nsys.exit(0)\n", tests=["assert add(1, 2) == 3"]), Status.runtime_error),
        (ExecutionRequest(program=textwrap.dedent("""
            class Yes:
                def __eq__(self, other):
                    return True
            def add(a, b):
                return Yes()
            """), tests=["assert add(1, 2) == 3"]), Status.failed),
        (ExecutionRequest(program="while True:\n    pass\n", tests=["assert True"], limits=Limits(wall_timeout_s=1)),
         Status.timeout),
        (ExecutionRequest(program="block = bytearray(2 * 2**30)\n", tests=["assert True"], limits=Limits(memory_mb=256)),
         Status.memory_exceeded),
        (ExecutionRequest(
            language="cpp", program="#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a+b<<\"\\n\";}\n",
            tests=[IOTest(stdin="1 2", stdout="3"), IOTest(stdin="40 2", stdout="42")], limits=Limits(wall_timeout_s=20)),
         Status.passed),
        (ExecutionRequest(program=add, tests=["assert add(2, 2) == 4"]), Status.passed),  # healthy after all that
        # coverage: the lines that ran, as in the process backend (tests/test_sandbox.py)
        (ExecutionRequest(program="def f(x):\n    if x > 0:\n        return 1\n    return -1\n", tests=["assert f(3) == 1"],
                          coverage=True), Status.passed),
        (ExecutionRequest(program="n = int(input())\nif n == 1:\n    print(1)\nelse:\n    print(0)\n",
                          tests=[IOTest(stdin="1", stdout="1")], coverage=True), Status.passed),
    ]
    results, backend = run_all([r for r, _ in cases])
    for (request, expected), result in zip(cases, results):
        assert result.status is expected, (request.program[:60], result.detail, result.stderr[-300:])
    assert results[-2].lines_executed == [1, 2, 3] and results[-1].lines_executed == [1, 2, 3]
    assert results[0].lines_executed is None
    assert backend.recycled >= 2  # the timeout and the memory kill each replaced their container
    assert labelled_containers(backend.owner) == []  # close() left nothing behind


def test_each_container_is_held_to_the_configured_limits():
    import docker
    from sandbox_pool.pool import DockerSandbox

    limits = DockerSandbox(memory_mb=384, cpus=0.5, pids=64, tmpfs_mb=32)
    backend = docker_backend_or_skip(1, limits)

    async def go():
        return await backend.execute(ExecutionRequest(program="import os\nprint(os.statvfs('/tmp').f_blocks * os.statvfs('/tmp').f_frsize)\n",
                                                      tests=[IOTest(stdin="", stdout=str(32 << 20))]))

    try:
        loop = asyncio.new_event_loop()
        result = loop.run_until_complete(go())
        (container,) = labelled_containers(backend.owner)
        host = docker.from_env().api.inspect_container(container.id)["HostConfig"]
    finally:
        backend.close()
        loop.close()
    assert result.status is Status.passed, (result.detail, result.stdout, result.stderr[-300:])  # /tmp is 32 MiB
    assert (host["Memory"], host["MemorySwap"], host["NanoCpus"], host["PidsLimit"]) == (384 << 20, 384 << 20, 5 * 10**8, 64)


def test_sandbox_check_says_what_isolation_the_containers_give():
    import subprocess
    import sys
    from pathlib import Path

    docker_backend_or_skip().close()
    done = subprocess.run([sys.executable, "-m", "coderloo.cli", "sandbox", "check", "--backend", "docker"],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert done.stdout.startswith("docker backend (warm containers of coderloo-sandbox:") and "all layers in force" in done.stdout
    assert "syscall filter               yes  Seccomp 2" in done.stdout and "NoNewPrivs 1" in done.stdout


def test_a_runtime_the_engine_does_not_have_is_refused_naming_it():
    from sandbox_pool.docker_backend import DockerBackend, DockerUnavailable
    from sandbox_pool.pool import DockerSandbox

    docker_backend_or_skip().close()
    with pytest.raises(DockerUnavailable, match=r"no runtime 'no-such-runtime' \(reward.pool.backend.runtime\); it has .*runc"):
        DockerBackend(1, DockerSandbox(runtime="no-such-runtime"))
    # the engine's default named explicitly runs as the default does
    result, = asyncio.run(_one(DockerBackend(1, DockerSandbox(runtime="runc")),
                               ExecutionRequest(program="x = 1\n", tests=["assert x == 1"])))
    assert result.status is Status.passed, result.detail


async def _one(backend, request):
    try:
        return [await backend.execute(request)]
    finally:
        backend.close()


def test_runs_waiting_for_containers_that_cannot_start_all_get_the_reason():
    """(Docker refuses more CPUs than the machine has.) Before, the first run got the error and the
    ones that came meanwhile waited for a container forever."""
    from sandbox_pool.pool import DockerSandbox

    docker_backend_or_skip().close()
    from sandbox_pool.docker_backend import DockerBackend

    backend = DockerBackend(1, DockerSandbox(cpus=4096))
    request = ExecutionRequest(program="x = 1\n", tests=["assert x == 1"])

    async def go():
        try:
            first = await asyncio.wait_for(asyncio.gather(*(backend.execute(request) for _ in range(3))), 120)
            again = await asyncio.wait_for(backend.execute(request), 120)  # and the next run tries again
            return first + [again]
        finally:
            backend.close()

    for result in asyncio.run(go()):
        assert result.status is Status.infra_error and "no sandbox container" in result.detail and "CPU" in result.detail, result.detail
