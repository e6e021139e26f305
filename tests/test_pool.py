"""Partial rollouts' pool (coderloo/pool.py), on groups a test hands over in an order it chooses:
which groups a step takes, which it drops for staleness, what a checkpoint keeps of the rest."""
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
    """A launch whose groups are scored when the test says: `score(index, version)`."""

    def __init__(self, pool: GroupPool, tasks: list[Task], step: int):
        self.tasks, self.ready, self.done = tasks, threading.Event(), None
        self.finish = threading.Event()
        pool.launch(tasks, step, self.run)
        self.ready.wait(5)

    def run(self, done):
        self.done = done
        self.ready.set()
        self.finish.wait(5)

    def score(self, index: int, version: int) -> None:
        self.done(index, group_of(self.tasks[index], version), 0.1)


def ids(finished) -> list[str]:
    return [f.group[0].task.id for f in finished]


def test_a_step_takes_the_first_groups_scored_and_the_rest_stay_in_flight():
    pool = GroupPool()
    first = Launch(pool, [task(i) for i in range(4)], step=1)
    for i in (2, 0):
        first.score(i, version=0)
    taken, dropped = pool.take(2, version=0, max_staleness=1, refill=lambda: None)
    assert ids(taken) == ["t2", "t0"] and dropped == []  # in the order they were scored
    assert [t.id for t in pool.unfinished()] == ["t1", "t3"] and pool.holds() == 2
    second = Launch(pool, [task(i) for i in range(4, 6)], step=2)
    second.score(1, version=1)
    first.score(3, version=0)  # launched at step 1, generated across the push
    taken, _ = pool.take(2, version=1, max_staleness=1, refill=lambda: None)
    assert ids(taken) == ["t5", "t3"] and [f.launched for f in taken] == [2, 1]
    assert [t.id for t in pool.unfinished()] == ["t1", "t4"]  # in launch order: what --resume reissues
    first.finish.set()
    second.finish.set()


def test_a_group_older_than_max_staleness_is_dropped_counted_and_replaced():
    pool = GroupPool()
    launch = Launch(pool, [task(i) for i in range(3)], step=1)
    launch.score(0, version=0)  # its oldest token is 2 versions behind: too old at max_staleness 1
    launch.score(1, version=1)
    refills = []
    taken, dropped = pool.take(1, version=2, max_staleness=1, refill=lambda: refills.append(1))
    assert ids(taken) == ["t1"] and ids(dropped) == ["t0"] and pool.dropped == 1 and refills == [1]
    assert [t.id for t in pool.unfinished()] == ["t2"]  # a dropped group is not reissued either
    launch.finish.set()


def test_take_waits_for_a_group_and_raises_what_a_launch_raised():
    pool = GroupPool()
    launch = Launch(pool, [task(0)], step=1)
    threading.Timer(0.2, launch.score, args=(0, 0)).start()
    assert ids(pool.take(1, 0, 0, lambda: None)[0]) == ["t0"]  # waited for
    launch.finish.set()

    def fails(done):
        raise RuntimeError("reward service: no answer")

    pool.launch([task(1)], 2, fails)
    with pytest.raises(RuntimeError, match="no answer"):
        pool.take(1, 0, 0, lambda: None)


def test_a_pool_with_nothing_in_flight_says_so_rather_than_waiting():
    with pytest.raises(RuntimeError, match="holds no group"):
        GroupPool().take(1, 0, 0, lambda: None)


def test_reissue_gives_every_unfinished_task_of_the_checkpoint_once():
    tasks = [task(i) for i in range(6)]
    draw = TaskDraw(tasks, 2, CurriculumConfig(), random.Random(0))
    state = draw.state([[tasks[4], tasks[1]], [tasks[5]]])
    resumed = TaskDraw(tasks, 2, CurriculumConfig(), random.Random(1))
    resumed.load_state(state)
    assert [t.id for t in resumed.reissue()] == ["t4", "t1", "t5"]
    assert resumed.reissue() == []
