"""Partial rollouts (train.partial_rollouts): groups generate across steps, and a step trains on the
first ones scored.

A pool of groups is in flight (launched, or finished and not yet taken). Each step takes the first
`n` groups that finished scoring, in the order they finished; the others go on generating, and
with in-flight updates (rollout.update_in_flight) their later tokens carry the versions pushed
meanwhile, so a slow group costs a later step nothing to wait for. A group whose oldest token is
more than `max_staleness` versions behind the weights the step trains is dropped and counted, never
trained (AReaL's and verl's bound). What a checkpoint keeps is the tasks of the groups not taken yet
(`unfinished`): `--resume` generates exactly those again first.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from reward_service.tasks import Task
from rollout_workers.types import Trajectory


@dataclass
class Finished:
    """A group scored and waiting for a step: its k trajectories, the step that launched it, when
    it was scored and how long its scoring took after it was generated."""

    group: list[Trajectory]
    launched: int
    at: float
    scoring_s: float

    def oldest_version(self) -> int:
        return min(turn.policy_version for t in self.group for turn in t.turns)


class GroupPool:
    """`launch(tasks, step, run)` starts `run(done)` in a thread of its own, where `run` is a
    strategy's run for `tasks` calling `done(index, group, scoring_s)` as each group is scored
    (rollout_workers.strategies.SingleAttempt)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running: dict[int, Task] = {}  # key -> task of a group launched and not scored
        self._finished: list[tuple[int, Task, Finished]] = []  # scored, in the order they finished
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []
        self._next_key = 0
        self.dropped = 0  # groups dropped for staleness over the run

    def holds(self) -> int:
        """Groups in flight: launched and not taken (nor dropped)."""
        with self._changed:
            return len(self._running) + len(self._finished)

    def launch(self, tasks: list[Task], step: int, run: Callable[[Callable], object]) -> None:
        with self._changed:
            keys = list(range(self._next_key, self._next_key + len(tasks)))
            self._next_key += len(tasks)
            self._running.update(zip(keys, tasks, strict=True))

        def done(index: int, group: list[Trajectory], scoring_s: float) -> None:
            with self._changed:
                task = self._running.pop(keys[index])
                self._finished.append((keys[index], task, Finished(group, step, time.time(), scoring_s)))
                self._changed.notify_all()

        def target() -> None:
            try:
                run(done)
            except BaseException as e:  # surfaced by the next take
                with self._changed:
                    self._errors.append(e)
                    self._changed.notify_all()

        thread = threading.Thread(target=target, name=f"pool-step-{step}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def take(self, n: int, version: int, max_staleness: int, refill: Callable[[], None]) -> tuple[list[Finished], list[Finished]]:
        """The first `n` groups scored (waiting for them) whose oldest token is at most
        `max_staleness` versions behind `version`, and the groups dropped on the way for being
        older (`refill()` after each: it may launch one in its place). Raises what a launch raised."""
        taken, dropped = [], []
        with self._changed:
            while len(taken) < n:
                if self._errors:
                    raise self._errors[0]
                if not self._finished:
                    if not self._running:
                        raise RuntimeError(f"the pool holds no group to take ({len(taken)} of {n} taken)")
                    self._changed.wait()
                    continue
                _, _, group = self._finished.pop(0)
                if version - group.oldest_version() <= max_staleness:
                    taken.append(group)
                else:
                    dropped.append(group)
                    refill()  # the lock is reentrant: a launch from here is one
            self.dropped += len(dropped)
        return taken, dropped

    def unfinished(self) -> list[Task]:
        """The tasks of the groups not taken yet, in the order they were launched."""
        with self._changed:
            keyed = list(self._running.items()) + [(key, task) for key, task, _ in self._finished]
        return [task for _, task in sorted(keyed, key=lambda kt: kt[0])]

    def drain(self) -> None:
        """Wait for every launch to end (at the run's end: the engines are then free)."""
        for thread in self._threads:
            thread.join()
