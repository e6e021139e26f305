"""SandboxFusion's API over coderloo's sandbox pool: `POST /run_code` and `GET /v1/ping`, in
SandboxFusion's request and response shapes, so that verl's, SkyRL's and PipelineRL's sandbox
clients (and SandboxFusion's own) can point at coderloo unchanged.

A request runs its program once, with its stdin, as the interpreter's runs do (one stdin/stdout
case whose output is not judged): `compile_timeout` is the run's start-up limit (C++'s compile,
Python's and Node's loading), `run_timeout` the program's own, `memory_limit_MB` its memory (the
run's cgroup, resident, and each process's address space). What the program wrote comes back
whole (up to the sandbox's output limit, `limits.output_mb`, past which the sandbox ends it): the
clients judge it themselves. A sandbox failure is `SandboxError` (its clients retry it or leave
it out), never `Failed`, which a trainer would learn from.

The route is a deployment of its own, in front of the reward service's replicas: Serve answers
a full queue with 503 (or 429), which verl's client scores as a failed test; a full queue here is
the replicas' queue refusing this deployment's call, answered 504, which it retries.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from ray import serve
from ray.serve.exceptions import BackPressureError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from reward_service.interpreter import EXIT_CODE, KILLED, run_request
from sandbox_pool import ExecutionRequest, ExecutionResult, Limits, Status

# SandboxFusion's language names -> the sandbox's
LANGUAGES = {"python": "python", "cpp": "cpp", "nodejs": "javascript"}
KILL_CODE = -9  # a program the sandbox ended (memory, output limit) reports SIGKILL's code, as a killed process
TOO_LONG_TO_COMPARE = "output too long to compare"  # judge.py: the run's case judges it, not this route


class RunCodeRequest(BaseModel):
    """SandboxFusion's RunCodeRequest. Fields it has that coderloo does not use are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")

    code: str = Field(description="The program.")
    language: str = Field(description="python, cpp or nodejs (SandboxFusion's other languages are refused: 422).")
    stdin: str | None = Field(None, description="What the program reads on its standard input.")
    compile_timeout: float = Field(10, gt=0, description="Seconds for the run's start-up: C++'s compile, loading the program.")
    run_timeout: float = Field(10, gt=0, description="Seconds of wall-clock time for the program's run.")
    memory_limit_MB: int = Field(
        -1, description="The program's memory in MiB: a resident limit (the run's cgroup, swap 0) and each process's "
        "address space; -1: the service's limits.memory_mb.")
    files: dict[str, str | None] = Field(
        default_factory=dict, description="SandboxFusion: files to write beside the program (base64). coderloo's "
        "sandbox takes none: a file with content is refused (422); entries without content are ignored, as there.")
    fetch_files: list[str] = Field(default_factory=list, description="SandboxFusion: files to return. None can be (422).")

    @field_validator("language")
    @classmethod
    def _known(cls, language: str) -> str:
        if language not in LANGUAGES:
            raise ValueError(f"language {language!r} is not supported; supported: {', '.join(LANGUAGES)}")
        return language

    @field_validator("files")
    @classmethod
    def _no_files(cls, files: dict[str, str | None]) -> dict[str, str | None]:
        given = [name for name, content in files.items() if isinstance(content, str)]
        if given:
            raise ValueError(f"files are not supported by coderloo's sandbox (given: {', '.join(given)[:200]}); "
                             "put what the program needs in its code or its stdin")
        return files

    @field_validator("fetch_files")
    @classmethod
    def _no_fetch(cls, names: list[str]) -> list[str]:
        if names:
            raise ValueError("fetch_files is not supported by coderloo's sandbox: the program's files stay in its run")
        return names


class CommandRunResult(BaseModel):
    status: Literal["Finished", "Error", "TimeLimitExceeded"]
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(BaseModel):
    status: Literal["Success", "Failed", "SandboxError"]
    message: str
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)


def execution_request(request: RunCodeRequest, limits: Limits, max_memory_mb: int) -> ExecutionRequest:
    """The sandbox request of a /run_code request, under the service's `limits` otherwise: all the
    output comes back (the tail is the output limit), and the timeouts are bounded by max_wall_s."""
    memory = limits.memory_mb if request.memory_limit_MB <= 0 else request.memory_limit_MB
    if memory > max_memory_mb:
        raise ValueError(f"memory_limit_MB is {memory}, over this service's most, {max_memory_mb} (reward.run_code_max_memory_mb)")
    for name in ("compile_timeout", "run_timeout"):
        if getattr(request, name) > limits.max_wall_s:
            raise ValueError(f"{name} is {getattr(request, name):g} s, over this service's most, {limits.max_wall_s:g} s "
                             "(reward.limits.max_wall_s)")
    run_limits = limits.model_copy(update={
        "wall_timeout_s": request.compile_timeout, "case_timeout_s": request.run_timeout, "memory_mb": memory,
        "output_tail_kb": limits.output_mb * 1024,
    })
    return run_request(request.code, request.stdin or "", LANGUAGES[request.language], run_limits)


def response(request: RunCodeRequest, result: ExecutionResult) -> RunCodeResponse:
    """The sandbox's result in SandboxFusion's words. `Success`: the program ran and exited with 0;
    `Failed`: it did not compile, exited otherwise, was killed or ran out of time; `SandboxError`:
    the sandbox failed, which says nothing of the program."""
    if result.status == Status.infra_error:
        return RunCodeResponse(status="SandboxError", message=result.detail)
    compiled = CommandRunResult(status="Finished", return_code=0, stdout="", stderr="") if request.language == "cpp" else None
    if result.status == Status.syntax_error or (result.status == Status.timeout and not result.tests):
        # it never got to run: a compile error (or Python's and Node's parse error), or its start-up ran out of time
        ended = (CommandRunResult(status="TimeLimitExceeded", execution_time=result.duration_s, stdout="", stderr=result.stderr)
                 if result.status == Status.timeout else
                 CommandRunResult(status="Finished", execution_time=result.duration_s, return_code=1, stdout=result.stdout,
                                  stderr=result.stderr or result.detail + "\n"))
        if request.language == "cpp":
            return RunCodeResponse(status="Failed", message=result.detail, compile_result=ended)
        return RunCodeResponse(status="Failed", message=result.detail, run_result=ended)
    ran = CommandRunResult(status="Finished", execution_time=result.duration_s, stdout=result.stdout, stderr=result.stderr)
    error = result.tests[0].error if result.tests else result.detail
    if result.status in (Status.passed, Status.failed) or error == TOO_LONG_TO_COMPARE:
        ran.return_code = 0  # it ended on its own with 0; the placeholder's verdict is not this route's
        return RunCodeResponse(status="Success", message="", compile_result=compiled, run_result=ran)
    if result.status == Status.timeout:
        ran.status = "TimeLimitExceeded"
    elif code := EXIT_CODE.fullmatch(error or ""):
        ran.return_code = int(code[1])
    elif killed := KILLED.fullmatch(error or ""):
        ran.return_code = -int(killed[1])
    else:  # out of memory, over the output limit: the sandbox ended it
        ran.return_code = KILL_CODE
    return RunCodeResponse(status="Failed", message=result.detail, compile_result=compiled, run_result=ran)


@serve.deployment
class SandboxFusion:
    """`POST /run_code` in front of the reward service's replicas, which run it in their pools (with
    training's isolation, limits and autoscaling). A bad request is refused here (422, 413), before
    it costs a replica anything. A plain ASGI handler, not FastAPI: the route is its whole prefix,
    which FastAPI would answer with a redirect to /run_code/."""

    def __init__(self, rewards_app: str, limits: Limits, max_memory_mb: int, max_body_bytes: int):
        self.rewards = serve.get_deployment_handle("RewardService", app_name=rewards_app)
        self.limits, self.max_memory_mb, self.max_body_bytes = limits, max_memory_mb, max_body_bytes

    async def __call__(self, http: Request) -> Response:
        if http.url.path.rstrip("/") != "/run_code" or http.method != "POST":
            return JSONResponse({"detail": "this deployment answers POST /run_code only"}, 404 if http.method == "POST" else 405)
        body = b""
        async for chunk in http.stream():
            body += chunk
            if len(body) > self.max_body_bytes:
                return JSONResponse({"detail": f"request body over {self.max_body_bytes} bytes"}, 413)
        try:
            request = RunCodeRequest.model_validate_json(body)
            run = execution_request(request, self.limits, self.max_memory_mb)
        except ValidationError as e:
            return JSONResponse({"detail": e.errors(include_url=False, include_context=False)}, 422)
        except ValueError as e:
            return JSONResponse({"detail": str(e)}, 422)
        try:
            result = await self.rewards.execute.remote(run)
        except BackPressureError:
            return JSONResponse({"detail": "every replica's queue is full: send again later"}, 504)
        except Exception as e:  # the replica died or failed: the sandbox's failure, not the program's
            answer = RunCodeResponse(status="SandboxError", message=f"{type(e).__name__}: {e}"[:2000])
        else:
            answer = response(request, result)
        return JSONResponse(answer.model_dump(mode="json"))
