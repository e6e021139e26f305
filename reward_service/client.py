"""Starting the reward service for a training run, and scoring (and running programs: the code
interpreter) through its Serve handle (no HTTP)."""
from __future__ import annotations

import threading
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


class _Request:
    """The items of one request to the service (of one submit or of several: `RewardClient.submit`),
    the answer to come, and the answer once it came."""

    def __init__(self, kind: type[RewardRequest | RunRequest]):
        self.kind = kind
        self.items: list = []
        self.body: RewardRequest | RunRequest | None = None  # once sent
        self.response = None  # the handle's answer to come, once sent
        self.answer: list | None = None  # once collected
        self.lock = threading.Lock()  # one collect takes the answer (and sends again); others wait for it


Pending = list[tuple[_Request, int, int]]  # a submit's items: their requests, and where they lie in each


class RewardClient:
    """The trainer's view of the reward service: a Serve application it started and will remove.

    Submits that come within `client_linger_ms` of each other (a step's prompts, as they finish
    generating) share requests of up to `client_batch_items` items: Serve's cost is per request."""

    def __init__(self, config: ServiceConfig, http_port: int | None = None):
        # Serve's HTTP proxy stays on loopback; the trainer itself only uses the handle.
        self.started_serve = not _serve_running()
        if self.started_serve:
            serve.start(http_options={"host": "127.0.0.1", "port": http_port or free_port()})
        self.batch_items = min(config.client_batch_items, config.max_batch)
        self.linger_s = config.client_linger_ms / 1000
        # Per-token rewards need the service to decode token ids: only with a tokenizer.
        self.per_token = config.tokenizer_path is not None
        self.retry_after_s = config.retry_after_s
        self.timeout_s = config.request_timeout_s
        self.retries = 0  # requests sent again after a replica died or the queue was full
        self.handle = serve.run(build_app(config), name=APP_NAME, route_prefix=f"/{APP_NAME}")
        self._filling = threading.Condition()  # guards the request being filled, and wakes the thread that sends it
        self._open: _Request | None = None  # the request submits are filling; sent `linger_s` after its first item
        self._open_since = 0.0
        self._sender: threading.Thread | None = None
        self._closed = False

    def score(self, tasks: list[Task], completions: list[str]) -> list[ItemReward]:
        """One reward per (task, completion), in order; large batches go out as several requests at once."""
        return self.collect(self.submit(tasks, completions))

    def submit(
        self, tasks: list[Task], completions: list[str], token_ids: list[list[int]] | None = None
    ) -> Pending:
        """Queue the items, to be sent within `linger_s` with those of other submits (at once when
        it is 0); `collect` waits for their rewards. With each completion's `token_ids` (the
        service needs a tokenizer: `per_token`), each reward has per-token rewards too."""
        ids = token_ids if token_ids is not None else [None] * len(completions)
        items = [
            RewardItem(task=t, completion=c, completion_token_ids=i)
            for t, c, i in zip(tasks, completions, ids, strict=True)
        ]
        pending = []
        with self._filling:
            at = 0
            while at < len(items):
                if self._open is None:
                    self._open, self._open_since = _Request(RewardRequest), time.monotonic()
                request = self._open
                take = min(len(items) - at, self.batch_items - len(request.items))
                pending.append((request, len(request.items), len(request.items) + take))
                request.items += items[at : at + take]
                at += take
                if len(request.items) == self.batch_items:
                    self._send_open()
            if self._open is not None and self.linger_s == 0:
                self._send_open()
            if self._open is not None:
                if self._sender is None:
                    self._sender = threading.Thread(target=self._send_after_linger, name="reward-client", daemon=True)
                    self._sender.start()
                self._filling.notify()
        return pending

    def run(self, tasks: list[Task], programs: list[str]) -> list[RunResult]:
        """Run each (task, program) once with no tests (the code interpreter): what it printed and
        how it ended, in order."""
        items = [RunItem(task=t, program=p) for t, p in zip(tasks, programs, strict=True)]
        pending = []
        for i in range(0, len(items), self.batch_items):  # all sent at once, in requests of their own
            request = _Request(RunRequest)
            request.items = items[i : i + self.batch_items]
            self._send(request)
            pending.append((request, 0, len(request.items)))
        return self.collect(pending)

    def _send_after_linger(self) -> None:
        """The client's thread: sends the request being filled `linger_s` after its first item."""
        with self._filling:
            while not self._closed:
                if self._open is None:
                    self._filling.wait()
                    continue
                left = self._open_since + self.linger_s - time.monotonic()
                if left > 0:
                    self._filling.wait(left)
                else:
                    self._send_open()

    def _send_open(self) -> None:
        """(Holding `_filling`.) Send the request being filled; the next submit starts another."""
        request, self._open = self._open, None
        self._send(request)
        self._filling.notify_all()  # collects waiting for it to be sent

    def _send(self, request: _Request) -> None:
        """To the service's entry point for the request's kind."""
        if request.body is None:
            request.body = request.kind(items=request.items)
        entry = self.handle.run if request.kind is RunRequest else self.handle.score
        request.response = entry.remote(request.body)

    def collect(self, pending: Pending, send: bool = True) -> list[ItemReward] | list[RunResult]:
        """The answers of submitted items, in order: a request still being filled is sent now, or
        with `send` False when its linger ends (a collect while others still submit)."""
        out = []
        for request, start, end in pending:
            with self._filling:
                if request is self._open and send:
                    self._send_open()
                while request.response is None:
                    self._filling.wait()
            with request.lock:
                if request.answer is None:
                    request.answer = self._answer(request)
            out.extend(request.answer[start:end])
        return out

    def _answer(self, request: _Request) -> list:
        """A sent request's items. One whose replica died is sent again (scoring and runs have no
        side effects), up to `RETRIES` times while Serve replaces the replica; so is one with no
        answer in `request_timeout_s` (its replica hangs: Serve's health check replaces it).
        A request refused because this handle's queue was full (over `max_queued_requests`) waits
        `retry_after_s` and is sent again, as often as it takes: the queue was full of this process's
        own requests, each of which ends, so backpressure slows a training run and never fails it."""
        failures = 0
        while True:
            try:
                return request.response.result(timeout_s=self.timeout_s).items
            except BackPressureError:
                time.sleep(self.retry_after_s)
            except TimeoutError as e:  # a request that never returns (a replica stopped, not dead) is a failure
                request.response.cancel()
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
            self._send(request)

    def close(self) -> None:
        with self._filling:
            self._closed = True
            self._filling.notify()
        serve.delete(APP_NAME)
        if self.started_serve:
            serve.shutdown()


def _serve_running() -> bool:
    return serve.context._get_global_client(raise_if_no_controller_running=False) is not None
