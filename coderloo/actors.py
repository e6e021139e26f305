"""The actors of a training run or an evaluation, started and stopped in one place (`started`)."""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import ray
from tqdm import tqdm

from coderloo.config import Config
from coderloo.console import RunConsole
from coderloo.runtime import dashboard_url, init_ray, metrics_endpoint
from common.cpus import pin_process, pin_threads
from learner.critic import OnlineCritic
from learner.group import LearnerGroup
from reward_service.client import RewardClient
from rollout_workers import RolloutGroup, start_workers
from rollout_workers.strategies import RolloutStrategy, SingleAttempt, make_strategy


@dataclass
class Actors:
    """What `started` started: the reward service's client, the learner (a training run's), the
    rollout workers, their group and the strategy that drives them (with the interpreter, also a
    single-attempt strategy on the same policy; with refinement that the critic chooses, also one
    that chooses at random), and the critic (a training run's, when enabled)."""

    rewards: RewardClient | None = None
    learner: LearnerGroup | None = None
    workers: list = field(default_factory=list)
    group: RolloutGroup | None = None
    strategy: RolloutStrategy | None = None
    single: RolloutStrategy | None = None
    random_choice: RolloutStrategy | None = None
    critic: OnlineCritic | None = None

    def stop(self) -> None:
        """Stop whatever was started (all of it, or what started before a failure)."""
        if self.learner is not None:
            self.learner.kill()
        if self.critic is not None:
            self.critic.kill()
        for actor in self.workers:
            ray.kill(actor)
        if self.rewards is not None:
            self.rewards.close()


@contextmanager
def started(config: Config, model: str, tokenizer, console: RunConsole, run: str | None = None,
            lora_rank: int | None = None, adapter: str | None = None) -> Iterator[Actors]:
    """Ray (joined, or started here and stopped at the end), the reward service, for a training run
    named `run` its learner, the rollout workers (reserving room for LoRA adapters of `lora_rank`;
    serving the PEFT adapter in directory `adapter` when given), their group and strategies, and
    for a training run the critic, connected to the learner's weights. On the way out, what
    started stops in that order, also after an error part-way, then Ray if it started here; the
    console shows no more of the actors' dying lines."""
    actors, starts_ray, before = Actors(), not ray.is_initialized(), None
    try:
        init_ray(address=config.ray_address, metrics_export_port=config.metrics_export_port if run else None,
                 dashboard=config.dashboard)
        console.attach_ray()
        if run:
            dashboard = dashboard_url()
            seen = f"Ray dashboard at {dashboard}; " if dashboard else ""
            tqdm.write(f"run {run}: {seen}Ray metrics (Prometheus) at {metrics_endpoint()}; logs in {console.directory}")
        else:
            print(f"logs in {console.directory}", file=sys.stderr)
        # The engines, the critic, Serve's deployment and the learner's set-up each wait mostly on
        # their own processes: started side by side, start-up takes about the longest of them, not
        # their sum (the actors are created at once; Serve deploys in a thread while the learner sets up).
        actors.workers = start_workers(model, config.rollout, config.learner.seed, run=run, lora_rank=lora_rank)
        if run and config.critic.enabled:
            actors.critic = OnlineCritic(model, config.critic, config.train.seed, name=f"coderloo-critic-{run}")
        with ThreadPoolExecutor(1, thread_name_prefix="serve-start") as pool:
            rewards = pool.submit(RewardClient, config.reward)
            try:
                if run:
                    actors.learner = LearnerGroup(model, config.learner, sft_lr=config.sft.lr, name=run)
            finally:
                actors.rewards = rewards.result()  # started, also when the learner failed: stopped below
        console.quiet_loggers()  # Serve's, set up as it started
        if adapter:
            ray.get([w.load_adapter.remote(adapter) for w in actors.workers])
        actors.group = RolloutGroup(actors.workers, config.rollout.weight_sync, config.rollout.stuck_timeout_s, config.rollout.update_in_flight,
                                    side_by_side=config.train.partial_rollouts)
        score = actors.critic.log_odds if actors.critic is not None else None
        actors.strategy = make_strategy(actors.group, actors.rewards, config.env, tokenizer, config.prompt, score)
        if config.env.multi_turn and not config.env.turns_are_attempts:  # refinement's round 1 is its single attempt
            actors.single = SingleAttempt(actors.group, actors.rewards, tokenizer, config.prompt)
        if config.env.choose == "critic":
            random_choice = config.env.model_copy(update={"choose": "random"})
            actors.random_choice = make_strategy(actors.group, actors.rewards, random_choice, tokenizer, config.prompt)
        if actors.learner is not None:
            actors.group.connect(actors.learner.weight_sources)
        # After Ray's own processes started (they would inherit the set), and given back at the end.
        before = os.sched_getaffinity(0)
        pin_process(config.train.driver_cpus, "train.driver_cpus")
        yield actors
    finally:
        if before is not None:
            pin_threads(before)
        console.ending()
        actors.stop()
        if starts_ray:  # whoever starts Ray stops it; inside the console, so its last notices go to the log
            ray.shutdown()
