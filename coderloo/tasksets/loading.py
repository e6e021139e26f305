"""Choosing the train and evaluation tasks a config names."""
from __future__ import annotations

from coderloo.tasksets.benchmarks import load_task_set
from coderloo.tasksets.competitive import ColumnMapping
from coderloo.tasksets.synthetic import synthetic_suite
from reward_service.tasks import Task


def _load(name: str, path: str | None, split: str, synthetic_kinds: list[str], columns: ColumnMapping | None) -> list[Task]:
    if name == "synthetic":
        by_split = synthetic_suite(kinds=synthetic_kinds)
    else:
        by_split = {}
        for task in load_task_set(name, path, columns):
            by_split.setdefault(task.split, []).append(task)
    tasks = by_split.get(split, [])
    if not tasks:
        raise ValueError(f"task set {name!r} has no tasks in split {split!r}; its splits: {', '.join(sorted(by_split))}")
    return tasks


def load_tasks(config) -> tuple[list[Task], list[Task]]:
    """(train tasks, evaluation tasks) for a coderloo.config.TasksConfig."""
    train = _load(config.train_set, config.train_path, config.train_split, config.synthetic_kinds, config.columns)
    evaluation = _load(config.eval_set, config.eval_path, config.eval_split, config.synthetic_kinds, config.columns)
    if config.max_eval_tasks:
        evaluation = evaluation[: config.max_eval_tasks]
    overlap = {t.id for t in train} & {t.id for t in evaluation}
    if overlap:
        raise ValueError(f"{len(overlap)} tasks are in both the train and the evaluation set, e.g. {sorted(overlap)[:3]}")
    return train, evaluation
