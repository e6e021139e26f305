"""Partial rollouts (train.partial_rollouts): groups generate across steps, and a step trains on the
first ones scored.

A pool of groups is in flight (launched, or finished and not yet taken). Each step takes `n` groups
that finished scoring, in the order they finished; the others go on generating, and with in-flight
updates (rollout.update_in_flight) their later tokens carry the versions pushed meanwhile, so a
slow group costs a later step nothing to wait for, up to the bound: a step trains no group whose
oldest token is more than `max_staleness` versions behind its weights. So a group at the bound
(it would be over it at the next step) is taken first, and a step waits for one still being made;
a group over the bound (more than `n` reached it at once) is dropped and counted, never trained.
What a checkpoint keeps is the tasks of the groups not taken yet (`unfinished`): `--resume`
generates exactly those again first.
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
    """`launch(tasks, step, version, run)` starts `run(done)` in a thread of its own, where `run`
    is a strategy's run for `tasks` calling `done(index, group, scoring_s)` as each group is scored
    (the rollout strategies of rollout_workers/strategies.py)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running: dict[int, tuple[Task, int]] = {}  # key -> task and version at launch, of a group not scored
        self._finished: list[tuple[int, Task, Finished]] = []  # scored, in the order they finished
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []
        self._next_key = 0
        self.dropped = 0  # groups dropped for staleness over the run

    def holds(self) -> int:
        """Groups in flight: launched and not taken (nor dropped)."""
        with self._changed:
            return len(self._running) + len(self._finished)

    def launch(self, tasks: list[Task], step: int, version: int, run: Callable[[Callable], object]) -> None:
        """`version`: the weights' version now (a group's first tokens are of it or newer)."""
        with self._changed:
            keys = list(range(self._next_key, self._next_key + len(tasks)))
            self._next_key += len(tasks)
            self._running.update((key, (task, version)) for key, task in zip(keys, tasks, strict=True))

        def done(index: int, group: list[Trajectory], scoring_s: float) -> None:
            with self._changed:
                task, _ = self._running.pop(keys[index])
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
        """`n` groups scored, whose oldest tokens are at most `max_staleness` versions behind
        `version`: those at the bound first (waiting for any still being made), then the first
        scored; and the groups dropped on the way for being over it (`refill()` after each: it may
        launch one in its place). Raises what a launch raised."""
        bound = version - max_staleness
        dropped = []
        with self._changed:
            while True:
                if self._errors:
                    raise self._errors[0]
                for entry in [e for e in self._finished if e[2].oldest_version() < bound]:
                    self._finished.remove(entry)
                    dropped.append(entry[2])
                    refill()  # the lock is reentrant: a launch from here is one
                due = [e for e in self._finished if e[2].oldest_version() == bound]
                coming = any(v <= bound for _, v in self._running.values())
                if len(due) >= n or (not coming and len(self._finished) >= n):
                    chosen = (due + [e for e in self._finished if e[2].oldest_version() > bound])[:n]
                    for entry in chosen:
                        self._finished.remove(entry)
                    self.dropped += len(dropped)
                    return [f for _, _, f in chosen], dropped
                if not self._running:
                    raise RuntimeError(f"the pool holds {len(self._finished)} groups to take, and none coming ({n} wanted)")
                self._changed.wait()

    def unfinished(self) -> list[Task]:
        """The tasks of the groups not taken yet, in the order they were launched."""
        with self._changed:
            keyed = [(key, task) for key, (task, _) in self._running.items()] + [(key, task) for key, task, _ in self._finished]
        return [task for _, task in sorted(keyed, key=lambda kt: kt[0])]

    def drain(self) -> None:
        """Wait for every launch to end (at the run's end: the engines are then free)."""
        for thread in self._threads:
            thread.join()
