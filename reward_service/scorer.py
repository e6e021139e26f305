"""Turning completions into rewards: extract the program, check syntax, run the tests in the pool."""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import ray

from coderloo.tasksets.task import Task
from reward_service.extract import extract_code
from sandbox_pool import ExecutionRequest, ExecutionResult, Limits, SandboxPool, Status


class SandboxInfraError(RuntimeError):
    """The sandbox itself failed (not the program under test)."""


@dataclass
class Reward:
    total: float
    syntax: float  # 1.0 when the program compiles
    functionality: float  # fraction of the tests passed
    passed: bool  # every test passed
    status: Status


def compiles(program: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a model's odd literals are not the trainer's warnings
            compile(program, "<completion>", "exec")  # parses and compiles; executes nothing
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


class RewardScorer:
    def __init__(self, pool: SandboxPool, limits: Limits, syntax_weight: float, functionality_weight: float):
        self.pool = pool
        self.limits = limits
        self.syntax_weight = syntax_weight
        self.functionality_weight = functionality_weight

    def submit(self, tasks: list[Task], completions: list[str]) -> list[ray.ObjectRef]:
        """Start executing each (task, completion) pair; returns one future per pair.

        Identical programs of one task run once: a sharpening policy repeats itself often.
        """
        unique: dict[tuple[str, str], int] = {}
        requests, index = [], []
        for task, text in zip(tasks, completions, strict=True):
            program = task.program(extract_code(text, task.prompt_is_code))
            key = (task.id, program)
            if key not in unique:
                unique[key] = len(requests)
                requests.append(
                    ExecutionRequest(program=program, tests=task.tests, test_setup=task.test_setup, limits=self.limits)
                )
            index.append(unique[key])
        refs = self.pool.submit(requests)
        return [refs[i] for i in index]

    def reward(self, task: Task, completion: str, result: ExecutionResult) -> Reward:
        syntax = 1.0 if compiles(task.program(extract_code(completion, task.prompt_is_code))) else 0.0
        functionality = result.fraction_passed
        total = self.syntax_weight * syntax + self.functionality_weight * functionality
        return Reward(total, syntax, functionality, result.status == Status.passed, result.status)

    def score(self, tasks: list[Task], completions: list[str]) -> list[Reward]:
        """Rewards of each pair. A sandbox failure is retried once, then raised: scoring a broken
        sandbox's results as failed programs would silently train the policy on noise."""
        results = ray.get(self.submit(tasks, completions))
        broken = [i for i, r in enumerate(results) if r.status == Status.infra_error]
        if broken:
            retried = ray.get(self.submit([tasks[i] for i in broken], [completions[i] for i in broken]))
            for i, result in zip(broken, retried):
                results[i] = result
            still = [i for i in broken if results[i].status == Status.infra_error]
            if still:
                raise SandboxInfraError(
                    f"{len(still)} of {len(results)} programs hit a sandbox failure twice; "
                    f"first: task {tasks[still[0]].id}: {results[still[0]].detail}"
                )
        return [self.reward(t, c, r) for t, c, r in zip(tasks, completions, results)]
