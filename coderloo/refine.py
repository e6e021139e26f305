"""Multi-round refinement: a completion that failed is shown to the model again with what running
it said, and the model writes the code again, up to `rounds` attempts in all.

Each of a prompt's samples becomes a trajectory of attempts that ends when one passes. The
trajectory's last reward is its outcome: RLOO compares the k outcomes of a prompt, and every
attempt of a trajectory is trained with the trajectory's advantage (coderloo/controller.py).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from coderloo.tasksets.task import Task
from reward_service.client import RewardClient
from reward_service.extract import extract
from reward_service.schemas import ItemReward
from rollout_workers import GenerationParams, PromptRollout, Sample


class RefineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    enabled: bool = Field(
        default=False,
        description="Train and evaluate with refinement: a failed sample is rewritten from its execution "
        "feedback, up to `rounds` attempts; RLOO over each trajectory's final outcome.",
    )
    rounds: int = Field(default=3, ge=1, description="Most attempts per trajectory, the first included.")
    feedback_chars: int = Field(
        default=500, ge=1, description="Execution feedback shown to the model is cut to this many characters.")

    @model_validator(mode="after")
    def _rounds(self) -> "RefineConfig":
        if self.enabled and self.rounds < 2:
            raise ValueError(f"rounds={self.rounds}: refinement needs at least 2 (1 is no refinement; set enabled false)")
        return self


def feedback_prompt(task: Task, previous_completion: str, feedback: str, chars: int) -> str:
    """The next attempt's prompt: a comment block with the previous program and what running it
    said (cut to `chars`), then the task's own prompt, so that the model answers in the task's
    format (continuing the prompt's code, or writing the whole program) and the reward service
    scores the answer as a plain completion of `task`."""
    if chars < 1:
        raise ValueError(f"feedback chars must be at least 1, got {chars}")
    program = task.program(extract(previous_completion, task.prompt_is_code, task.entry_point).code)
    said = feedback[:chars] + (" [...]" if len(feedback) > chars else "")
    lines = (
        ["A previous attempt at the code below did not pass its tests:"] + program.rstrip("\n").splitlines()
        + ["What running it said:"] + (said.splitlines() or ["(no message)"])
        + ["Write it again, fixed."]
    )
    return "".join(f"# {line}".rstrip() + "\n" for line in lines) + "\n" + task.prompt


@dataclass
class Round:
    """A later attempt of a trajectory: its prompt's token ids, the completion, and its reward."""

    prompt_ids: list[int]
    sample: Sample
    reward: ItemReward


Generate = Callable[[list[str], GenerationParams, int | None], list[PromptRollout]]


def refine(
    generate: Generate, rewards_service: RewardClient, tasks: list[Task], completions: list[str],
    rewards: list[ItemReward], config: RefineConfig, params: GenerationParams, seed: int | None,
) -> list[list[Round]]:
    """The later attempts of each trajectory (first attempts: `completions`, scored `rewards`,
    one per trajectory of `tasks`): each round rewrites every trajectory that has not passed yet,
    as one batch of single samples with the first round's sampling settings."""
    later: list[list[Round]] = [[] for _ in tasks]
    last = list(zip(completions, rewards, strict=True))
    # the feedback block comes first: if the prompt is too long for the engine, it is what is cut
    params = replace(params, n=1, truncate_prompt_left=True)
    for round_index in range(1, config.rounds):
        todo = [i for i, (_, reward) in enumerate(last) if not reward.passed]
        if not todo:
            break
        prompts = [feedback_prompt(tasks[i], last[i][0], last[i][1].feedback, config.feedback_chars) for i in todo]
        rollouts = generate(prompts, params, None if seed is None else seed + 104_729 * round_index)
        scored = rewards_service.score([tasks[i] for i in todo], [r.samples[0].text for r in rollouts])
        for i, rollout, reward in zip(todo, rollouts, scored, strict=True):
            later[i].append(Round(rollout.prompt_ids, rollout.samples[0], reward))
            last[i] = (rollout.samples[0].text, reward)
    return later


def pass_rates_by_round(first: list[ItemReward], later: list[list[Round]], rounds: int) -> list[float]:
    """Share of trajectories passed after each of rounds 1..`rounds` (a trajectory stops at its pass)."""
    passed_at = [
        next((r for r, reward in enumerate([f] + [a.reward for a in attempts], start=1) if reward.passed), None)
        for f, attempts in zip(first, later, strict=True)
    ]
    return [sum(p is not None and p <= r for p in passed_at) / len(passed_at) for r in range(1, rounds + 1)]
