"""Environments of multi-turn trajectories: after each policy turn, whether the trajectory goes on,
what the policy reads next (an observation), and the reward that ends it.

An environment sees a batch of live trajectories' latest turns at once (scoring and running code
go to the reward service in batches) and answers a `Reply` for each. A reply with an observation
continues the trajectory; one without ends it, and its reward is the trajectory's outcome (the
reward RLOO compares among a task's k trajectories). `final` marks the turns after which no other
fits (the turn or token limits): the environment ends those, scoring what they hold as the answer.

- `Refine`: every attempt is scored by all the task's tests; a failed one is followed by the
  feedback of a run on its shown tests (Task.public_tests: a contest's public examples), or, when
  it passes them or the task shows none, by how the held tests ended, never what they are. With
  `go_on: shown`, only an attempt that fails the shown tests goes on (the held tests decide
  nothing the policy sees). With a `choose` (refinement's budget per round), only the failed
  attempts it keeps go on.
- `Interpreter`: a turn that ends at the run marker asks to run its code; the sandbox runs it
  with the task's limits and no tests, and its stdout, stderr and exit status are the observation,
  up to `max_tool_calls`; any other turn is the answer, scored by all the task's tests.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from reward_service.client import RewardClient
from reward_service.extract import extract
from reward_service.schemas import ItemReward, RunResult
from reward_service.tasks import Task
from rollout_workers.config import EnvConfig
from sandbox_pool import Status


@dataclass
class Reply:
    """What an environment says of a turn: its reward when it scored it, the message that the
    policy reads before its next turn and what it asks (no message: the trajectory ends, and
    `reward` is its outcome), and whether the turn was a tool call."""

    reward: ItemReward | None
    message: str | None = None
    ask: str = ""
    tool_call: bool = False


@dataclass
class Live:
    """A live trajectory as an environment sees it: the task (as the reward service scores its
    answers), the text of each policy turn so far, the stop sequence each ended at, and how many tool calls it made."""

    task: Task
    texts: list[str]
    stops: list[str | None]  # the stop sequence each turn ended at
    tool_calls: int = 0


# Of the failed attempts that could go on (indices into a react call's trajectories), those that do:
# refinement's budget per round (rollout_workers.strategies.MultiTurn).
Choose = Callable[[list[int]], list[int]]


class Environment(Protocol):
    def stop(self, stop: list[str]) -> list[str]:
        """The stop sequences of a turn, from the rollout's."""

    def react(self, live: list[Live], final: list[bool], choose: Choose | None = None) -> list[Reply]:
        """A reply for each trajectory's latest turn; a `final` one gets no message, nor a failed
        attempt that `choose` leaves out (environments whose turns are attempts)."""


def answer_program(task: Task, text: str) -> str:
    """The program a turn's text holds, as the sandbox runs it: the task's prompt and the turn's
    continuation of it, or the code of a whole-program answer."""
    return task.program(extract(text, task.prompt_is_code, task.entry_point, task.language).code)


def cut_feedback(feedback: str, chars: int) -> str:
    return (feedback[:chars] + " [...]" if len(feedback) > chars else feedback) or "(no message)"


# What a failed attempt's feedback is introduced by and ends with, by env.feedback: in the attempt's
# own conversation, or in a fresh prompt that holds the task's alone (none: never read).
SAID = {"context": "What running the code above said:\n", "note": "An earlier answer to this failed. What running it said:\n",
        "none": ""}
ASK = {"context": "Write it again, fixed.", "note": "Write a correct solution.", "none": ""}


class _Base:
    """What the environments share: the reward service that scores and runs, their config, and the
    rollout's stop sequences as they are."""

    def __init__(self, rewards: RewardClient, config: EnvConfig):
        self.rewards, self.config = rewards, config

    def stop(self, stop: list[str]) -> list[str]:
        return stop


class Refine(_Base):
    def react(self, live: list[Live], final: list[bool], choose: Choose | None = None) -> list[Reply]:
        scored = self.rewards.score([t.task for t in live], [t.texts[-1] for t in live])
        again = [i for i, r in enumerate(scored) if not r.passed and not final[i]]
        if self.config.go_on == "shown":  # what the policy could know: an attempt that passes the shown tests is the answer
            examples = self._on_shown(live, [i for i in again if live[i].task.public_tests])
            again = [i for i in examples if not examples[i].passed]
        if choose is not None:  # an attempt left out ends here (under go_on verdict, before its run on the shown tests)
            again = choose(again)
        if self.config.go_on == "verdict":
            examples = self._on_shown(live, [i for i in again if live[i].task.public_tests])
        replies = [Reply(r) for r in scored]
        for i in again:
            said = feedback(live[i].task, scored[i], examples.get(i))
            replies[i] = Reply(scored[i], SAID[self.config.feedback] + cut_feedback(said, self.config.feedback_chars), ASK[self.config.feedback])
        return replies

    def _on_shown(self, live: list[Live], which: list[int]) -> dict[int, ItemReward]:
        """A run of these attempts on their tasks' shown tests alone, what their feedback comes from: a
        held test's input, expected value or error never reaches the policy, only that the held tests
        did not all pass."""
        if not which:
            return {}
        on_shown = self.rewards.score([live[i].task.examples() for i in which], [live[i].texts[-1] for i in which])
        return dict(zip(which, on_shown, strict=True))


def feedback(task: Task, held: ItemReward, shown: ItemReward | None) -> str:
    """What a failed attempt is told: the shown tests' own feedback where they failed, else only
    how many held tests there are and how their run ended, never what they are."""
    if shown is not None and not shown.passed:
        return shown.feedback
    said = f"Passed the shown tests ({task.public_tests}). " if shown is not None else ""
    return said + f"The held tests ({len(task.held)}, not shown): {HELD_VERDICT.get(held.status, held.status.value)}"


HELD_VERDICT = {Status.failed: "some did not pass", Status.syntax_error: "it does not compile",
                Status.runtime_error: "the program crashed", Status.timeout: "it timed out",
                Status.memory_exceeded: "it ran out of memory", Status.infra_error: "not run: the sandbox failed"}


class Interpreter(_Base):
    def stop(self, stop: list[str]) -> list[str]:
        # a probe prints what it wants to see: a continuation's "\nprint(" stop would cut it
        return [self.config.run_marker] + [s for s in stop if "print(" not in s]

    def react(self, live: list[Live], final: list[bool], choose: Choose | None = None) -> list[Reply]:
        runs = [i for i, t in enumerate(live)
                if t.stops[-1] == self.config.run_marker and t.tool_calls < self.config.max_tool_calls and not final[i]]
        replies: list[Reply | None] = [None] * len(live)
        if runs:
            results = self.rewards.run([live[i].task for i in runs], [answer_program(live[i].task, live[i].texts[-1]) for i in runs])
            for i, result in zip(runs, results, strict=True):
                left = self.config.max_tool_calls - live[i].tool_calls - 1
                ask = f"Runs left: {left}." if left else "No runs left: write the answer."
                replies[i] = Reply(None, run_report(result), ask, tool_call=True)
        answers = [i for i, reply in enumerate(replies) if reply is None]
        if answers:
            scored = self.rewards.score([live[i].task for i in answers], [live[i].texts[-1] for i in answers])
            for i, r in zip(answers, scored, strict=True):
                replies[i] = Reply(r)
        return replies


def run_report(result: RunResult) -> str:
    """What a run printed and how it ended, as the model reads it."""
    parts = []
    for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        if text.strip():
            parts.append(f"{name}:\n{text.rstrip()}")
    return "\n".join(parts + [f"exit: {result.exit}"])


def make_environment(config: EnvConfig, rewards: RewardClient) -> Environment | None:
    """The configured environment (None: single attempts)."""
    kinds = {"refine": Refine, "interpreter": Interpreter}
    return kinds[config.name](rewards, config) if config.multi_turn else None
