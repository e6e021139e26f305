"""Rollout strategies: what turns a step's tasks into trajectories (the rollout seam).

A strategy is given the rollout group (generation) and the reward service's client (scoring);
`run(tasks, params, seed)` returns `Rollouts`: k trajectories per task, each a list of turns
with token ids, the policy's mask, sampler logprobs and a reward, and the trajectory's outcome.
The controller, the learner and the evaluation see trajectories only, never attempts or tools:
a new environment is a new strategy.

- `SingleAttempt`: each sample is one turn. A prompt's k samples are sent to the reward service
  as soon as they are generated, so that scoring overlaps generation.
- `MultiTurn`: each sample is a trajectory of turns in an environment (refinement from execution
  feedback from the shown tests, a code interpreter: rollout_workers/environments.py),
  which replies to each turn with an observation or ends the trajectory with its outcome; RLOO
  compares the k outcomes of a prompt, and every policy token of a trajectory trains with the
  trajectory's advantage.
"""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from reward_service.client import RewardClient
from reward_service.schemas import ItemReward
from reward_service.tasks import Task
from rollout_workers.config import EnvConfig, PromptConfig
from rollout_workers.environments import Choose, Environment, Live, Reply, make_environment
from rollout_workers.group import RolloutGroup
from rollout_workers.prompts import answered_task, follow_up, generation_params, render, retry, uses_chat_template
from rollout_workers.types import GenerationParams, PromptRollout, Rollouts, Trajectory, Turn, last_answer


# A group handed on as soon as it is scored (partial rollouts): (the task's index, its k
# trajectories, how long its scoring took after its samples were generated).
GroupDone = Callable[[int, list[Trajectory], float], None]
# The critic's P(passed) of each (prompt, program) pair of token ids (types.last_answer): which failed
# attempts refinement goes on with.
Score = Callable[[list[list[int]], list[list[int]]], Sequence[float]]


class RolloutStrategy(Protocol):
    def run(self, tasks: list[Task], params: GenerationParams, seed: int | None,
            progress: Callable[[int], None] | None = None, done: GroupDone | None = None) -> Rollouts:
        """`params.n` trajectories for each of `tasks`; with `seed`, reproducibly. `progress(1)` is
        called (from a thread of the rollout group) as each task's first samples are generated, and
        `done` with each task's group as soon as it is scored."""


class SingleAttempt:
    """`tokenizer` and `prompt`: how tasks are rendered into prompts (rollout_workers.prompts; no
    tokenizer: a model without a chat template)."""

    def __init__(self, group: RolloutGroup, rewards: RewardClient, tokenizer=None, prompt: PromptConfig | None = None):
        self.group, self.rewards = group, rewards
        self.tokenizer, self.prompt = tokenizer, prompt or PromptConfig()
        uses_chat_template(tokenizer, self.prompt)  # prompt.chat_template 'on' without a template fails here

    def run(self, tasks: list[Task], params: GenerationParams, seed: int | None,
            progress: Callable[[int], None] | None = None, done: GroupDone | None = None) -> Rollouts:
        """Also `done(index, group, scoring_s)` (from a thread of its own) as each task's group is scored."""
        started = time.time()
        tasks = [answered_task(t, self.tokenizer, self.prompt) for t in tasks]
        params = generation_params(params, self.tokenizer, self.prompt)
        rollouts: list[PromptRollout | None] = [None] * len(tasks)
        pending: list = [None] * len(tasks)
        collectors: list[threading.Thread] = []
        made: list[list[Trajectory] | None] = [None] * len(tasks)  # the groups handed on to `done`

        def trajectories(index: int, rewards: list[ItemReward]) -> list[Trajectory]:
            return [Trajectory(tasks[index], [Turn.of(rollouts[index].prompt_ids, sample, reward)], reward)
                    for sample, reward in zip(rollouts[index].samples, rewards, strict=True)]

        def collect(index: int, generated: float) -> None:
            # its request goes out with its linger's others, not at once
            made[index] = trajectories(index, self.rewards.collect(pending[index], send=False))
            done(index, made[index], time.time() - generated)

        def score(index: int, rollout: PromptRollout) -> None:
            token_ids = [s.token_ids for s in rollout.samples] if self.rewards.per_token else None
            pending[index] = self.rewards.submit([tasks[index]] * len(rollout.samples), [s.text for s in rollout.samples], token_ids)
            rollouts[index] = rollout
            if done is not None:
                collectors.append(threading.Thread(target=collect, args=(index, time.time()), name="group-done", daemon=True))
                collectors[-1].start()
            if progress is not None:
                progress(1)

        redos = self.group.generate_each([render(t, self.tokenizer, self.prompt) for t in tasks], params, seed, score)
        generated = time.time()
        for c in collectors:
            c.join()
        groups = [made[i] or trajectories(i, self.rewards.collect(pending[i])) for i in range(len(tasks))]
        metrics = {"time_generate_s": generated - started, "time_score_tail_s": time.time() - generated, "rollout_retries": redos}
        return Rollouts(groups, metrics)


@dataclass
class _Making:
    """A trajectory being made: its turns, the context its next turn is sampled from, and what its
    environment sees of it."""

    turns: list[Turn]
    context: list[int]
    live: Live
    task_index: int
    observation_tokens: int = 0
    cut_observations: int = 0
    at_limit: bool = False
    unchosen: bool = False  # ended by the budget per round (env.per_round)
    outcome: ItemReward | None = None


class MultiTurn:
    """Trajectories of several turns in an environment (rollout_workers/environments.py).

    Each task's k first turns are sampled together, as single attempts are; then, round by round,
    the environment replies to every live trajectory's latest turn at once, and the next turns of
    all the trajectories that go on are sampled together, interleaved in the engines. A turn's
    context is the trajectory so far as token ids (the first prompt, each turn's tokens, each
    observation's), never re-tokenized, so turn i+1's context starts with turn i's context and
    tokens: the learner can train a trajectory as one sequence (learner.algorithm.to_sequences).

    Limits: `max_turns`; an observation's message is cut to `observation_tokens` tokens, with a
    marker; a trajectory whose next turn would not fit in `max_total_tokens` or the engine's
    context ends with the turns it has (its prompt is never cut). With refinement's `per_round`, at
    most that many of a task's failed trajectories go on each round: a random choice, or with
    `choose: critic` those whose latest program `score` (the critic's log-odds of passed) rates highest, as
    CodeRL refines the failed programs its critic rates best; the others end on that turn.
    """

    def __init__(self, group: RolloutGroup, env: Environment, config: EnvConfig, tokenizer, prompt: PromptConfig | None = None,
                 context_length: int | None = None, score: Score | None = None):
        if tokenizer is None:
            raise ValueError("a multi-turn strategy needs the policy's tokenizer (observations are tokenized into its context)")
        if config.choose == "critic" and score is None:
            raise ValueError("env.choose critic: refinement needs the critic's scores (critic.enabled, in a training run)")
        self.group, self.env, self.config, self.score = group, env, config, score
        self.tokenizer, self.prompt = tokenizer, prompt or PromptConfig()
        uses_chat_template(tokenizer, self.prompt)  # prompt.chat_template 'on' without a template fails here
        self.limit = min(config.max_total_tokens, context_length or group.context_length())

    def run(self, tasks: list[Task], params: GenerationParams, seed: int | None,
            progress: Callable[[int], None] | None = None, done: GroupDone | None = None) -> Rollouts:
        """Also `done(index, group, reply_s)` after each round, for each task whose k trajectories
        have all ended then (`reply_s`: the environment's time for that round)."""
        started = time.time()
        tasks = [answered_task(t, self.tokenizer, self.prompt) for t in tasks]
        params = generation_params(params, self.tokenizer, self.prompt)
        params = replace(params, stop=self.env.stop(params.stop))
        first: list[PromptRollout | None] = [None] * len(tasks)

        def got(index: int, rollout: PromptRollout) -> None:
            first[index] = rollout
            if progress is not None:
                progress(1)

        redos = self.group.generate_each([render(t, self.tokenizer, self.prompt) for t in tasks], params, seed, got)
        made = [[_Making([Turn.of(r.prompt_ids, s, None)], list(r.prompt_ids), Live(task, [s.text], [s.stop]), i) for s in r.samples]
                for i, (task, r) in enumerate(zip(tasks, first, strict=True))]
        generating, reacting = time.time() - started, 0.0
        live = [t for group in made for t in group]
        one = replace(params, n=1)
        round_index = 0
        handed: set[int] = set()
        rng = random.Random(seed)
        while live:
            t0 = time.time()
            live = self._react(live, params.max_new_tokens, rng)
            tail = time.time() - t0  # the last one: scoring after the last sample was generated
            reacting += tail
            for i, group in enumerate(made):
                if done is not None and i not in handed and all(t.outcome is not None for t in group):
                    handed.add(i)
                    done(i, [Trajectory(tasks[i], t.turns, t.outcome) for t in group], tail)
            if not live:
                break
            round_index += 1
            t0 = time.time()
            made_now: list[PromptRollout | None] = [None] * len(live)
            redos += self.group.generate_each([t.context for t in live], one, None if seed is None else seed + 104_729 * round_index,
                                              made_now.__setitem__)
            for t, sample in zip(live, [r.samples[0] for r in made_now], strict=True):
                t.turns.append(Turn.of(list(t.context), sample, None))
                t.live.texts.append(sample.text)
                t.live.stops.append(sample.stop)
            generating += time.time() - t0
        groups = [[Trajectory(task, t.turns, t.outcome) for t in group] for task, group in zip(tasks, made, strict=True)]
        return Rollouts(groups, {**self._metrics(made, generating, reacting, redos), "time_score_tail_s": tail})

    def _react(self, live: list[_Making], max_new_tokens: int, rng: random.Random) -> list[_Making]:
        """The environment's replies to each live trajectory's latest turn: the trajectories that go
        on, their contexts extended by the turn and the observation."""
        final = [len(t.turns) >= self.config.max_turns for t in live]
        replies = self.env.react([t.live for t in live], final, self._chooser(live, rng))
        going, ending = [], []
        for t, reply in zip(live, replies, strict=True):
            turn = t.turns[-1]
            turn.reward = reply.reward
            if reply.message is None:
                t.outcome = reply.reward
                continue
            if self.config.feedback == "context":
                ids, cut = observation_ids(self.tokenizer, self.prompt, self.config, t.live.task, reply, turn.token_ids)
                context, read = t.context + turn.token_ids + ids, len(ids)
            elif self.config.feedback == "note":  # the task's prompt afresh, with what the run said
                message, cut = cut_message(self.tokenizer, self.config, reply.message)
                context = self.tokenizer(retry(t.live.task, self.tokenizer, self.prompt, message, reply.ask))["input_ids"]
                read = len(context) - len(t.turns[0].prompt_ids)
            else:  # an independent attempt: the task's prompt alone
                read, cut, context = 0, 0, list(t.turns[0].prompt_ids)
            if len(context) + max_new_tokens > self.limit:
                t.at_limit = True
                ending.append(t)
                continue
            t.context, t.observation_tokens, t.cut_observations = context, t.observation_tokens + read, t.cut_observations + cut
            t.live.tool_calls += reply.tool_call
            going.append(t)
        if ending:  # no next turn fits: the environment ends them on what they hold
            for t, reply in zip(ending, self.env.react([t.live for t in ending], [True] * len(ending)), strict=True):
                t.turns[-1].reward = t.outcome = reply.reward
        return going

    def _chooser(self, live: list[_Making], rng: random.Random) -> Choose | None:
        """With a budget per round: of the failed trajectories (indices into `live`) that could go
        on, each task's `per_round` chosen ones (at random, or rated highest by `score`)."""
        per_round = self.config.per_round
        if not per_round:
            return None

        def choose(failed: list[int]) -> list[int]:
            by_task: dict[int, list[int]] = {}
            for i in failed:
                by_task.setdefault(live[i].task_index, []).append(i)
            over = [ids for ids in by_task.values() if len(ids) > per_round]
            if not over:
                return failed
            if self.score is not None:
                every = [i for ids in over for i in ids]
                prompts, programs = zip(*(last_answer(live[i].turns) for i in every), strict=True)
                scores = self.score(list(prompts), list(programs))
                rated = dict(zip(every, map(float, scores), strict=True))
                chosen = [sorted(ids, key=lambda i: -rated[i])[:per_round] for ids in over]  # stable: the first on a tie
            else:
                chosen = [rng.sample(ids, per_round) for ids in over]
            left = {i for ids in over for i in ids} - {i for ids in chosen for i in ids}
            for i in left:
                live[i].unchosen = True
            return [i for i in failed if i not in left]

        return choose

    def _metrics(self, made: list[list[_Making]], generating: float, reacting: float, redos: int) -> dict[str, float]:
        every = [t for group in made for t in group]
        n = len(every)
        metrics = {
            **turn_metrics([Trajectory(t.live.task, t.turns, t.outcome) for t in every], self.config),
            "tool_calls_mean": sum(t.live.tool_calls for t in every) / n,
            "observation_tokens_mean": sum(t.observation_tokens for t in every) / n,
            "observations_cut_mean": sum(t.cut_observations for t in every) / n,  # cut observations per trajectory
            "at_token_limit_fraction": sum(t.at_limit for t in every) / n,
            "unchosen_fraction": sum(t.unchosen for t in every) / n,  # ended by the budget per round
            "time_generate_s": generating, "time_env_s": reacting, "rollout_retries": redos,
        }
        return metrics


def turn_metrics(trajectories: list[Trajectory], config: EnvConfig) -> dict[str, float]:
    """Turns per trajectory, and where rounds are attempts (not the interpreter's), the pass rate
    by round."""
    metrics = {"turns_mean": sum(len(t.turns) for t in trajectories) / len(trajectories)}
    if config.turns_are_attempts:
        rates = pass_rates_by_turn(trajectories, config.max_turns)
        metrics.update({f"pass@1_round{r}": rate for r, rate in enumerate(rates, start=1)})
    return metrics


def cut_message(tokenizer, config: EnvConfig, message: str) -> tuple[str, int]:
    """`message` cut to `config.observation_tokens`, with a marker, and 1 if it was cut."""
    ids = tokenizer(message, add_special_tokens=False)["input_ids"]
    if len(ids) <= config.observation_tokens:
        return message, 0
    kept = config.observation_tokens
    return tokenizer.decode(ids[:kept]) + f"\n[... {len(ids) - kept} more tokens cut]", 1


def observation_ids(tokenizer, prompt: PromptConfig, config: EnvConfig, task: Task, reply: Reply, turn_ids: list[int]) -> tuple[list[int], int]:
    """The token ids of what follows a turn (`turn_ids`) to which the environment said `reply` (its
    message cut to `config.observation_tokens`, with a marker; rollout_workers.prompts.follow_up),
    and 1 if it was cut."""
    message, cut = cut_message(tokenizer, config, reply.message)
    ended = bool(turn_ids) and turn_ids[-1] == tokenizer.eos_token_id  # not at a stop sequence or the length
    text = follow_up(task, tokenizer, prompt, message, reply.ask, turn_ended=ended)
    return tokenizer(text, add_special_tokens=False)["input_ids"], cut


def pass_rates_by_turn(trajectories: list[Trajectory], turns: int) -> list[float]:
    """Share of trajectories with a passing turn among their first 1..`turns` turns."""
    passed_at = [next((i for i, turn in enumerate(t.turns, start=1) if turn.reward is not None and turn.reward.passed), None)
                 for t in trajectories]
    return [sum(p is not None and p <= r for p in passed_at) / len(passed_at) for r in range(1, turns + 1)]


def make_strategy(group: RolloutGroup, rewards: RewardClient, env: EnvConfig, tokenizer,
                  prompt: PromptConfig, score: Score | None = None) -> RolloutStrategy:
    """The configured strategy: single attempts, or multi-turn trajectories in the configured
    environment; prompts rendered with the policy's `tokenizer` as `prompt` says; `score`: the
    critic's, for refinement that lets it choose (env.choose critic)."""
    environment = make_environment(env, rewards)
    if environment is None:
        return SingleAttempt(group, rewards, tokenizer, prompt)
    return MultiTurn(group, environment, env, tokenizer, prompt, score=score if env.choose == "critic" else None)
