"""Curriculum and temperature schedule: pure logic."""
import random

import pytest

from coderloo.curriculum import Curriculum, CurriculumConfig
from reward_service.tasks import Task
from rollout_workers.config import RolloutConfig


def task(name: str, difficulty: int) -> Task:
    return Task(id=name, prompt="p", tests=["assert True"], entry_point="f", reference="", difficulty=difficulty, source="t", prompt_is_code=True)


TASKS = [task(f"easy{i}", 1) for i in range(4)] + [task(f"hard{i}", 2) for i in range(4)]


def test_levels_open_as_pass_rates_rise():
    c = Curriculum(TASKS, CurriculumConfig(enabled=True, unlock_at=0.6, ema=1.0), random.Random(0))
    assert c.level == 1
    assert {t.difficulty for t in c.draw(8)} == {1} and len(c.draw(8)) == 4  # only the open level
    for i in range(4):
        c.update(f"easy{i}", 0.75)
    assert c.level == 2
    assert len(c.draw(8)) == 8


def test_draws_favour_tasks_neither_always_nor_never_solved():
    c = Curriculum(TASKS[:4], CurriculumConfig(enabled=True, ema=1.0, floor=0.01), random.Random(0))
    for name, rate in (("easy0", 0.0), ("easy1", 1.0), ("easy2", 0.5), ("easy3", 1.0)):
        c.update(name, rate)
    counts = {t.id: 0 for t in TASKS[:4]}
    for _ in range(2000):
        counts[c.draw(1)[0].id] += 1
    assert counts["easy2"] > 0.8 * 2000  # weight 0.26 against 0.01 for each of the others
    assert counts["easy0"] > 0  # the floor keeps every open task drawable


def test_state_round_trips():
    c = Curriculum(TASKS, CurriculumConfig(enabled=True, ema=0.5), random.Random(0))
    c.update("easy1", 1.0)
    d = Curriculum(TASKS, CurriculumConfig(enabled=True, ema=0.5), random.Random(0))
    d.load_state(c.state())
    assert d.rate == {"easy1": 0.75} and d.level == c.level


def test_temperature_schedule():
    s = RolloutConfig(temperature=1.0, temperature_schedule=[(10, 0.9), (110, 0.1)]).temperature_at
    assert s(10) == pytest.approx(0.9) and s(60) == pytest.approx(0.5) and s(500) == pytest.approx(0.1)
    assert s(1) == pytest.approx(0.9)  # before the first point: its temperature
    assert RolloutConfig(temperature=0.7).temperature_at(10) == 0.7


def test_group_replay_samples_by_priority_and_forgets_the_oldest():
    from learner.batch import TrainSequence
    from learner.replay import GroupReplay

    def group(a):
        return [TrainSequence([1], [2], [0.0], [a]), TrainSequence([1], [3], [0.0], [-a])]

    replay = GroupReplay(groups_per_step=1, capacity=2)
    assert replay.reuse([group(5.0), group(1e-4)]) == []  # nothing stored yet
    picks = [replay.reuse([])[0].advantages[0] for _ in range(200)]
    assert picks.count(5.0) > 150  # priority 5 against 1e-4
    replay.reuse([group(2.0)])  # capacity 2: the first group is overwritten
    assert sorted(replay.store) == [1, 2]
