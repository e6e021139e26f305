"""Curriculum: prompts drawn by each task's running pass rate, difficulty levels unlocked by it.

A task's weight is p (1 - p) + floor, where p is an exponential moving average of the pass rate
of its sampled groups (unseen tasks start at `prior`): tasks the policy always or never solves
teach an RLOO learner nothing (their groups are uniform), tasks in between teach the most. Level
d + 1 opens when the mean running pass rate of the open tasks at level d reaches `unlock_at`
(or when level d has no task).
"""
from __future__ import annotations

import random

from pydantic import Field

from common.config import Section
from reward_service.tasks import Task


class CurriculumConfig(Section):
    enabled: bool = Field(default=False, description="Draw prompts by running pass rate (off: shuffled passes over the train set).")
    ema: float = Field(default=0.5, gt=0, le=1, description="Weight of a task's newest group in its running pass rate.")
    prior: float = Field(default=0.5, ge=0, le=1, description="Running pass rate of a task not sampled yet.")
    floor: float = Field(default=0.02, ge=0, description="Added to every weight, so that no open task is never drawn.")
    start_level: int = Field(default=1, ge=1, le=5, description="Highest difficulty open at the start.")
    unlock_at: float = Field(default=0.6, ge=0, le=1, description="Mean running pass rate of a level that opens the next one.")


class Curriculum:
    def __init__(self, tasks: list[Task], config: CurriculumConfig, rng: random.Random):
        self.tasks = {t.id: t for t in tasks}
        self.config = config
        self.rng = rng
        self.rate: dict[str, float] = {}
        self.level = config.start_level
        self._open_levels()

    def _open_levels(self) -> None:
        levels = sorted({t.difficulty for t in self.tasks.values()})
        while self.level < max(levels):
            current = [t for t in self.tasks.values() if t.difficulty == self.level]
            if current and self.mean_rate(self.level) < self.config.unlock_at:
                break
            self.level += 1

    def mean_rate(self, level: int) -> float:
        rates = [self.rate.get(t.id, self.config.prior) for t in self.tasks.values() if t.difficulty == level]
        return sum(rates) / len(rates) if rates else 0.0

    def weight(self, task: Task) -> float:
        p = self.rate.get(task.id, self.config.prior)
        return p * (1 - p) + self.config.floor

    def draw(self, n: int) -> list[Task]:
        """n distinct open tasks (fewer only if fewer are open), weighted without replacement."""
        pool = [t for t in self.tasks.values() if t.difficulty <= self.level]
        chosen = []
        weights = [self.weight(t) for t in pool]
        for _ in range(min(n, len(pool))):
            i = self.rng.choices(range(len(pool)), weights=weights)[0]
            chosen.append(pool.pop(i))
            weights.pop(i)
        return chosen

    def update(self, task_id: str, pass_rate: float) -> None:
        old = self.rate.get(task_id, self.config.prior)
        self.rate[task_id] = (1 - self.config.ema) * old + self.config.ema * pass_rate
        self._open_levels()

    def state(self) -> dict:
        return {"rate": dict(self.rate), "level": self.level}

    def load_state(self, state: dict) -> None:
        self.rate = dict(state["rate"])
        self.level = state["level"]


class TaskDraw:
    """The tasks of each RL step: shuffled passes over the train set, or the curriculum's draw,
    after the tasks of steps that were in flight at a checkpoint (redone on resume first)."""

    def __init__(self, tasks: list[Task], n: int, config: CurriculumConfig, rng: random.Random):
        self.by_id = {t.id: t for t in tasks}
        self.tasks, self.n, self.rng = tasks, n, rng
        # Its running pass rates and level are kept (and logged) even when it does not draw.
        self.curriculum, self.enabled = Curriculum(tasks, config, rng), config.enabled
        self.order: list[Task] = []
        self.pending: list[list[str]] = []

    def draw(self, n: int | None = None) -> list[Task]:
        """A step's tasks, or `n` more (a refill round)."""
        if self.pending and n is None:
            # a step's tasks from a pipelined run's checkpoint; a partial-rollout pool's unfinished
            # groups (one list of any length) are dealt into steps, the last one topped up
            tasks = [self.by_id[i] for i in self.pending[0][: self.n]]
            self.pending[0] = self.pending[0][self.n :]
            if not self.pending[0]:
                self.pending.pop(0)
            return tasks + (self.draw(self.n - len(tasks)) if len(tasks) < self.n else [])
        n = self.n if n is None else n
        if self.enabled:
            return self.curriculum.draw(n)
        while len(self.order) < n:
            self.order += self.rng.sample(self.tasks, len(self.tasks))
        tasks, self.order = self.order[:n], self.order[n:]
        return tasks

    def reissue(self) -> list[Task]:
        """The tasks of everything that was in flight at the checkpoint resumed from, at once (partial
        rollouts: coderloo/pool.py), then none."""
        tasks = [self.by_id[i] for ids in self.pending for i in ids]
        self.pending = []
        return tasks

    def update(self, task_id: str, pass_rate: float) -> None:
        self.curriculum.update(task_id, pass_rate)

    def state(self, in_flight: list[list[Task]]) -> dict:
        return {"order": [t.id for t in self.order], "rng_state": self.rng.getstate(),
                "curriculum": self.curriculum.state(),
                "in_flight": [[t.id for t in tasks] for tasks in in_flight]}

    def load_state(self, state: dict) -> None:
        self.order = [self.by_id[i] for i in state["order"]]
        self.rng.setstate(_to_tuple(state["rng_state"]))
        self.curriculum.load_state(state["curriculum"])
        self.pending = state["in_flight"]


def _to_tuple(value):
    """JSON turned random.getstate()'s tuples into lists; setstate needs them back."""
    return tuple(_to_tuple(v) for v in value) if isinstance(value, list) else value
