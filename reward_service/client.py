"""Starting the reward service for a training run, and scoring (and running programs: the code
interpreter) through its Serve handle (no HTTP)."""
from __future__ import annotations

import time

import ray
from ray import serve
from ray.serve.exceptions import BackPressureError

from common.placement import free_port
from reward_service.tasks import Task
from reward_service.app import build_app
from reward_service.config import ServiceConfig
from reward_service.schemas import ItemReward, RewardItem, RewardRequest, RunItem, RunRequest, RunResult

APP_NAME = "coderloo-rewards"
RETRIES = 5
Pending = list[tuple[RewardRequest | RunRequest, object]]  # requests sent, each with the service's answer to come


class RewardClient:
    """The trainer's view of the reward service: a Serve application it started and will remove."""

    def __init__(self, config: ServiceConfig, http_port: int | None = None):
        # Serve's HTTP proxy stays on loopback; the trainer itself only uses the handle.
        self.started_serve = not _serve_running()
        if self.started_serve:
            serve.start(http_options={"host": "127.0.0.1", "port": http_port or free_port()})
        self.max_batch = config.max_batch
        # Per-token rewards need the service to decode token ids: only with a tokenizer.
        self.per_token = config.tokenizer_path is not None
        self.retry_after_s = config.retry_after_s
        self.timeout_s = config.request_timeout_s
        self.retries = 0  # requests sent again after a replica died or the queue was full
        self.handle = serve.run(build_app(config), name=APP_NAME, route_prefix=f"/{APP_NAME}")

    def score(self, tasks: list[Task], completions: list[str]) -> list[ItemReward]:
        """One reward per (task, completion), in order; large batches go out as several requests at once."""
        return self.collect(self.submit(tasks, completions))

    def submit(
        self, tasks: list[Task], completions: list[str], token_ids: list[list[int]] | None = None
    ) -> Pending:
        """Send the requests now; `collect` waits for them. With each completion's `token_ids`
        (the service needs a tokenizer: `per_token`), each reward has per-token rewards too."""
        ids = token_ids if token_ids is not None else [None] * len(completions)
        items = [
            RewardItem(task=t, completion=c, completion_token_ids=i)
            for t, c, i in zip(tasks, completions, ids, strict=True)
        ]
        return self._send_batches(RewardRequest, items)

    def run(self, tasks: list[Task], programs: list[str]) -> list[RunResult]:
        """Run each (task, program) once with no tests (the code interpreter): what it printed and
        how it ended, in order."""
        items = [RunItem(task=t, program=p) for t, p in zip(tasks, programs, strict=True)]
        return self.collect(self._send_batches(RunRequest, items))

    def _send_batches(self, request_type: type[RewardRequest | RunRequest], items: list) -> Pending:
        """Send `items` as requests of at most `max_batch` items, all at once."""
        requests = [request_type(items=items[i : i + self.max_batch]) for i in range(0, len(items), self.max_batch)]
        return [(request, self._send(request)) for request in requests]

    def _send(self, request: RewardRequest | RunRequest):
        """The service's entry point for the request's kind."""
        entry = self.handle.run if isinstance(request, RunRequest) else self.handle.score
        return entry.remote(request)

    def collect(self, pending: Pending) -> list[ItemReward] | list[RunResult]:
        """The answers of submitted requests, in order. A request whose replica died is sent again
        (scoring and runs have no side effects), up to `RETRIES` times while Serve replaces the replica;
        so is one with no answer in `request_timeout_s` (its replica hangs: Serve's health check
        replaces it).
        A request refused because this handle's queue was full (over `max_queued_requests`) waits
        `retry_after_s` and is sent again, as often as it takes: the queue was full of this process's
        own requests, each of which ends, so backpressure slows a training run and never fails it."""
        out = []
        for request, response in pending:
            failures = 0
            while True:
                try:
                    out.extend(response.result(timeout_s=self.timeout_s).items)
                    break
                except BackPressureError:
                    time.sleep(self.retry_after_s)
                except TimeoutError as e:  # a request that never returns (a replica stopped, not dead) is a failure
                    response.cancel()
                    failures += 1
                    if failures > RETRIES:
                        raise RuntimeError(f"reward service: no answer to a request in {self.timeout_s:g} s, {failures} times "
                                           "(reward.request_timeout_s)") from e
                except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
                    failures += 1
                    if failures > RETRIES:
                        raise RuntimeError(f"reward service: a request failed {failures} times, last: {e}") from e
                    time.sleep(min(2.0 * failures, 10.0))
                self.retries += 1
                response = self._send(request)
        return out

    def close(self) -> None:
        serve.delete(APP_NAME)
        if self.started_serve:
            serve.shutdown()


def _serve_running() -> bool:
    return serve.context._get_global_client(raise_if_no_controller_running=False) is not None
