"""The training loop: tasks -> trajectories (rollout strategy) -> batch (algorithm) -> learner step
-> weight push -> metrics.

It reads top to bottom on purpose; each stage is one call into the component that owns it.
"""
from __future__ import annotations

import json
import math
import queue
import random
import shutil
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from coderloo.actors import Actors, started
from coderloo.checkpoint import latest_checkpoint, prune_checkpoints, read_state, write_checkpoint
from coderloo.config import Config, dump_config
from coderloo.console import RunConsole
from coderloo.curriculum import TaskDraw
from coderloo.evaluation import evaluate
from coderloo.loggers import RunLog, check_installed
from coderloo.metrics import MetricsLog, RunMetrics, plot_training
from coderloo.models import build_tiny_model
from coderloo.ops.cluster_files import check_local_resources
from coderloo.ops.resources import ResourceSampler
from coderloo.pool import GroupPool
from coderloo.report import write_report
from coderloo.rundir import claim
from coderloo.runtime import resolve
from coderloo.stream import GroupStream
from coderloo.tasksets.loading import load_tasks
from coderloo.tasksets.synthetic import corpus_for_tokenizer
from common.hf import load_tokenizer
from common.progress import working
from learner.advantages import informative_groups
from learner.algorithm import build_batch, to_sequences
from learner.critic import OUTCOMES, OnlineCritic
from learner.group import LearnerGroup
from learner.replay import GroupReplay
from reward_service.schemas import ItemReward
from rollout_workers import GenerationParams, RolloutGroup, Rollouts, WeightSyncError
from rollout_workers.config import PromptConfig
from rollout_workers.demonstrations import demonstrations
from rollout_workers.environments import make_environment
from rollout_workers.prompts import chat_answer, render, uses_chat_template
from rollout_workers.strategies import turn_metrics
from rollout_workers.types import last_answer


def prepare_model(config: Config) -> Path:
    path = resolve(config.model.path)
    if not (path / "config.json").exists():
        if not config.model.build_tiny:
            raise FileNotFoundError(f"model.path: no model at {path} (and model.build_tiny is false); a catalogue model "
                                    f"comes with `coderloo model fetch NAME` (`coderloo model list`), a GGUF file with "
                                    f"`coderloo model import FILE --out DIR`")
        with working(f"building the tiny model at {path} (once)"):
            build_tiny_model(path, corpus_for_tokenizer(config.tasks.synthetic_kinds), config.model.tiny)
    return path


def sft_examples(tasks, tokenizer, prompt: PromptConfig | None = None) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, reference completion ids) for every task with a reference: the prompt as the engines are given it
    (rollout_workers.prompts.render); the completion is the reference (its continuation of a code
    prompt) + EOS, or through a chat template, the reference as the model's fenced answer + the
    template's end of turn."""
    prompt = prompt or PromptConfig()
    chat = uses_chat_template(tokenizer, prompt)
    examples = []
    for task in tasks:
        if not task.reference.strip():
            continue  # a task without a solution in its data (LiveCodeBench's, some CodeContests') teaches nothing
        prompt_ids = tokenizer(render(task, tokenizer, prompt))["input_ids"]
        if chat:
            completion_ids = tokenizer(chat_answer(task, tokenizer, prompt), add_special_tokens=False)["input_ids"]
        else:
            completion = task.reference[len(task.prompt):] if task.prompt_is_code else task.reference
            completion_ids = tokenizer(completion)["input_ids"] + [tokenizer.eos_token_id]
        examples.append((prompt_ids, completion_ids))
    return examples


def sft_batch(examples: list, demos: list, size: int, share: float, rng: random.Random) -> list:
    """One SFT batch: `share` of it multi-turn demonstrations (when there are any), the rest reference solutions."""
    n = min(round(size * share), len(demos)) if demos else 0
    return rng.sample(demos, n) + rng.sample(examples, min(size - n, len(examples)))


def generation_seed(config: Config, step: int, purpose: int) -> int:
    """The sampling seed of one generation call: the same step of the same run draws the same
    samples, whether or not the run was resumed in between."""
    return (config.train.seed * 1_000_003 + step * 7919 + purpose * 104_729) % (2**31 - 1_000)


def critic_label(reward: ItemReward) -> int | None:
    """The index in the critic's OUTCOMES of a scored program's class; None for a sandbox failure."""
    name = reward.outcome_class
    return None if name is None else OUTCOMES.index(name)


def observe(critic: OnlineCritic, rollouts: Rollouts):
    """The critic predicts, then learns, each trajectory's last program (as one attempt at its task) and its outcome."""
    trajectories = rollouts.trajectories()
    prompts, programs = zip(*(last_answer(t.turns) for t in trajectories), strict=True)
    return critic.observe([t.task.id for t in trajectories], list(prompts), list(programs), [critic_label(t.outcome) for t in trajectories])


@dataclass
class Job:
    """One step's rollouts, made in a thread while the learner trains on an earlier step."""

    step: int
    tasks: list
    rollouts: Future
    scored: queue.SimpleQueue | None = None  # with train.stream_groups, each group as it is scored


def in_background(fn, *args) -> Future:
    """`fn(*args)` in a daemon thread: a run that fails is not kept alive by rollouts in flight."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as e:  # surfaced to the controller by future.result()
            future.set_exception(e)

    threading.Thread(target=run, name="rollouts", daemon=True).start()
    return future


def refill(rollouts: Rollouts, wanted: int, rounds: int, generate) -> tuple[Rollouts, dict[str, float]]:
    """DAPO's dynamic sampling: while fewer than `wanted` of the groups are informative (their k
    outcome rewards not all equal: learner.advantages.informative_groups, the test the algorithm
    filters by), up to `rounds` more rounds of `generate(prompts, round)` for as many new prompts as
    the informative rate so far says are missing (at most `wanted` a round); then every
    uninformative group (the algorithm filters and counts them) and the first `wanted` informative
    ones, in the order they came. Returns them and the refill's metrics."""
    def informative() -> list[bool]:
        return informative_groups(torch.tensor([[t.outcome.total for t in g] for g in rollouts.groups])).tolist()

    first, done = len(rollouts.groups), 0
    while done < rounds and (have := sum(informative())) < wanted:
        rate = max(have / len(rollouts.groups), 1.0 / wanted)
        done += 1
        more = generate(min(wanted, math.ceil((wanted - have) / rate)), done)
        if not more.groups:
            break  # nothing left to draw (a curriculum with no open task)
        rollouts.extend(more)
    kept, taken = [], 0
    for group, useful in zip(rollouts.groups, informative()):
        if useful and taken == wanted:
            continue  # a surplus of the last round
        taken += useful
        kept.append(group)
    drawn = len(rollouts.groups)
    rollouts.groups = kept
    return rollouts, {"refill_rounds": done, "refill_prompts": drawn - first, "informative_groups": taken,
                      "refill_surplus_groups": drawn - len(kept)}


def waits(t0: float, t_job: float, t_ready: float, score_tail: float) -> dict[str, float]:
    """What the learner waited for between the step's start `t0` and its rollouts at `t_ready`:
    the step's job (in the background since it was launched) until `t_job`, generating until its
    last sample, then scoring what was left (for `score_tail` seconds); then the refill rounds.
    With the push (`time_sync_s`), the learner's whole wait."""
    generation = min(max(t_job - score_tail - t0, 0.0), t_job - t0)
    return {"time_wait_generation_s": generation, "time_wait_scoring_s": t_job - t0 - generation, "time_wait_refill_s": t_ready - t_job}


def push_weights(rollouts_group: RolloutGroup, learner: LearnerGroup) -> dict:
    """Push the learner's weights; if a worker died during the push, wait for it and push again
    (a learner rank that died is not waited for: LearnerError)."""
    try:
        return rollouts_group.push()
    except WeightSyncError as e:
        learner.check_alive("the weight push")
        tqdm.write(f"weight push failed ({e}); recovering the rollout workers")
        rollouts_group.recover()
        return rollouts_group.push()


class NonFiniteError(RuntimeError):
    """Too many steps in a row had a non-finite loss or gradient norm (the run stops)."""


class SkippedSteps:
    """Steps the learner did not take for a non-finite loss or gradient norm (Learner._step_engine
    drops them: the weights stay as they were, nothing is pushed); `limit` in a row stop the run."""

    def __init__(self, limit: int, checkpoints: Path):
        self.limit, self.checkpoints, self.in_row = limit, checkpoints, []

    def applied(self, phase: str, step: int, stats: dict, optimizer_steps: int) -> bool:
        """Whether the step changed the weights (`check` raises once too many in a row did not)."""
        skipped = int(stats.get("skipped_optimizer_steps") or 0)
        if not skipped:
            self.in_row = []
            return True
        self.in_row.append(step)
        tqdm.write(f"[{phase} step {step}] {skipped} of {optimizer_steps} optimizer steps skipped: non-finite loss or "
                   f"gradient norm (loss {stats.get('loss', stats.get('sft_loss'))}, grad_norm {stats.get('grad_norm')}); those were not taken")
        return skipped < optimizer_steps

    def check(self, phase: str) -> None:
        """Raise NonFiniteError when `limit` steps in a row were skipped."""
        if len(self.in_row) >= self.limit:
            last = latest_checkpoint(self.checkpoints)
            raise NonFiniteError(
                f"{phase} steps {self.in_row[0]}-{self.in_row[-1]}: {len(self.in_row)} steps in a row had a non-finite loss or gradient norm "
                f"(train.max_skipped_steps {self.limit}); the run stops with the weights of before them. "
                + (f"The last checkpoint, {last}, is intact: `--resume` continues from it (after lowering learner.lr, "
                   "or fixing what makes the rewards or advantages non-finite)." if last else "No checkpoint was written yet."))


def train(config: Config, resume: bool = False, overwrite: bool = False, verbose: bool = False) -> dict:
    """Train into `train.output_dir`: a new directory, or with `resume` one whose run continues,
    or with `overwrite` one whose run is replaced. What can be checked is checked before anything
    is written there, and a live run's directory is never taken (coderloo/rundir.py). The
    terminal shows the run's own lines; the libraries' and actors' go to its logs/ (unless
    `verbose`; coderloo/console.py)."""
    check_installed(config.train.loggers)
    out = resolve(config.train.output_dir)
    tasks = load_tasks(config.tasks)
    with RunConsole(verbose) as console:
        model_path = prepare_model(config)
        check_local_resources(config)
        lock = claim(out, resume, overwrite)
        console.log_to(out / "logs")
        try:
            return run(config, resume, out, tasks, model_path, console)
        finally:
            lock.release()


def run(config: Config, resume: bool, out: Path, tasks, model_path: Path, console: RunConsole) -> dict:
    """The run's stages, one call each: set-up, the SFT phase (or the resume from the last
    checkpoint), the RL steps, then the final evaluation and checkpoint."""
    checkpoint, state = resume_point(out / "checkpoints") if resume else (None, None)
    out.mkdir(parents=True, exist_ok=True)
    dump_config(config, out / "config.yaml")
    metrics = RunLog(config, out, resume_from=state["step"] if state else None)
    try:
        samples_log = MetricsLog(out / "samples.jsonl", resume_from=state["step"] if state else None)
        rng = random.Random(config.train.seed)
        tokenizer = load_tokenizer(model_path)
        with started(config, str(model_path), tokenizer, console, run=out.name, lora_rank=config.learner.pushed_adapter_rank) as actors:
            trainer = Trainer(config, out, actors, tokenizer, tasks, metrics, samples_log, rng)
            if state is None:
                trainer.evals["base"] = trainer.evaluate("base", 0)
                trainer.sft()
                trainer.evals["after_sft"] = trainer.evaluate("rl", 0) if config.sft.steps else trainer.base_again()
            else:
                trainer.resume(checkpoint, state)
            trainer.rl()
            return trainer.finish()
    finally:
        metrics.close()


def resume_point(checkpoints: Path) -> tuple[Path, dict]:
    """The latest checkpoint under `checkpoints` and the controller's state in it."""
    checkpoint = latest_checkpoint(checkpoints)
    if checkpoint is None:
        raise FileNotFoundError(f"--resume: no checkpoint in {checkpoints} (nothing to resume)")
    return checkpoint, read_state(checkpoint)


class Trainer:
    """One run's stages on its started actors: evaluation, the SFT phase, the resume, the RL steps
    (each one call per stage: rollouts, batch, learner step and push, metrics) and the finish."""

    def __init__(self, config: Config, out: Path, actors: Actors, tokenizer, tasks, metrics: RunLog, samples_log: MetricsLog,
                 rng: random.Random):
        self.config, self.out, self.actors, self.tokenizer = config, out, actors, tokenizer
        self.train_tasks, self.eval_tasks = tasks
        self.metrics, self.samples_log, self.rng = metrics, samples_log, rng
        self.checkpoints = out / "checkpoints"
        self.monitor = RunMetrics(out.name)
        self.resources = ResourceSampler(out) if config.train.resources_every else None  # the soak's series (coderloo/ops/soak.py)
        self.draw = TaskDraw(self.train_tasks, config.train.prompts_per_step, config.curriculum, rng)
        self.skips = SkippedSteps(config.train.max_skipped_steps, self.checkpoints)
        self.evals: dict[str, dict] = {}
        self.jobs: deque[Job] = deque()
        self.replay: GroupReplay | None = None
        self.pool = GroupPool() if config.train.partial_rollouts else None
        self.stream: GroupStream | None = None  # the step's groups going into the learner (train.stream_groups)
        self.launches = 0  # the pool's, for their seeds
        self.dropped: list[str] = []  # the tasks of the groups the pool dropped this step
        self.first_step = self.next_launch = 1
        self.run_start = time.time()

    def evaluate(self, stage: str, step: int) -> dict[str, float]:
        """The held-out evaluation, into metrics.jsonl and the run's metrics."""
        config, actors = self.config, self.actors
        result = evaluate(actors.strategy, self.eval_tasks, config.eval, config.rollout.max_new_tokens, config.rollout.stop,
                          seed=generation_seed(config, step, 1), critic=actors.critic, label=f"eval {stage} step {step}",
                          single=actors.single, random_choice=actors.random_choice)
        self.metrics.write("eval", step, stage=stage, version=actors.group.version, **result)
        self.monitor.eval_done(result)
        tqdm.write(f"[eval {stage} step {step}] " + " ".join(f"{k}={v:.3f}" for k, v in result.items() if not isinstance(v, dict)))
        return result

    def base_again(self) -> dict[str, float]:
        """Without SFT steps RL starts from the base policy: its evaluation, recorded again as RL's
        start rather than computed again (minutes on a real model)."""
        self.metrics.write("eval", 0, stage="rl", version=self.actors.group.version, **self.evals["base"])
        return self.evals["base"]

    def sft(self) -> None:
        """The SFT warm-up on reference solutions (and multi-turn demonstrations), its weights
        pushed; with LoRA from the RL phase on, the adapter starts on the SFT'd policy."""
        config, learner, group = self.config, self.actors.learner, self.actors.group
        examples = sft_examples(self.train_tasks, self.tokenizer, config.prompt)
        demos = []
        if config.sft.steps and config.sft.demonstrations:
            with working(f"building {config.env.name} demonstrations"):
                environment = make_environment(config.env, self.actors.rewards)
                demos = demonstrations(self.train_tasks, environment, config.env, self.tokenizer, config.prompt)
            tqdm.write(f"{len(demos)} multi-turn SFT examples ({config.env.name}) from {len(self.train_tasks)} training tasks")
        for step in tqdm(range(config.sft.steps), desc="sft", dynamic_ncols=True):
            stats = learner.sft_step(sft_batch(examples, demos, config.sft.batch_size, config.sft.demonstrations, self.rng))
            self.metrics.write("sft", step + 1, **stats)
            self.skips.applied("sft", step + 1, stats, 1)
            self.skips.check("sft")
        if config.sft.steps:
            group.push()
            if self.actors.critic is not None and config.critic.start == "sft":
                self.critic_from_policy()
            if config.learner.own_reference:
                learner.mix_reference(1.0)  # the KL reference is the policy RL starts from, as in TRL, OpenRLHF and verl
        if config.learner.lora is not None and config.learner.lora.start == "rl":
            learner.start_lora()  # the adapter starts on the SFT'd policy, which the engines now hold
            group.replan()

    def critic_from_policy(self) -> None:
        """critic.start sft: the critic starts on the SFT'd policy, written out once for it to read."""
        directory = Path(self.config.train.output_dir) / "critic_start"
        with working("starting the critic on the SFT'd policy"):
            self.actors.learner.save(str(directory))
            self.actors.critic.start_from(directory)
        shutil.rmtree(directory)

    def resume(self, checkpoint: Path, state: dict) -> None:
        """Weights, optimizer, data cursor, curriculum and generator from the checkpoint."""
        learner, group = self.actors.learner, self.actors.group
        if self.config.learner.lora is not None:
            learner.start_lora()  # the checkpoint's state is of the adapted policy
        learner.load_state(str(checkpoint))
        if self.actors.critic is not None:
            self.actors.critic.load(checkpoint)
        group.version = state["version"] - 1
        group.replan()
        group.push(catch_up=True)  # with LoRA on an SFT'd base: that base, then the adapter
        self.draw.load_state(state)
        self.evals = {"base": state["evals"]["base"], "after_sft": state["evals"]["after_sft"]}
        self.first_step = state["step"] + 1
        tqdm.write(f"resumed from {checkpoint} at RL step {state['step']}, policy version {state['version']}")

    def rl(self) -> None:
        """The RL steps, with up to 1 + max_staleness steps' rollouts in flight while the learner
        trains; held-out evaluations and checkpoints between them."""
        train = self.config.train
        self.replay = GroupReplay(train.replay_groups, train.replay_capacity) if train.replay_groups else None
        self.next_launch, self.run_start = self.first_step, time.time()
        bar = tqdm(range(self.first_step, train.steps + 1), desc="rl", dynamic_ncols=True, initial=self.first_step - 1, total=train.steps)
        for step in bar:
            record = self.step(step)
            bar.set_postfix(reward=f"{record['reward_mean']:.3f}", pass_rate=f"{record['pass_rate']:.2f}", samples_s=f"{record['samples_per_s']:.0f}")
            if train.eval_every and step % train.eval_every == 0 and step != train.steps:
                self.evaluate("rl", step)
            if train.checkpoint_every and step % train.checkpoint_every == 0 and step != train.steps:
                self.save_checkpoint(step)

    def step(self, step: int) -> dict:
        """One RL step; its line of metrics.jsonl."""
        t0 = time.time()
        rollouts, waited = self.rollouts(step, t0)
        t_ready = time.time()
        for group in rollouts.groups:
            self.draw.update(group[0].task.id, sum(t.outcome.passed for t in group) / len(group))
        batch, sequences, critic_step = self.batch(step, rollouts)
        rollout_summary = rollouts.summary(self.actors.group.version)
        stats, t_learn, sync = self.learn(step, batch, sequences)
        learn = self.config.learner
        record = step_record(step, t0, t_ready, t_learn, self.run_start, self.first_step, self.actors.group.version, rollout_summary,
                             rollouts.metrics, batch.metrics, stats, sync, self.actors.rewards.retries,
                             critic_step.metrics() if critic_step else {}, kl_coef=learn.kl_coef_at(step),
                             temperature=self.config.rollout.temperature_at(step), curriculum_level=self.draw.curriculum.level,
                             rollout_workers_stuck=self.actors.group.stuck, **waited)
        self.log_step(step, record, rollouts, batch)
        return record

    def rollouts(self, step: int, t0: float) -> tuple[Rollouts, dict[str, float]]:
        """Step `step`'s k trajectories per task (each turn tagged with the policy version that
        made it), scored by the reward service as they are made, in the background; the steps
        up to max_staleness ahead are launched first (with partial rollouts, the pool's groups
        instead: `pooled`). With dynamic sampling, more prompts while too few groups are
        informative. Also what the learner waited for since `t0`, the step's
        start (`waits`)."""
        config, train = self.config, self.config.train
        if self.pool is not None:
            rollouts = self.pooled(step, t0)
        else:
            while self.next_launch <= train.steps and len(self.jobs) <= train.max_staleness:
                tasks, seed = self.draw.draw(), generation_seed(config, self.next_launch, 0)
                scored = queue.SimpleQueue() if train.stream_groups else None
                done = (lambda index, group, scoring_s, scored=scored: scored.put((index, group))) if scored is not None else None
                run = in_background(self.actors.strategy.run, tasks, self.sampling(self.next_launch), seed, None, done)
                self.jobs.append(Job(self.next_launch, tasks, run, scored))
                self.next_launch += 1
            job = self.jobs.popleft()
            if job.scored is not None:
                self.stream = GroupStream(self.actors.learner, config, step, len(job.tasks))
                while not (job.rollouts.done() and job.scored.empty()):  # a run calls `done` for every group before it returns
                    try:
                        self.stream.add(*job.scored.get(timeout=0.05))
                    except queue.Empty:
                        self.stream.pump()
            rollouts = job.rollouts.result()
        t_job, tail = time.time(), rollouts.metrics.get("time_score_tail_s", 0.0)
        if not train.max_refill_rounds:
            return rollouts, waits(t0, t_job, t_job, tail)
        rollouts, refill_metrics = refill(rollouts, train.prompts_per_step, train.max_refill_rounds,
                                          lambda n, round_index: self.more_rollouts(step, n, round_index))
        return rollouts, {**refill_metrics, **waits(t0, t_job, time.time(), tail)}

    def pooled(self, step: int, t0: float) -> Rollouts:
        """Partial rollouts (coderloo/pool.py): the pool filled, then prompts_per_step groups scored
        within max_staleness of the weights this step trains (those at the bound first)."""
        train = self.config.train
        self.fill(step)
        taken, dropped = self.pool.take(train.prompts_per_step, self.actors.group.version, train.max_staleness, lambda: self.fill(step))
        self.dropped = [f.group[0].task.id for f in dropped]
        tail = taken[-1].scoring_s if taken[-1].at > t0 else 0.0  # scored before the step began: not waited for
        metrics = {"pool_dropped_groups": len(dropped), "pool_carried_groups": sum(f.launched < step for f in taken),
                   "pool_groups_in_flight": self.pool.holds(), "time_score_tail_s": tail}
        if self.config.env.multi_turn:  # of the groups taken (a launch's other measures span several steps)
            metrics.update(turn_metrics([t for f in taken for t in f.group], self.config.env))
        return Rollouts([f.group for f in taken], metrics)

    def fill(self, step: int) -> None:
        """Launch groups until the pool holds (1 + max_staleness) x prompts_per_step, or what this
        and the later steps will take; the tasks of a resumed checkpoint's unfinished groups first."""
        train = self.config.train
        size = min((1 + train.max_staleness) * train.prompts_per_step, (train.steps - step + 1) * train.prompts_per_step)
        wanted = size - self.pool.holds()
        if wanted <= 0:
            return
        tasks = self.draw.reissue()
        tasks += self.draw.draw(wanted - len(tasks)) if wanted > len(tasks) else []
        if not tasks:
            return
        params, seed = self.sampling(step), generation_seed(self.config, step, 1_000 + self.launches)
        self.launches += 1
        self.pool.launch(tasks, step, self.actors.group.version, lambda done: self.actors.strategy.run(tasks, params, seed, done=done))

    def sampling(self, step: int) -> GenerationParams:
        rollout = self.config.rollout
        return GenerationParams(n=rollout.samples_per_prompt, max_new_tokens=rollout.max_new_tokens,
                                temperature=rollout.temperature_at(step), top_p=rollout.top_p, stop=rollout.stop)

    def more_rollouts(self, step: int, n: int, round_index: int) -> Rollouts:
        """A refill round of step `step`: n more tasks (none when the draw has none left)."""
        tasks = self.draw.draw(n)
        return self.actors.strategy.run(tasks, self.sampling(step), generation_seed(self.config, step, 1 + round_index)) if tasks else Rollouts([])

    def batch(self, step: int, rollouts: Rollouts):
        """The batch: advantages within each task's group of k, per token, kept groups; and the
        sequences to learn from (with replayed groups), and the critic's step on the rollouts."""
        config, learn, actors = self.config, self.config.learner, self.actors
        samples = to_sequences(rollouts.groups, token_rewards=learn.dense_rewards, concat=config.env.train_as == "concat")
        kl_in_reward = learn.kl is not None and learn.kl.into == "reward" and learn.kl_coef_at(step) > 0
        ppo = learn.advantage.type == "ppo"
        if kl_in_reward or ppo:  # per token, from the learner as it is before this step
            samples.turn_kl, samples.turn_values = actors.learner.token_stats(samples.flat(), config.rollout.temperature_at(step),
                                                                              kl=kl_in_reward, values=ppo)
        critic_step = observe(actors.critic, rollouts) if actors.critic is not None else None  # it learns while the policy does
        critic_coef = config.critic.reward_coef if actors.critic is not None else 0.0
        if critic_coef > 0:
            samples.critic_p_passed = torch.tensor(critic_step.p_passed()).view(len(rollouts.groups), config.rollout.samples_per_prompt)
        batch = build_batch(samples, learn, step, critic_coef, max_new_tokens=config.rollout.max_new_tokens, turn_cost=config.env.turn_cost)
        sequences = batch.sequences + (self.replay.reuse(batch.groups) if self.replay is not None else [])
        return batch, sequences, critic_step

    def learn(self, step: int, batch, sequences: list) -> tuple[dict, float, dict]:
        """One learner step (the next steps' rollouts are being made meanwhile; with
        train.stream_groups, the step's streamed groups closed), then the new weights to the
        rollout workers; no step when every group was uniform."""
        learn, rollout = self.config.learner, self.config.rollout
        stats, sync = {}, {"sync_s": 0.0}
        if self.stream is not None:
            stats, self.stream = self.stream.close(batch, sequences), None
        elif len(sequences) >= learn.optimizer_steps * learn.num_ranks:
            stats = self.actors.learner.train_step(sequences, learn.loss, rollout.temperature_at(step), learn.loss_kl_coef(step),
                                                   rollout.max_new_tokens, learn.lr_at(step))
        t_learn = time.time()
        if stats and self.skips.applied("rl", step, stats, learn.optimizer_steps):
            sync = push_weights(self.actors.group, self.actors.learner)
        if learn.own_reference and learn.kl.reference_mix and step % learn.kl.reference_every == 0:
            self.actors.learner.mix_reference(learn.kl.reference_mix)
        return stats, t_learn, sync

    def log_step(self, step: int, record: dict, rollouts: Rollouts, batch) -> None:
        """The step's metrics, its resources now and then, and one group's samples to read what
        the policy writes; too many skipped steps in a row stop the run here."""
        train = self.config.train
        self.metrics.write("rl", step, **record)
        self.skips.check("rl")
        if self.resources is not None and step % train.resources_every == 0:
            self.metrics.write("resources", step, **self.resources.sample())
        self.monitor.step_done(step, record)
        shown = self.rng.randrange(len(rollouts.groups))
        group = rollouts.groups[shown]
        turns = {"turns": [[turn.text for turn in t.turns] for t in group]} if self.config.env.multi_turn else {}
        dropped = {"dropped": self.dropped} if self.pool is not None else {}
        self.samples_log.write("rl", step, task=group[0].task.id, completions=[t.turns[-1].text for t in group],
                               rewards=batch.rewards[shown].tolist(), feedback=[t.outcome.feedback for t in group],
                               trained=[g[0].task.id for g in rollouts.groups], **dropped, **turns)

    def save_checkpoint(self, step: int) -> None:
        """The learner's (and critic's) weights and optimizer, and the controller's state, as step_<step>."""
        in_flight = [self.pool.unfinished()] if self.pool is not None else [j.tasks for j in self.jobs]
        state = {"step": step, "version": self.actors.group.version, "evals": dict(self.evals), **self.draw.state(in_flight)}

        def write_model(directory: Path) -> None:
            self.actors.learner.save(str(directory), with_state=True)
            if self.actors.critic is not None:
                self.actors.critic.save(directory)

        write_checkpoint(self.checkpoints, f"step_{step}", write_model, state)
        prune_checkpoints(self.checkpoints, self.config.train.keep_checkpoints)

    def finish(self) -> dict:
        """The final evaluation and checkpoint (checkpoints/final), the plots, summary.json and the report."""
        steps = self.config.train.steps
        if self.pool is not None:
            self.pool.drain()  # the groups no step took: the evaluation has the engines alone
        final = self.evaluate("rl", steps)
        self.save_checkpoint(steps)
        final_link = self.checkpoints / "final"
        if final_link.is_symlink():
            final_link.unlink()
        elif final_link.exists():
            shutil.rmtree(final_link)
        final_link.symlink_to(f"step_{steps}")
        plot_training(self.out / "metrics.jsonl", self.out / "training.png")
        summary = {"base": self.evals["base"], "after_sft": self.evals["after_sft"], "final": final,
                   "policy_version": self.actors.group.version, "output_dir": str(self.out)}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        write_report(self.out)  # last: it shows summary.json too
        return summary


def step_record(step, t0, t_ready, t_learn, run_start, first_step, version, summary, rollout_metrics, batch_metrics,
                stats, sync, reward_retries, critic_metrics, **extra) -> dict:
    """One RL step's line of metrics.jsonl: what its rollouts were, the step's timeline (its
    rollouts overlap earlier steps' training; the rest is the controller's side), the learner's
    statistics."""
    now = time.time()
    dt = now - t0
    return {
        "version": version,
        **summary,
        **extra,
        "samples_per_s": summary["samples"] / dt,
        "samples_per_s_run": summary["samples"] * (step - first_step + 1) / (now - run_start),
        **rollout_metrics,
        "time_wait_rollouts_s": t_ready - t0,
        "time_learn_s": t_learn - t_ready,
        "time_sync_s": sync["sync_s"],
        "sync_bytes": sync.get("sync_bytes", 0),  # what the push moved: the weights, or a LoRA adapter
        # the learner's own time at the step's work (a streamed step's began before its rollouts were all in)
        "learner_idle_fraction": 1.0 - stats.get("time_learner_busy_s", t_learn - t_ready) / dt,
        "time_step_s": dt,
        "reward_requests_retried": reward_retries,
        **batch_metrics,
        **critic_metrics,
        **stats,
    }
