"""Rollout strategies: what turns a step's tasks into trajectories (the rollout seam).

A strategy is given the rollout group (generation) and the reward service's client (scoring);
`run(tasks, params, seed)` returns `Rollouts`: k trajectories per task, each a list of turns
with token ids, the policy's mask, sampler logprobs and a reward, and the trajectory's outcome.
The controller, the learner and the evaluation see trajectories only, never attempts or tools:
a new environment is a new strategy.

- `SingleAttempt`: each sample is one turn. A prompt's k samples are sent to the reward service
  as soon as they are generated, so that scoring overlaps generation.
- `Refinement`: each sample is a trajectory of attempts that ends when one passes, up to
  `rounds`: a failed attempt is shown to the model again with what running it said. The last
  attempt's reward is the outcome; RLOO compares the k outcomes of a prompt, and every attempt of
  a trajectory trains with the trajectory's advantage.
"""
from __future__ import annotations

import time
from dataclasses import replace
from collections.abc import Callable
from typing import Protocol

from reward_service.client import RewardClient
from reward_service.extract import extract
from reward_service.tasks import Task
from rollout_workers.config import PromptConfig, RefineConfig
from rollout_workers.group import RolloutGroup
from rollout_workers.prompts import answered_task, generation_params, render, uses_chat_template
from rollout_workers.types import GenerationParams, PromptRollout, Rollouts, Trajectory, Turn


class RolloutStrategy(Protocol):
    def run(self, tasks: list[Task], params: GenerationParams, seed: int | None,
            progress: Callable[[int], None] | None = None) -> Rollouts:
        """`params.n` trajectories for each of `tasks`; with `seed`, reproducibly. `progress(1)` is
        called (from a thread of the rollout group) as each task's first samples are generated."""


class SingleAttempt:
    """`tokenizer` and `prompt`: how tasks are rendered into prompts (rollout_workers.prompts; no
    tokenizer: a model without a chat template)."""

    def __init__(self, group: RolloutGroup, rewards: RewardClient, tokenizer=None, prompt: PromptConfig | None = None):
        self.group, self.rewards = group, rewards
        self.tokenizer, self.prompt = tokenizer, prompt or PromptConfig()
        uses_chat_template(tokenizer, self.prompt)  # prompt.chat_template 'on' without a template fails here

    def run(self, tasks: list[Task], params: GenerationParams, seed: int | None,
            progress: Callable[[int], None] | None = None) -> Rollouts:
        started = time.time()
        tasks = [answered_task(t, self.tokenizer, self.prompt) for t in tasks]
        params = generation_params(params, self.tokenizer, self.prompt)
        rollouts: list[PromptRollout | None] = [None] * len(tasks)
        pending: list = [None] * len(tasks)

        def score(index: int, rollout: PromptRollout) -> None:
            token_ids = [s.token_ids for s in rollout.samples] if self.rewards.per_token else None
            pending[index] = self.rewards.submit([tasks[index]] * len(rollout.samples), [s.text for s in rollout.samples], token_ids)
            rollouts[index] = rollout
            if progress is not None:
                progress(1)

        redos = self.group.generate_each([render(t, self.tokenizer, self.prompt) for t in tasks], params, seed, score)
        generated = time.time()
        groups = [
            [Trajectory(task, [Turn.of(rollout.prompt_ids, sample, reward)], reward)
             for sample, reward in zip(rollout.samples, self.rewards.collect(request), strict=True)]
            for task, rollout, request in zip(tasks, rollouts, pending, strict=True)
        ]
        metrics = {"time_generate_s": generated - started, "time_score_tail_s": time.time() - generated, "rollout_retries": redos}
        return Rollouts(groups, metrics)


class Refinement:
    def __init__(self, group: RolloutGroup, rewards: RewardClient, config: RefineConfig, tokenizer=None,
                 prompt: PromptConfig | None = None):
        self.first = SingleAttempt(group, rewards, tokenizer, prompt)
        self.group, self.rewards, self.config = group, rewards, config  # later rounds: single samples, scored at once

    def run(self, tasks: list[Task], params: GenerationParams, seed: int | None,
            progress: Callable[[int], None] | None = None) -> Rollouts:
        out = self.first.run(tasks, params, seed, progress)
        started = time.time()
        trajectories = out.trajectories()
        # Each round is one batch of single samples with the first round's sampling settings; the
        # feedback block comes first, so if a prompt is too long for the engine, it is what is cut.
        # (A chat prompt cut on the left loses its system message and the user's header.)
        params = replace(generation_params(params, self.first.tokenizer, self.first.prompt), n=1, truncate_prompt_left=True)
        for round_index in range(1, self.config.rounds):
            todo = [t for t in trajectories if not t.outcome.passed]
            if not todo:
                break
            prompts = [render(t.task, self.first.tokenizer, self.first.prompt,
                              feedback_prompt(t.task, t.turns[-1].text, t.outcome.feedback, self.config.feedback_chars))
                       for t in todo]
            rollouts: list = [None] * len(prompts)
            out.metrics["rollout_retries"] += self.group.generate_each(
                prompts, params, None if seed is None else seed + 104_729 * round_index, rollouts.__setitem__)
            scored = self.rewards.score([t.task for t in todo], [r.samples[0].text for r in rollouts])
            for trajectory, rollout, reward in zip(todo, rollouts, scored, strict=True):
                trajectory.turns.append(Turn.of(rollout.prompt_ids, rollout.samples[0], reward))
                trajectory.outcome = reward
        rates = pass_rates_by_turn(trajectories, self.config.rounds)
        out.metrics.update({f"pass@1_round{r}": rate for r, rate in enumerate(rates, start=1)})
        out.metrics.update(rounds_mean=sum(len(t.turns) for t in trajectories) / len(trajectories), time_refine_s=time.time() - started)
        return out


def feedback_prompt(task: Task, previous_completion: str, feedback: str, chars: int) -> str:
    """The next attempt's prompt: a comment block with the previous program and what running it
    said (cut to `chars`), then the task's own prompt, so that the model answers in the task's
    format (continuing the prompt's code, or writing the whole program) and the reward service
    scores the answer as a plain completion of `task`."""
    if chars < 1:
        raise ValueError(f"feedback chars must be at least 1, got {chars}")
    program = task.program(extract(previous_completion, task.prompt_is_code, task.entry_point, task.language).code)
    said = feedback[:chars] + (" [...]" if len(feedback) > chars else "")
    lines = (
        ["A previous attempt at the code below did not pass its tests:"] + program.rstrip("\n").splitlines()
        + ["What running it said:"] + (said.splitlines() or ["(no message)"])
        + ["Write it again, fixed."]
    )
    return "".join(f"# {line}".rstrip() + "\n" for line in lines) + "\n" + task.prompt


def pass_rates_by_turn(trajectories: list[Trajectory], turns: int) -> list[float]:
    """Share of trajectories with a passing turn among their first 1..`turns` turns."""
    passed_at = [next((i for i, turn in enumerate(t.turns, start=1) if turn.reward is not None and turn.reward.passed), None)
                 for t in trajectories]
    return [sum(p is not None and p <= r for p in passed_at) / len(passed_at) for r in range(1, turns + 1)]


def make_strategy(group: RolloutGroup, rewards: RewardClient, refine: RefineConfig, tokenizer,
                  prompt: PromptConfig) -> RolloutStrategy:
    """The configured strategy: refinement when enabled, else single attempts; prompts rendered
    with the policy's `tokenizer` as `prompt` says."""
    if refine.enabled:
        return Refinement(group, rewards, refine, tokenizer, prompt)
    return SingleAttempt(group, rewards, tokenizer, prompt)
