"""One RL step's rollouts in the background: generation, and scoring as each group finishes.

`RolloutJob` runs in a thread of the controller. It streams each prompt's k samples from the
rollout workers as soon as they are finished and sends that group to the reward service at once,
so scoring overlaps generation; the controller meanwhile trains on an earlier step. Workers and
reward replicas that die are survived: a worker's unfinished prompts are generated again (on the
restarted worker, with the same seed) and a failed reward request is sent again; a prompt group
counts once, when its rollout arrives whole. With refinement, the samples that failed are then
rewritten from their execution feedback, round by round (coderloo/refine.py), in the same thread.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import ray

from coderloo.refine import RefineConfig, Round, pass_rates_by_round, refine
from coderloo.tasksets.task import Task
from reward_service.client import RewardClient
from reward_service.schemas import ItemReward
from rollout_workers import GenerationParams, PromptRollout, RolloutGroup
from rollout_workers.worker import StaleWeightsError


@dataclass
class StepRollouts:
    step: int
    tasks: list[Task]
    rollouts: list[PromptRollout | None] = field(default_factory=list)
    rewards: list[list[ItemReward] | None] = field(default_factory=list)
    started: float = 0.0
    generated: float = 0.0  # when the last group arrived
    scored: float = 0.0  # when the last reward arrived
    retries: int = 0  # chunks generated again after a worker died
    # with refinement: each sample's later attempts (task-major, k per task), and when the last was scored
    later: list[list[Round]] = field(default_factory=list)
    refined: float = 0.0

    def token_rewards(self) -> list[list[float]]:
        """Each sample's per-token rewards, in order; one missing or of the wrong length raises, naming it."""
        out = []
        for task, rollout, rewards in zip(self.tasks, self.rollouts, self.rewards, strict=True):
            for j, (sample, reward) in enumerate(zip(rollout.samples, rewards, strict=True)):
                if reward.token_rewards is None or len(reward.token_rewards) != len(sample.token_ids):
                    got = "no" if reward.token_rewards is None else len(reward.token_rewards)
                    raise ValueError(
                        f"RL step {self.step}, task {task.id!r}, sample {j}: the reward service gave {got} "
                        f"token rewards for {len(sample.token_ids)} completion tokens"
                    )
                out.append(reward.token_rewards)
        return out

    def first_rewards(self) -> list[ItemReward]:
        """Each sample's reward, task-major (with refinement: each trajectory's first attempt's)."""
        return [reward for group in self.rewards for reward in group]

    def final_rewards(self) -> list[ItemReward]:
        """Each trajectory's outcome, task-major: its last attempt's reward (without refinement, the sample's)."""
        first = self.first_rewards()
        if not self.later:
            return first
        return [attempts[-1].reward if attempts else f for f, attempts in zip(first, self.later, strict=True)]

    def pass_rates_by_round(self, rounds: int) -> list[float]:
        """Share of the step's trajectories passed within 1..`rounds` attempts."""
        return pass_rates_by_round(self.first_rewards(), self.later, rounds)


class RolloutJob:
    def __init__(self, step: int, tasks: list[Task], rollouts_group: RolloutGroup, rewards: RewardClient,
                 params: GenerationParams, seed: int, refine: RefineConfig | None = None):
        self.result = StepRollouts(step, tasks, [None] * len(tasks), [None] * len(tasks))
        self.group, self.rewards, self.params, self.seed = rollouts_group, rewards, params, seed
        self.refine = refine  # None: one attempt per sample
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"rollouts-step-{step}", daemon=True)
        self.thread.start()

    def wait(self) -> StepRollouts:
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.result

    def _run(self) -> None:
        try:
            self.result.started = time.time()
            self.responses: dict[int, object] = {}
            todo = list(range(len(self.result.tasks)))
            while todo:
                prompts = [self.result.tasks[i].prompt for i in todo]
                consumers = [
                    threading.Thread(target=self._consume, args=(todo[offset:], generator), daemon=True)
                    for offset, generator in self.group.stream(prompts, self.params, self._redo_seed(self.seed))
                ]
                for c in consumers:
                    c.start()
                for c in consumers:
                    c.join()
                if self.error is not None:
                    raise self.error
                todo = [i for i in todo if self.result.rollouts[i] is None]
                if todo:  # a worker died: wait for it to come back with the current weights
                    self.result.retries += 1
                    self.group.recover()
            self.result.generated = time.time()
            for index, pending in self.responses.items():
                self.result.rewards[index] = self.rewards.collect(pending)
            self.result.scored = time.time()
            if self.refine is not None:
                r = self.result
                tasks = [task for task, rollout in zip(r.tasks, r.rollouts) for _ in rollout.samples]
                completions = [s.text for rollout in r.rollouts for s in rollout.samples]
                r.later = refine(self._generate, self.rewards, tasks, completions, r.first_rewards(), self.refine, self.params, self.seed)
                r.refined = time.time()
        except BaseException as e:  # surfaced to the controller by wait()
            self.error = e

    def _generate(self, prompts: list[str], params: GenerationParams, seed: int | None):
        """A refinement round's generation; a worker that died meanwhile is waited for and the
        round generated again (other samples: the seed moves on, as for a redo of the first round)."""
        while True:
            try:
                return self.group.generate(prompts, params, None if seed is None else self._redo_seed(seed))
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as e:
                if isinstance(e, ray.exceptions.RayTaskError) and not isinstance(e.cause, StaleWeightsError):
                    raise
                self.result.retries += 1
                self.group.recover()

    def _redo_seed(self, seed: int) -> int:
        """A redo after a worker died draws other samples than the lost ones, reproducibly."""
        return seed + 7919 * self.result.retries

    def _consume(self, indices: list[int], generator) -> None:
        """Take one worker's groups as they finish and send each to the reward service."""
        try:
            for ref in generator:
                local, rollout = ray.get(ref)
                index = indices[local]
                task = self.result.tasks[index]
                token_ids = [s.token_ids for s in rollout.samples] if self.rewards.per_token else None
                self.responses[index] = self.rewards.submit([task] * len(rollout.samples), [s.text for s in rollout.samples], token_ids)
                self.result.rollouts[index] = rollout
        except ray.exceptions.RayActorError:
            pass  # the worker died: what did not arrive is generated again
        except ray.exceptions.RayTaskError as e:
            if not isinstance(e.cause, StaleWeightsError):
                self.error = e
            # else Ray restarted the worker (initial weights): recover() brings it back first.
        except BaseException as e:
            self.error = e
