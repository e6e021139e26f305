"""Turning completions into rewards: extract the program, check syntax, run the tests in the pool."""
from __future__ import annotations

from dataclasses import dataclass

import ray

from coderloo.tasksets.task import Task
from reward_service.extract import extract_code
from sandbox_pool import ExecutionRequest, ExecutionResult, Limits, SandboxPool, Status


@dataclass
class Reward:
    total: float
    syntax: float  # 1.0 when the program compiles
    functionality: float  # fraction of the tests passed
    passed: bool  # every test passed
    status: Status


def compiles(program: str) -> bool:
    try:
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
        """Start executing each (task, completion) pair; returns one future per pair."""
        requests = [
            ExecutionRequest(
                program=task.program(extract_code(text, task.prompt_is_code)),
                tests=task.tests,
                test_setup=task.test_setup,
                limits=self.limits,
            )
            for task, text in zip(tasks, completions, strict=True)
        ]
        return self.pool.submit(requests)

    def reward(self, task: Task, completion: str, result: ExecutionResult) -> Reward:
        syntax = 1.0 if compiles(task.program(extract_code(completion, task.prompt_is_code))) else 0.0
        functionality = result.fraction_passed
        total = self.syntax_weight * syntax + self.functionality_weight * functionality
        return Reward(total, syntax, functionality, result.status == Status.PASSED, result.status)

    def score(self, tasks: list[Task], completions: list[str]) -> list[Reward]:
        results = ray.get(self.submit(tasks, completions))
        return [self.reward(t, c, r) for t, c, r in zip(tasks, completions, results)]
