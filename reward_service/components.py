"""Reward components a domain plugs in (`reward.components`): next to syntax, tests, lint and
performance, a user's own signal (the dense-reward design's data-flow match with a reference, a
simulator's verdict), named by an import path and weighed into the total.

A component is a callable `component(item: Scored, **options)` that returns a score in [0, 1], a
`Score` (the score and the spans of the program that cost it the rest, which dense rewards and
PPO put on the tokens that wrote them), or None where it has nothing to say of the item (its
weight then adds nothing). It runs in the reward service's replica, after the sandbox, with a time
limit, once per distinct completion of a task. It runs outside the sandbox: it reads the program,
it never runs it. One that raises, answers late or returns something else is an infrastructure
error naming it: the request fails (HTTP 503, the trainer's run stops) rather than scoring the
program 0, which the policy would learn from.
"""
from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, field_validator

from common.config import Section
from reward_service.schemas import Diagnostic
from reward_service.tasks import Task
from sandbox_pool import ExecutionResult

BUILT_IN = ("syntax", "functionality", "lint", "performance", "coverage")


class ComponentError(RuntimeError):
    """A reward component failed (raised, answered late, or returned no score): not the program's doing."""


@dataclass(frozen=True)
class Scored:
    """What a component sees of one item."""

    task: Task  # its prompt, reference, tests and metadata
    completion: str  # the policy's answer as it wrote it
    code: str  # the code extracted from it
    program: str  # the program that ran (with a code prompt: the prompt and the code)
    result: ExecutionResult  # how the run ended, test by test


@dataclass(frozen=True)
class Score:
    value: float
    # spans of `program` (rows and columns 1-based, end exclusive; Diagnostic's `code` is free) that
    # cost the item the rest of its score
    blame: list[Diagnostic] = field(default_factory=list)


class ComponentSpec(Section):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="The component's name: its key in each reward's "
                      "components.domain, and its step metric component_<name>_mean.")
    path: str = Field(description="The callable, as module:attribute (importable where the reward service runs).")
    weight: float = Field(gt=0, description="Its weight in the total: the total adds weight x score.")
    timeout_s: float = Field(default=10.0, gt=0, description="The most seconds one call may take; a later answer "
                             "fails the request naming the component.")
    options: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of each call.")

    @field_validator("name")
    @classmethod
    def _not_built_in(cls, name: str) -> str:
        if name in BUILT_IN:
            raise ValueError(f"{name!r} is a built-in component (reward.weights.{name})")
        return name

    @field_validator("path")
    @classmethod
    def _callable(cls, path: str) -> str:
        resolve(path)
        return path


def resolve(path: str) -> Callable:
    """The callable at `path` (module:attribute); a clear error when there is none."""
    module, sep, attribute = path.partition(":")
    if not sep or not re.fullmatch(r"[\w.]+", module) or not re.fullmatch(r"[\w.]+", attribute):
        raise ValueError(f"{path!r} is not module:attribute")
    try:
        target = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"cannot import {module!r}: {e}") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"{module!r} has no {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{path} is not callable")
    return target


class PluggedComponents:
    """The configured components of one scorer, each call in a thread with its time limit."""

    def __init__(self, specs: list[ComponentSpec]):
        self.specs = specs
        self.functions = [resolve(s.path) for s in specs]
        # A call that hangs keeps its thread: the pool grows no further than this, and the next calls
        # then time out too (each naming the component) instead of piling up threads.
        self.threads = ThreadPoolExecutor(max_workers=8, thread_name_prefix="reward-component") if specs else None

    def score(self, items: list[Scored]) -> list[dict[str, Score | None]]:
        """Each item's score by every component (None where a component said nothing of it)."""
        if not self.specs:
            return [{} for _ in items]
        unique = {(item.task.id, item.completion): item for item in items}  # a sharpening policy repeats itself
        calls = {key: [self.threads.submit(f, item, **s.options) for s, f in zip(self.specs, self.functions)]
                 for key, item in unique.items()}
        answers = {key: {s.name: self._answer(s, future, unique[key]) for s, future in zip(self.specs, row)}
                   for key, row in calls.items()}
        return [answers[(item.task.id, item.completion)] for item in items]

    @staticmethod
    def _answer(spec: ComponentSpec, future, item: Scored) -> Score | None:
        where = f"reward component {spec.name!r} ({spec.path}) on task {item.task.id}"
        try:
            answer = future.result(timeout=spec.timeout_s)
        except FutureTimeout:
            raise ComponentError(f"{where} did not answer within {spec.timeout_s:g} s") from None
        except Exception as e:
            raise ComponentError(f"{where} raised {type(e).__name__}: {e}") from e
        if answer is None:
            return None
        score = answer if isinstance(answer, Score) else Score(answer) if isinstance(answer, (int, float)) and not isinstance(answer, bool) else None
        if score is None:
            raise ComponentError(f"{where} returned {type(answer).__name__}, not a score (a number in [0, 1], a Score or None)")
        if not (isinstance(score.value, (int, float)) and math.isfinite(score.value) and 0.0 <= score.value <= 1.0):
            raise ComponentError(f"{where} returned the score {score.value!r}, not a number in [0, 1]")
        if not all(isinstance(d, Diagnostic) for d in score.blame):
            raise ComponentError(f"{where} blamed something other than Diagnostic spans")
        return Score(float(score.value), list(score.blame))
