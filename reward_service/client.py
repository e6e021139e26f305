"""Starting the reward service for a training run, and scoring through its Serve handle (no HTTP)."""
from __future__ import annotations

from ray import serve

from coderloo.runtime import free_port
from coderloo.tasksets.task import Task
from reward_service.app import build_app
from reward_service.schemas import ItemReward, RewardItem, RewardRequest, ServiceConfig

APP_NAME = "coderloo-rewards"


class RewardClient:
    """The trainer's view of the reward service: a Serve application it started and will remove."""

    def __init__(self, config: ServiceConfig, http_port: int | None = None):
        # Serve's HTTP proxy stays on loopback; the trainer itself only uses the handle.
        self.started_serve = not _serve_running()
        if self.started_serve:
            serve.start(http_options={"host": "127.0.0.1", "port": http_port or free_port()})
        self.max_batch = config.max_batch
        self.handle = serve.run(build_app(config), name=APP_NAME, route_prefix=f"/{APP_NAME}")

    def score(self, tasks: list[Task], completions: list[str]) -> list[ItemReward]:
        """One reward per (task, completion), in order; large batches go out as several requests at once."""
        items = [RewardItem(task=t, completion=c) for t, c in zip(tasks, completions, strict=True)]
        chunks = [items[i : i + self.max_batch] for i in range(0, len(items), self.max_batch)]
        responses = [self.handle.score.remote(RewardRequest(items=chunk)) for chunk in chunks]
        return [item for response in responses for item in response.result().items]

    def close(self) -> None:
        serve.delete(APP_NAME)
        if self.started_serve:
            serve.shutdown()


def _serve_running() -> bool:
    return serve.context._get_global_client(raise_if_no_controller_running=False) is not None
