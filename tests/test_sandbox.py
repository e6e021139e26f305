"""The process sandbox through its real backend: every status (those a hostile program gets are rows
of test_hostile.py's table), the isolation it promises, the fork server's concurrency and recovery,
and the Ray pool."""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import textwrap
import uuid

import psutil
import pytest
from pydantic import ValidationError

from sandbox_pool import (CallTest, ExecutionRequest, ExecutionResult, ForkServer, IOTest, Limits, PoolSettings, SandboxPool,
                          Status)
from sandbox_pool.process_backend import BOOT

SANDBOX_UID = 65534
SERVER = ForkServer()  # one warm server for the tests that need no server of their own


def teardown_module() -> None:
    SERVER.close()


def run(program: str, tests: list[str], test_setup: str = "", entry_point: str | None = None, **limits) -> ExecutionResult:
    request = ExecutionRequest(program=textwrap.dedent(program), tests=tests, test_setup=test_setup, entry_point=entry_point,
                               limits=Limits(**limits))
    return asyncio.run(SERVER.execute(request))


def processes_named(name: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name"]) if p.info["name"] == name]


def processes_with_argument(argument: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if argument in (p.info["cmdline"] or []):
            found.append(p)
    return found


def test_limits_are_validated():
    with pytest.raises(ValidationError):
        Limits(wall_timeout=3)  # a typo is an error, not a silently ignored field
    with pytest.raises(ValidationError):
        Limits(memory_mb=0)
    assert ExecutionRequest(program="", tests=[]).limits == Limits()


def test_passed():
    result = run(
        """
        def add(a, b):
            return a + b
        print("hello from the program")
        """,
        ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add('a', 'b') == 'ab'"],
    )
    assert result.status is Status.passed, result.detail
    assert [t.passed for t in result.tests] == [True, True, True]
    assert result.num_tests == 3 and result.num_passed == 3 and result.fraction_passed == 1.0
    assert result.stdout == "hello from the program\n"
    assert result.duration_s > 0


def test_failed_has_per_test_outcomes():
    result = run(
        """
        def add(a, b):
            return a - b
        """,
        ["assert add(2, 0) == 2", "assert add(1, 2) == 3, 'wrong sum'", "add(1)", "assert add(1, 2) =="],
    )
    assert result.status is Status.failed
    assert [t.passed for t in result.tests] == [True, False, False, False]
    assert result.tests[0].error is None
    assert result.tests[1].error == "AssertionError: wrong sum"
    assert result.tests[2].error.startswith("TypeError: ")
    assert result.tests[3].error.startswith("SyntaxError: ")
    assert result.num_passed == 1 and result.fraction_passed == pytest.approx(0.25)


def test_tests_see_the_program_as_its_own_module_would():
    """MBPP 126 defines `sum` and tests it (its entry point), and MBPP 367's setup builds a tree of
    the program's Node objects. A builtin the program redefines but is not under test (`max`,
    `sorted`) stays the tester's."""
    program = """
        class Node:
            def __init__(self, data):
                self.data = data
                self.left = None
        def total(node):
            return 0 if node is None else node.data + total(node.left)
        def sum(a, b):
            return a * b
        def max(*args):
            return 0
        sorted = lambda values: [1]
        """
    tests = ["assert sum(3, 4) == 12", "assert total(root) == 3", "assert root.left.data == 2", "assert max(1, 2) == 2",
             "assert sorted([2, 1]) == [1, 2]"]
    result = run(program, tests, test_setup="root = Node(1)\nroot.left = Node(2)\n", entry_point="sum")
    assert result.status is Status.passed, (result.detail, result.tests)
    # without an entry point no program name shadows a builtin: the tests' `sum` is Python's
    result = run(program, tests, test_setup="root = Node(1)\nroot.left = Node(2)\n")
    assert [t.passed for t in result.tests] == [False, True, True, True, True]


COVERED = "def f(x):\n    if x > 0:\n        return 1\n    return -1\n\ndef unused():\n    return 5\n"


def test_coverage_records_the_lines_the_tests_ran_and_only_when_asked():
    """The lines of the program that ran, its load and every call from the tests (assert and call
    tests alike, passed or failed); nothing of the tester's or the runner's own code."""
    assert run(COVERED, ["assert f(3) == 1"]).lines_executed is None  # off: no tracer
    on = {"program": COVERED, "coverage": True}
    assert asyncio.run(SERVER.execute(ExecutionRequest(**on, tests=["assert f(3) == 1"]))).lines_executed == [1, 2, 3, 6]
    failed = asyncio.run(SERVER.execute(ExecutionRequest(**on, tests=["assert f(-3) == 1"])))
    assert failed.status is Status.failed and failed.lines_executed == [1, 2, 4, 6]
    calls = [CallTest(args=[3], accepted=[1]), CallTest(args=[-1], accepted=[-1])]
    called = asyncio.run(SERVER.execute(ExecutionRequest(**on, tests=calls, entry_point="f")))
    assert called.status is Status.passed and called.lines_executed == [1, 2, 3, 4, 6]
    # stdin/stdout: each case's run reports its lines; a case killed at its limit reports none
    cases = [IOTest(stdin="1", stdout="1"), IOTest(stdin="2", stdout="2"), IOTest(stdin="0", stdout="0")]
    stdio = asyncio.run(SERVER.execute(ExecutionRequest(
        program="n = int(input())\nif n == 1:\n    print(1)\nelif n == 2:\n    print(2)\nelse:\n    while True:\n        pass\n",
        tests=cases, coverage=True, limits=Limits(case_timeout_s=0.5))))
    assert [t.passed for t in stdio.tests] == [True, True, False] and stdio.lines_executed == [1, 2, 3, 4, 5]
    assert asyncio.run(SERVER.execute(ExecutionRequest(program="print(input())\n", tests=cases[:1]))).lines_executed is None


def test_syntax_error():
    result = run("def add(a, b)\n    return a + b\n", ["assert add(1, 2) == 3"])
    assert result.status is Status.syntax_error
    assert "SyntaxError" in result.detail and "line 1" in result.detail
    assert result.tests == [] and result.num_tests == 1 and result.fraction_passed == 0.0


def test_runtime_error():
    result = run("values = {}\nfirst = values['missing']\n", ["assert True"])
    assert result.status is Status.runtime_error
    assert "KeyError: 'missing'" in result.detail
    assert result.tests == [] and result.fraction_passed == 0.0


def test_infra_error_when_the_interpreter_is_missing():
    request = ExecutionRequest(program="x = 1", tests=["assert x == 1"])
    result = asyncio.run(ForkServer("/nonexistent/bin/python3").execute(request))
    assert result.status is Status.infra_error
    assert "/nonexistent/bin/python3" in result.detail
    assert result.num_tests == 1 and result.fraction_passed == 0.0


def test_infra_error_when_the_fork_server_cannot_start():
    request = ExecutionRequest(program="x = 1", tests=["assert x == 1"])
    server = ForkServer("/bin/false")
    # Each run finds the server dead and starts it again; none waits for an answer that never comes.
    for _ in range(3):
        result = asyncio.run(server.execute(request))
        assert result.status is Status.infra_error
        assert "fork server" in result.detail


NO_CGROUPS = """
import asyncio, json
from sandbox_pool import ExecutionRequest, ForkServer
request = ExecutionRequest(program="x = 1", tests=["assert x == 1"])
seen = {}
for weaker in (False, True):
    server = ForkServer(weaker_isolation=weaker)
    result = asyncio.run(server.execute(request))
    seen[str(weaker)] = {"status": result.status.value, "detail": result.detail, "missing": result.isolation_missing}
    server.close()
print(json.dumps(seen))
"""


def test_a_process_sandbox_without_its_cgroups_refuses_to_run():
    """As under a tool that remounts /sys: an empty tmpfs on /sys/fs/cgroup, in a mount namespace of its own."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    shell = 'mount -t tmpfs none /sys/fs/cgroup && exec "$0" "$@"'
    done = subprocess.run(["unshare", "--mount", "sh", "-c", shell, sys.executable, "-c", NO_CGROUPS], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    refused = seen["False"]
    assert refused["status"] == "infra_error" and "refuses to run programs without its full isolation" in refused["detail"]
    for layer in ("pids cgroup", "memory cgroup", "cpu cgroup"):
        assert layer in refused["detail"], refused["detail"]
    assert "weaker_isolation=true" in refused["detail"] and "type=docker" in refused["detail"]
    accepted = seen["True"]
    assert accepted["status"] == "passed", accepted["detail"]
    assert accepted["missing"] == ["cpu cgroup", "memory cgroup", "pids cgroup"]  # said on every result
    # and `coderloo sandbox check` says what is missing, and fails
    checked = subprocess.run(["unshare", "--mount", "sh", "-c", shell, sys.executable, "-m", "coderloo.cli", "sandbox", "check",
                              "--backend", "process"], capture_output=True, text=True, timeout=120,
                             cwd=Path(__file__).resolve().parent.parent)
    assert checked.returncode == 1, checked.stdout + checked.stderr[-2000:]
    assert "cgroups (pids, memory, cpu)  NO" in checked.stdout and "refuses to run" in checked.stdout, checked.stdout
    assert "syscall filter               yes" in checked.stdout, checked.stdout


POOL_NO_CGROUPS = """
import json, ray
from coderloo.runtime import init_ray
from sandbox_pool import ExecutionRequest, PoolSettings, SandboxPool
init_ray(num_cpus=2)
seen = {}
for weaker in (False, True):
    pool = SandboxPool(PoolSettings(min_executors=1, max_executors=1, start_timeout_s=120,
                                    backend={"type": "process", "weaker_isolation": weaker}))
    result, = pool.run([ExecutionRequest(program="x = 1", tests=["assert x == 1"])])
    seen[str(weaker)] = {"status": result.status.value, "detail": result.detail, "missing": result.isolation_missing}
    pool.shutdown()
ray.shutdown()
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_a_process_pool_without_cgroups_refuses_to_start():
    """The pool over Ray, in a mount namespace whose /sys/fs/cgroup is an empty tmpfs: its executor
    fails its health check, naming what is missing, so no program runs; with weaker_isolation it runs."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    shell = 'mount -t tmpfs none /sys/fs/cgroup && exec "$0" "$@"'
    done = subprocess.run(["unshare", "--mount", "sh", "-c", shell, sys.executable, "-c", POOL_NO_CGROUPS],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    refused = seen["False"]
    assert refused["status"] == "infra_error" and "no sandbox executor could start" in refused["detail"], refused
    assert "refuses to run programs without its full isolation" in refused["detail"] and "pids cgroup" in refused["detail"]
    assert seen["True"]["status"] == "passed" and "memory cgroup" in seen["True"]["missing"], seen["True"]


def test_sandbox_check_says_what_isolation_is_in_force():
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-m", "coderloo.cli", "sandbox", "check", "--backend", "process"],
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    for layer in ("sandbox users", "capabilities", "no_new_privs", "syscall filter", "PID namespace", "private root",
                  "network namespace", "cgroups (pids, memory, cpu)"):
        assert any(line.strip().startswith(layer + " ") and "  yes  " in line for line in done.stdout.splitlines()), (layer, done.stdout)
    assert "all layers in force" in done.stdout


def test_sandbox_check_reads_each_layer_from_what_the_program_saw():
    from sandbox_pool.check import layers

    seen = {"uid": "65534", "gid": "65534", "groups": "", "caps": {"CapEff": "0000000000000000", "CapBnd": "0000000000000000"},
            "no_new_privs": "1", "seccomp": "2", "processes": 1, "init": "", "cgroup": ["0::/coderloo-sandbox-1/run-2"],
            "interfaces": ["lo"], "checkout_visible": False}
    server = {"cgroups": ["cpu", "memory", "pids"]}
    assert all(ok for _, ok, _ in layers(seen, server))
    for change, layer in [({"seccomp": "0"}, "syscall filter"), ({"caps": {"CapBnd": "000001ffffffffff"}}, "capabilities"),
                          ({"uid": "0"}, "sandbox users"), ({"interfaces": ["lo", "eth0"]}, "network namespace"),
                          ({"checkout_visible": True}, "private root"), ({"processes": 40}, "PID namespace")]:
        assert [name for name, ok, _ in layers({**seen, **change}, server) if not ok] == [layer]
    assert [name for name, ok, _ in layers(seen, {"cgroups": ["pids"]}) if not ok] == ["cgroups (pids, memory, cpu)"]


def test_fork_bomb_is_contained_and_reaped():
    name = f"bomb{uuid.uuid4().hex[:8]}"  # the bomb's processes carry it as their name (comm)
    program = f"""
        import ctypes, os
        ctypes.CDLL(None).prctl(15, {name.encode()!r})  # PR_SET_NAME, inherited by every fork
        def bomb():
            refused = False
            while True:
                try:
                    os.fork()
                except BlockingIOError:
                    if not refused:
                        print("fork refused", flush=True)
                        refused = True
        """

    async def run_and_watch() -> tuple[ExecutionResult, int]:
        request = ExecutionRequest(
            program=textwrap.dedent(program), tests=["bomb()"], limits=Limits(wall_timeout_s=3.0, max_processes=32)
        )
        task = asyncio.create_task(SERVER.execute(request))
        most_seen = 0
        while not task.done():
            most_seen = max(most_seen, len(processes_named(name)))
            await asyncio.sleep(0.05)
        return await task, most_seen

    result, most_seen = asyncio.run(run_and_watch())
    assert result.status is Status.timeout
    assert most_seen >= 2, "the watcher never saw the bomb's processes"
    if os.geteuid() == 0:
        assert "fork refused" in result.stdout  # RLIMIT_NPROC held for the unprivileged uid
    assert processes_named(name) == []  # none survive, not even as zombies


def test_processes_left_behind_are_killed_after_the_run():
    marker = f"sleeper-{uuid.uuid4().hex}"
    program = f"""
        import os, signal, subprocess, sys, time
        go = []
        signal.signal(signal.SIGUSR1, lambda *_: go.append(1))
        def leave_sleepers():
            sleep = [sys.executable, "-c", "import time; time.sleep(600)", {marker!r}]
            in_group = subprocess.Popen(sleep)
            # A new session leaves the process group: killpg alone would miss this one.
            escaped = subprocess.Popen(sleep, start_new_session=True)
            deadline = time.monotonic() + 30
            while not go and time.monotonic() < deadline:
                time.sleep(0.05)
            return in_group.poll() is None and escaped.poll() is None
        """

    async def run_and_watch() -> tuple[ExecutionResult, list[int], list[int]]:
        request = ExecutionRequest(
            program=textwrap.dedent(program), tests=["assert leave_sleepers()"], limits=Limits(wall_timeout_s=60)
        )
        task = asyncio.create_task(SERVER.execute(request))
        try:
            sleepers: list[psutil.Process] = []
            for _ in range(400):
                sleepers = processes_with_argument(marker)
                if len(sleepers) == 2 or task.done():
                    break
                await asyncio.sleep(0.05)
            uids = [p.uids().real for p in sleepers]
            pids = [p.pid for p in sleepers]
        finally:
            send_go(processes_with_argument(marker)[:1])
        return await task, pids, uids

    result, pids, uids = asyncio.run(run_and_watch())
    assert result.status is Status.passed, (result.detail, result.stderr)
    assert len(pids) == 2, "the sleepers never showed up"
    if os.geteuid() == 0:
        assert uids == [SANDBOX_UID, SANDBOX_UID]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert processes_with_argument(marker) == []


def test_writing_past_the_file_size_limit_fails():
    result = run(
        """
        def write(size):
            with open("out.bin", "wb") as f:
                f.write(b"x" * size)
            return size
        """,
        ["assert write(1000) == 1000", "write(3 * 2**20)"],
        file_size_mb=1,
    )
    assert result.status is Status.failed
    assert result.tests[0].passed
    assert not result.tests[1].passed and "File too large" in result.tests[1].error


def test_network_is_unreachable():
    program = textwrap.dedent(
        """
        import socket
        def probe(port):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=3).close()
                return "connected"
            except OSError as e:
                return type(e).__name__
        """
    )
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        # The same probe outside the sandbox does reach the server.
        namespace: dict = {}
        exec(program, namespace)
        assert namespace["probe"](port) == "connected"
        server.accept()[0].close()

        result = run(program, [f"print(probe({port}))", f"assert probe({port}) != 'connected'"])
        assert result.status is Status.passed, (result.detail, result.stdout)
        assert "connected" not in result.stdout
        server.settimeout(0)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing from the sandbox arrived


def mixed_requests(count: int) -> list[tuple[ExecutionRequest, Status]]:
    """Requests whose outcome and output say which request they were."""
    cases = []
    for i in range(count):
        function = f"print({i})\ndef f():\n    return {i}\n"
        if i in (7, 31):
            program, tests, limits = f"print({i}, flush=True)\nwhile True:\n    pass\n", [], Limits(wall_timeout_s=1)
            expected = Status.timeout
        else:
            expected, program, tests = [
                (Status.passed, function, [f"assert f() == {i}"] * 3),
                (Status.failed, function, [f"assert f() == {i}", f"assert f() == {i + 1}"]),
                (Status.syntax_error, f"print({i})\ndef f(:\n", ["assert True"]),
                (Status.runtime_error, f"print({i})\nraise RuntimeError('request {i}')\n", ["assert True"]),
                (Status.memory_exceeded, f"print({i})\nblock = bytearray(2**31)\n", ["assert True"]),
            ][i % 5]
            limits = Limits(memory_mb=256)
        cases.append((ExecutionRequest(program=program, tests=tests, limits=limits), expected))
    return cases


def check_in_order(cases: list[tuple[ExecutionRequest, Status]], results: list[ExecutionResult]) -> None:
    assert len(results) == len(cases)
    for i, ((request, expected), result) in enumerate(zip(cases, results)):
        assert result.status is expected, (i, result.detail)
        assert result.num_tests == len(request.tests)
        if expected is not Status.syntax_error:
            assert result.stdout == f"{i}\n", i
        if expected is Status.runtime_error:
            assert f"request {i}" in result.detail


def test_pool_runs_mixed_requests_in_order(ray_cluster):
    cases = mixed_requests(50)
    pool = SandboxPool(PoolSettings(min_executors=2, max_executors=2, concurrency_per_executor=4))
    try:
        check_in_order(cases, pool.run([request for request, _ in cases]))
        # submit() hands back refs at once; both halves run at the same time.
        first, second = pool.submit([r for r, _ in cases[:25]]), pool.submit([r for r, _ in cases[25:]])
        check_in_order(cases, [f.result() for f in first + second])
    finally:
        pool.shutdown()


def test_pool_takes_submissions_from_several_threads(ray_cluster):
    # The reward service scores concurrent requests from worker threads through one pool.
    from concurrent.futures import ThreadPoolExecutor

    cases = mixed_requests(48)
    pool = SandboxPool(PoolSettings(min_executors=2, max_executors=2, concurrency_per_executor=4))
    try:
        chunks = [cases[i : i + 6] for i in range(0, len(cases), 6)]
        with ThreadPoolExecutor(8) as threads:
            results = list(threads.map(lambda chunk: pool.run([r for r, _ in chunk]), chunks))
        check_in_order(cases, [r for chunk in results for r in chunk])
    finally:
        pool.shutdown()


# Not under /tmp: each run gets a private /tmp (and /var/tmp, /dev/shm) of its own. Not in the
# checkout either: a clone may live under /tmp (a fresh clone or CI), or under a folder the
# sandbox user may not enter.


# The test and a program cannot share a file (the program sees none of the host's), so they meet
# through what the host can see of the program: it starts a marker process (a sleeper with the
# marker in its command line), and waits for SIGUSR1, which the test sends to the marker's parent.
WAIT_FOR_GO = """
import signal, subprocess, sys, time
go = []
signal.signal(signal.SIGUSR1, lambda *_: go.append(1))
def wait_for_go(marker):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker])
    deadline = time.monotonic() + 30
    while not go and time.monotonic() < deadline:
        time.sleep(0.02)
    return bool(go)
"""


def send_go(markers: list[psutil.Process]) -> None:
    for marker in markers:
        try:
            marker.parent().send_signal(signal.SIGUSR1)
        except (psutil.NoSuchProcess, AttributeError):
            pass


def test_runs_of_one_fork_server_run_at_the_same_time():
    # Each program waits for the go, which comes only once all of them are running at once.
    count = 6
    marker = f"meet-{uuid.uuid4().hex}"
    requests = [ExecutionRequest(program=WAIT_FOR_GO, tests=[f"assert wait_for_go({marker!r})"],
                                 limits=Limits(wall_timeout_s=60)) for _ in range(count)]

    async def run_all() -> tuple[list[ExecutionResult], int]:
        server = ForkServer()
        try:
            runs = asyncio.gather(*(server.execute(request) for request in requests))
            most = 0
            for _ in range(600):
                markers = processes_with_argument(marker)
                most = max(most, len(markers))
                if most == count:
                    send_go(markers)
                    break
                await asyncio.sleep(0.05)
            return list(await runs), most
        finally:
            server.close()

    results, most = asyncio.run(run_all())
    assert most == count
    assert [r.status for r in results] == [Status.passed] * count, [r.detail for r in results]


def fork_servers_of_this_process() -> set[int]:
    found = set()
    for p in psutil.Process().children():
        with contextlib.suppress(psutil.Error):  # it may end while we look
            if p.status() != psutil.STATUS_ZOMBIE and BOOT in p.cmdline():
                found.add(p.pid)
    return found


def test_a_dead_fork_server_is_replaced_and_its_forked_runs_still_answer():
    marker = f"started-{uuid.uuid4().hex}"
    waiting = ExecutionRequest(program=WAIT_FOR_GO, tests=[f"assert wait_for_go({marker!r})"],
                               limits=Limits(wall_timeout_s=60))
    simple = ExecutionRequest(program="def f():\n    return 1\n", tests=["assert f() == 1"])

    async def scenario() -> tuple[ExecutionResult, ExecutionResult, int, set[int]]:
        server = ForkServer()
        before = fork_servers_of_this_process()
        try:
            first = asyncio.create_task(server.execute(waiting))
            for _ in range(600):
                if processes_with_argument(marker) or first.done():
                    break
                await asyncio.sleep(0.05)
            (killed,) = fork_servers_of_this_process() - before
            psutil.Process(killed).kill()
            while psutil.Process(killed).status() != psutil.STATUS_ZOMBIE:  # let the server reap it
                await asyncio.sleep(0.01)
            second = await server.execute(simple)  # on a new server
            replacements = fork_servers_of_this_process() - before
            send_go(processes_with_argument(marker))
            return await first, second, killed, replacements
        finally:
            send_go(processes_with_argument(marker))
            server.close()

    first, second, killed, replacements = asyncio.run(scenario())
    assert first.status is Status.passed, first.detail  # its supervisor did not need the server
    assert second.status is Status.passed, second.detail
    assert len(replacements) == 1 and killed not in replacements


def test_hanging_up_kills_the_run():
    marker = f"sleeper-{uuid.uuid4().hex}"
    program = f"""
        import subprocess, sys, time
        def sleep_forever():
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", {marker!r}])
            time.sleep(600)
        """
    request = ExecutionRequest(
        program=textwrap.dedent(program), tests=["sleep_forever()"], limits=Limits(wall_timeout_s=600, cpu_time_s=600)
    )

    async def cancel_while_running() -> tuple[int, list[psutil.Process]]:
        task = asyncio.create_task(SERVER.execute(request))
        seen = 0
        for _ in range(600):
            seen = len(processes_with_argument(marker))
            if seen or task.done():
                break
            await asyncio.sleep(0.05)
        task.cancel()  # the caller gives up: the supervisor sees its socket close
        left = processes_with_argument(marker)
        for _ in range(200):
            if not left:
                break
            await asyncio.sleep(0.05)
            left = processes_with_argument(marker)
        return seen, left

    seen, left = asyncio.run(cancel_while_running())
    assert seen == 1, "the sleeper never showed up"
    assert left == []


# ---- the Ray pool: reruns, scaling, failures, backends ----

def sleepy_requests(count: int, sleep_s: float) -> list[ExecutionRequest]:
    """Each prints its index and passes after sleeping: long enough to be in flight when we act."""
    program = "import time\ndef f(i):\n    time.sleep({sleep})\n    return i\nprint({i})\n"
    return [
        ExecutionRequest(program=program.format(sleep=sleep_s, i=i), tests=[f"assert f({i}) == {i}"],
                         limits=Limits(wall_timeout_s=60))
        for i in range(count)
    ]


def wait_until(condition, timeout_s: float = 60.0):
    import time

    deadline = time.monotonic() + timeout_s
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return value


def cgroups_of_dead_fork_servers() -> list[str]:
    """The cgroup roots (isolation.make_cgroup_roots) whose fork server is gone: what its janitor failed to remove."""
    import glob
    import re

    roots = glob.glob("/sys/fs/cgroup/**/coderloo-sandbox-*", recursive=True)
    pids = [re.search(r"-(\d+)$", root).group(1) for root in roots]
    return [root for root, pid in zip(roots, pids) if not os.path.exists(f"/proc/{pid}")]


def named_executors(ray, pool: SandboxPool) -> list[tuple[str, str]]:
    from ray.util import list_named_actors

    return [(a["name"], a["namespace"]) for a in list_named_actors(all_namespaces=True)
            if a["name"].startswith(f"coderloo-sandbox-{pool.pool_id}-")]


def test_pool_runs_again_what_a_killed_executor_had_and_delivers_each_result_once(ray_cluster):
    ray = ray_cluster
    stale_before = set(cgroups_of_dead_fork_servers())  # (a machine's leftovers from before this test)
    pool = SandboxPool(PoolSettings(min_executors=2, max_executors=2, concurrency_per_executor=4))
    try:
        requests = sleepy_requests(24, sleep_s=1.0)
        futures = pool.submit(requests)
        # Both executors busy, 16 queued behind their busy slots (HELD_PER_SLOT: 3 runs a slot).
        assert wait_until(lambda: pool.stats()["running"] == 8), pool.stats()
        name, namespace = named_executors(ray, pool)[0]
        ray.kill(ray.get_actor(name, namespace=namespace))
        results = [f.result(timeout=300) for f in futures]
        stats = pool.stats()
    finally:
        pool.shutdown()
    assert len(results) == len(requests)
    for i, result in enumerate(results):  # each its own request's result, none an infra_error
        assert result.status is Status.passed, (i, result.status, result.detail)
        assert result.stdout == f"{i}\n"
    assert wait_until(lambda: not set(cgroups_of_dead_fork_servers()) - stale_before, timeout_s=30) is True
    assert stats["executors_lost"] == 1
    # What the killed executor held: its 4 slots' runs and the 8 waiting behind them (HELD_PER_SLOT).
    assert 1 <= stats["reruns"] <= 12
    assert stats["delivered"] == len(requests)  # one result per request, none twice
    assert len(stats["ready"]) == 2  # replaced


def test_pool_runs_again_a_request_whose_sandbox_failed(ray_cluster):
    """The one retry of a sandbox failure: a supervisor killed under its run answers nothing, its
    executor reports an infra_error, and the pool runs the request again (no executor was lost)."""
    stale_before = set(cgroups_of_dead_fork_servers())
    pool = SandboxPool(PoolSettings(min_executors=1, max_executors=1, concurrency_per_executor=1))

    def supervisors() -> list[psutil.Process]:  # of this pool's one executor, none of another pool's
        executors = named_executors(ray_cluster, pool)
        if not executors:
            return []
        name, namespace = executors[0]
        executor = ray_cluster.get_actor(name, namespace=namespace)
        pid = ray_cluster.get(executor.__ray_call__.remote(lambda self: os.getpid()))
        try:
            servers = [p for p in psutil.Process(pid).children() if BOOT in p.cmdline()]
            return [child for server in servers for child in server.children()]
        except psutil.NoSuchProcess:  # a process that ended while we looked
            return []

    try:
        assert wait_until(lambda: len(pool.stats()["ready"]) == 1)  # its health check is done
        future = pool.submit(sleepy_requests(1, sleep_s=3.0))[0]
        running = wait_until(supervisors)
        assert running, pool.stats()
        for supervisor in running:
            supervisor.kill()
        result = future.result(timeout=120)
        stats = pool.stats()
    finally:
        pool.shutdown()
    # The killed supervisor left its run's cgroup behind; the server's janitor removed it.
    assert wait_until(lambda: not set(cgroups_of_dead_fork_servers()) - stale_before, timeout_s=30) is True
    assert result.status is Status.passed and result.stdout == "0\n", (result.status, result.detail)
    assert stats["reruns"] == 1 and stats["executors_lost"] == 0 and stats["delivered"] == 1


def test_pool_grows_with_its_queue_and_shrinks_when_idle(ray_cluster):
    pool = SandboxPool(PoolSettings(min_executors=1, max_executors=3, concurrency_per_executor=2, idle_s=1.0))
    try:
        assert wait_until(lambda: len(pool.stats()["ready"]) == 1)
        results = pool.run(sleepy_requests(12, sleep_s=0.5))
        grown = pool.stats()
        assert wait_until(lambda: len(pool.stats()["executors"]) == 1), pool.stats()
        shrunk = pool.stats()
    finally:
        pool.shutdown()
    assert [r.status for r in results] == [Status.passed] * 12
    assert grown["executors_started"] == 3
    assert shrunk["executors_removed"] == 2 and shrunk["executors_lost"] == 0


def test_executors_that_cannot_start_give_infra_errors_not_failed_programs(ray_cluster):
    from reward_service.scorer import RewardScorer, SandboxInfraError
    from reward_service.weights import RewardWeights
    from coderloo.tasksets.synthetic import synthetic_suite
    from coderloo.runtime import LOCAL_SANDBOX_SLOTS

    # An executor asks for one `sandbox` unit per slot: more than the cluster has never gets a place.
    pool = SandboxPool(PoolSettings(min_executors=1, max_executors=1, concurrency_per_executor=LOCAL_SANDBOX_SLOTS + 1,
                                    start_timeout_s=2.0))
    try:
        (result,) = pool.run([ExecutionRequest(program="x = 1", tests=["assert x == 1"])])
        assert result.status is Status.infra_error
        assert "`sandbox` resource" in result.detail, result.detail
        task = synthetic_suite()["train"][0]
        scorer = RewardScorer(pool, Limits(), RewardWeights())
        with pytest.raises(SandboxInfraError, match="sandbox"):  # refused, never scored as a failure
            scorer.score([task], [task.reference[len(task.prompt):]])
    finally:
        pool.shutdown()


def test_pool_with_the_docker_backend(ray_cluster):
    from sandbox_pool.docker_backend import DockerBackend, DockerUnavailable

    try:
        DockerBackend(containers=1).close()  # only to know whether an engine and the image are there
    except DockerUnavailable as e:
        if os.environ.get("CODERLOO_REQUIRE_DOCKER") == "1":
            pytest.fail(f"CODERLOO_REQUIRE_DOCKER=1 but: {e}")
        pytest.skip(str(e))
    cases = mixed_requests(10)
    pool = SandboxPool(PoolSettings(min_executors=1, max_executors=1, concurrency_per_executor=2, backend={"type": "docker"}))
    try:
        check_in_order(cases, pool.run([request for request, _ in cases]))
    finally:
        pool.shutdown()
