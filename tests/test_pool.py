"""Partial rollouts' pool (coderloo/pool.py), on groups a test hands over in an order it chooses:
which groups a step takes, which it waits for, which it drops for staleness, what a checkpoint
keeps of the rest."""
import random
import threading

import pytest

from coderloo.curriculum import CurriculumConfig, TaskDraw
from coderloo.pool import GroupPool
from reward_service.tasks import Task
from rollout_workers.types import Trajectory, Turn


def task(i: int) -> Task:
    return Task(id=f"t{i}", prompt="p", tests=["assert True"], entry_point="f", reference="", difficulty=1, source="t", prompt_is_code=True)


def group_of(t: Task, version: int) -> list[Trajectory]:
    return [Trajectory(t, [Turn([1], [2], [0.0], [True], version, "x")], None) for _ in range(2)]


class Launch:
    """A launch of tasks t<first>.. whose groups are scored when the test says: `score(i, version)`."""

    def __init__(self, pool: GroupPool, first: int, count: int, step: int, version: int):
        self.tasks, self.ready, self.done = [task(first + i) for i in range(count)], threading.Event(), None
        self.finish = threading.Event()
        pool.launch(self.tasks, step, version, self.run)
        self.ready.wait(5)

    def run(self, done):
        self.done = done
        self.ready.set()
        self.finish.wait(5)

    def score(self, index: int, version: int) -> None:
        self.done(index, group_of(self.tasks[index], version), 0.1)


def ids(finished) -> list[str]:
    return [f.group[0].task.id for f in finished]


def never():
    raise AssertionError("nothing was dropped: no refill")


def test_a_step_takes_the_first_groups_scored_and_the_rest_stay_in_flight():
    pool = GroupPool()
    first = Launch(pool, 0, 4, step=1, version=0)
    for i in (2, 0):
        first.score(i, version=0)
    taken, dropped = pool.take(2, version=0, max_staleness=2, refill=never)
    assert ids(taken) == ["t2", "t0"] and dropped == []  # in the order they were scored
    assert [t.id for t in pool.unfinished()] == ["t1", "t3"] and pool.holds() == 2
    second = Launch(pool, 4, 2, step=2, version=1)
    second.score(1, version=1)
    first.score(3, version=0)  # launched at step 1, generated across the push
    taken, _ = pool.take(2, version=1, max_staleness=2, refill=never)
    assert ids(taken) == ["t5", "t3"] and [f.launched for f in taken] == [2, 1]
    assert [t.id for t in pool.unfinished()] == ["t1", "t4"]  # in launch order: what --resume reissues
    first.finish.set()
    second.finish.set()


def test_a_step_waits_for_the_groups_at_the_bound_and_takes_them_first():
    pool = GroupPool()
    old = Launch(pool, 0, 2, step=1, version=0)
    new = Launch(pool, 2, 2, step=2, version=1)
    new.score(0, version=1)
    new.score(1, version=1)  # two scored, but t0 and t1 would be over the bound at the next step
    threading.Timer(0.2, old.score, args=(1, 0)).start()
    threading.Timer(0.4, old.score, args=(0, 0)).start()
    taken, dropped = pool.take(2, version=1, max_staleness=1, refill=never)
    assert ids(taken) == ["t1", "t0"] and dropped == []
    assert ids(pool.take(2, version=2, max_staleness=1, refill=never)[0]) == ["t2", "t3"]
    old.finish.set()
    new.finish.set()


def test_a_group_over_the_bound_is_dropped_counted_and_replaced():
    pool = GroupPool()
    launch = Launch(pool, 0, 3, step=1, version=0)
    launch.score(0, version=0)  # 2 versions behind at max_staleness 1: over the bound
    launch.score(1, version=1)
    refills = []
    taken, dropped = pool.take(1, version=2, max_staleness=1, refill=lambda: refills.append(1))
    assert ids(taken) == ["t1"] and ids(dropped) == ["t0"] and pool.dropped == 1 and refills == [1]
    assert [t.id for t in pool.unfinished()] == ["t2"]  # a dropped group is not reissued either
    launch.finish.set()


def test_take_raises_what_a_launch_raised_and_says_when_nothing_is_coming():
    pool = GroupPool()

    def fails(done):
        raise RuntimeError("reward service: no answer")

    pool.launch([task(1)], 1, 0, fails)
    with pytest.raises(RuntimeError, match="no answer"):
        pool.take(1, 0, 0, never)
    with pytest.raises(RuntimeError, match="none coming"):
        GroupPool().take(1, 0, 0, never)


def test_reissue_gives_every_unfinished_task_of_the_checkpoint_once():
    tasks = [task(i) for i in range(6)]
    draw = TaskDraw(tasks, 2, CurriculumConfig(), random.Random(0))
    state = draw.state([[tasks[4], tasks[1]], [tasks[5]]])
    resumed = TaskDraw(tasks, 2, CurriculumConfig(), random.Random(1))
    resumed.load_state(state)
    assert [t.id for t in resumed.reissue()] == ["t4", "t1", "t5"]
    assert resumed.reissue() == []


def test_a_pools_unfinished_groups_resumed_without_the_pool_are_dealt_into_whole_steps():
    tasks = [task(i) for i in range(12)]
    draw = TaskDraw(tasks, 4, CurriculumConfig(), random.Random(0))
    state = draw.state([tasks[:6]])  # a pool's 6 unfinished groups, steps of 4
    resumed = TaskDraw(tasks, 4, CurriculumConfig(), random.Random(0))
    resumed.load_state(state)
    first, second = resumed.draw(), resumed.draw()
    assert [t.id for t in first] == ["t0", "t1", "t2", "t3"]
    assert [t.id for t in second[:2]] == ["t4", "t5"] and len(second) == 4  # topped up by the draw
