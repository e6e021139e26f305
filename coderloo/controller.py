"""The training loop: tasks -> trajectories (rollout strategy) -> batch (algorithm) -> learner step
-> weight push -> metrics.

It reads top to bottom on purpose; each stage is one call into the component that owns it.
"""
from __future__ import annotations

import json
import math
import random
import shutil
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import ray
import torch
from tqdm import tqdm

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
from coderloo.report import write_report
from coderloo.rundir import claim
from coderloo.runtime import REPO_ROOT, init_ray, metrics_endpoint
from coderloo.tasksets.loading import load_tasks
from coderloo.tasksets.synthetic import corpus_for_tokenizer
from common.hf import load_tokenizer
from common.progress import working
from learner.advantages import informative_groups
from learner.algorithm import build_batch, to_sequences
from learner.critic import OUTCOMES, OnlineCritic
from learner.group import LearnerGroup
from learner.replay import GroupReplay
from reward_service.client import RewardClient
from reward_service.schemas import ItemReward
from rollout_workers import GenerationParams, RolloutGroup, Rollouts, WeightSyncError, start_workers
from rollout_workers.config import PromptConfig
from rollout_workers.demonstrations import demonstrations
from rollout_workers.environments import make_environment
from rollout_workers.prompts import chat_answer, render, uses_chat_template
from rollout_workers.strategies import SingleAttempt, make_strategy


def resolve(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else REPO_ROOT / p


def prepare_model(config: Config) -> Path:
    path = resolve(config.model.path)
    if not (path / "config.json").exists():
        if not config.model.build_tiny:
            raise FileNotFoundError(f"model.path: no model at {path} (and model.build_tiny is false)")
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
    """The critic predicts, then learns, each trajectory's last program and its outcome."""
    trajectories = rollouts.trajectories()
    return critic.observe([t.task.id for t in trajectories], [t.turns[-1].prompt_ids for t in trajectories],
                          [t.turns[-1].token_ids for t in trajectories], [critic_label(t.outcome) for t in trajectories])


@dataclass
class Job:
    """One step's rollouts, made in a thread while the learner trains on an earlier step."""

    step: int
    tasks: list
    rollouts: Future


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
        starts_ray = not ray.is_initialized()
        try:
            return run(config, resume, out, tasks, model_path, console)
        finally:
            if starts_ray:  # whoever starts Ray stops it; inside the console, so its last notices go to the log
                ray.shutdown()
            lock.release()


def run(config: Config, resume: bool, out: Path, tasks, model_path: Path, console: RunConsole) -> dict:
    ckpt_root = out / "checkpoints"
    checkpoint = latest_checkpoint(ckpt_root) if resume else None
    if resume and checkpoint is None:
        raise FileNotFoundError(f"--resume: no checkpoint in {ckpt_root} (nothing to resume)")
    state = read_state(checkpoint) if checkpoint else None
    out.mkdir(parents=True, exist_ok=True)
    dump_config(config, out / "config.yaml")
    metrics = RunLog(config, out, resume_from=state["step"] if state else None)
    samples_log = MetricsLog(out / "samples.jsonl", resume_from=state["step"] if state else None)
    rng = random.Random(config.train.seed)

    # --- set-up: tasks, model, Ray actors ---
    train_tasks, eval_tasks = tasks
    tokenizer = load_tokenizer(model_path)
    init_ray(address=config.ray_address, metrics_export_port=config.metrics_export_port)
    console.attach_ray()
    monitor = RunMetrics(out.name)
    tqdm.write(f"run {out.name}: Ray metrics (Prometheus) at {metrics_endpoint()}; logs in {out / 'logs'}")
    rewards_service = RewardClient(config.reward)
    console.quiet_loggers()  # Serve's, set up as it started
    learner = LearnerGroup(str(model_path), config.learner, sft_lr=config.sft.lr, name=out.name)
    workers = start_workers(str(model_path), config.rollout, config.learner.seed, run=out.name,
                            lora_rank=config.learner.pushed_adapter_rank)
    rollouts_group = RolloutGroup(workers, config.rollout.weight_sync, config.rollout.stuck_timeout_s)
    strategy = make_strategy(rollouts_group, rewards_service, config.env, tokenizer, config.prompt)
    single = SingleAttempt(rollouts_group, rewards_service, tokenizer, config.prompt) if config.env.multi_turn else None
    critic = OnlineCritic(str(model_path), config.critic, config.train.seed, name=f"coderloo-critic-{out.name}") if config.critic.enabled else None
    try:
        rollouts_group.connect(learner.weight_sources)
        resources = ResourceSampler(out) if config.train.resources_every else None  # the soak's series (coderloo/ops/soak.py)
        rollout, learn = config.rollout, config.learner
        k = rollout.samples_per_prompt

        def run_eval(stage: str, step: int) -> dict[str, float]:
            result = evaluate(strategy, eval_tasks, config.eval, rollout.max_new_tokens, rollout.stop,
                              seed=generation_seed(config, step, 1), critic=critic, label=f"eval {stage} step {step}", single=single)
            metrics.write("eval", step, stage=stage, version=rollouts_group.version, **result)
            monitor.eval_done(result)
            tqdm.write(f"[eval {stage} step {step}] " + " ".join(f"{k}={v:.3f}" for k, v in result.items() if not isinstance(v, dict)))
            return result

        draw = TaskDraw(train_tasks, config.train.prompts_per_step, config.curriculum, rng)
        skips = SkippedSteps(config.train.max_skipped_steps, ckpt_root)
        if state is None:
            base = run_eval("base", 0)
            # --- SFT warm-up on reference solutions ---
            examples = sft_examples(train_tasks, tokenizer, config.prompt)
            demos = []
            if config.sft.steps and config.sft.demonstrations:
                with working(f"building {config.env.name} demonstrations"):
                    demos = demonstrations(train_tasks, make_environment(config.env, rewards_service), config.env, tokenizer, config.prompt)
                tqdm.write(f"{len(demos)} multi-turn SFT examples ({config.env.name}) from {len(train_tasks)} training tasks")
            for step in tqdm(range(config.sft.steps), desc="sft", dynamic_ncols=True):
                stats = learner.sft_step(sft_batch(examples, demos, config.sft.batch_size, config.sft.demonstrations, rng))
                metrics.write("sft", step + 1, **stats)
                skips.applied("sft", step + 1, stats, 1)
                skips.check("sft")
            if config.sft.steps:
                rollouts_group.push()
            if learn.lora is not None and learn.lora.start == "rl":
                learner.start_lora()  # the adapter starts on the SFT'd policy, which the engines now hold
                rollouts_group.replan()
            after_sft = run_eval("rl", 0)
            first_step = 1
        else:
            # --- resume: weights, optimizer, data cursor, curriculum and generator from the checkpoint ---
            if learn.lora is not None:
                learner.start_lora()  # the checkpoint's state is of the adapted policy
            learner.load_state(str(checkpoint))
            if critic is not None:
                critic.load(checkpoint)
            rollouts_group.version = state["version"] - 1
            rollouts_group.replan()
            rollouts_group.push(catch_up=True)  # with LoRA on an SFT'd base: that base, then the adapter
            draw.load_state(state)
            base, after_sft = state["evals"]["base"], state["evals"]["after_sft"]
            first_step = state["step"] + 1
            tqdm.write(f"resumed from {checkpoint} at RL step {state['step']}, policy version {state['version']}")

        jobs: deque[Job] = deque()

        def save_checkpoint(step: int, name: str) -> None:
            controller_state = {"step": step, "version": rollouts_group.version, "evals": {"base": base, "after_sft": after_sft},
                                **draw.state([j.tasks for j in jobs])}

            def write_model(directory: Path) -> None:
                learner.save(str(directory), with_state=True)
                if critic is not None:
                    critic.save(directory)

            write_checkpoint(ckpt_root, name, write_model, controller_state)
            prune_checkpoints(ckpt_root, config.train.keep_checkpoints)

        def sampling(step: int) -> GenerationParams:
            return GenerationParams(n=k, max_new_tokens=rollout.max_new_tokens, temperature=rollout.temperature_at(step),
                                    top_p=rollout.top_p, stop=rollout.stop)

        def more_rollouts(step: int, n: int, round_index: int) -> Rollouts:
            """A refill round of step `step`: n more tasks (none when the draw has none left)."""
            tasks = draw.draw(n)
            return strategy.run(tasks, sampling(step), generation_seed(config, step, 1 + round_index)) if tasks else Rollouts([])

        replay = GroupReplay(config.train.replay_groups, config.train.replay_capacity) if config.train.replay_groups else None
        critic_coef = config.critic.reward_coef if critic is not None else 0.0

        # --- RL: up to 1 + max_staleness steps' rollouts in flight while the learner trains ---
        next_launch = first_step
        run_start = time.time()
        bar = tqdm(range(first_step, config.train.steps + 1), desc="rl", dynamic_ncols=True, initial=first_step - 1, total=config.train.steps)
        for step in bar:
            t0 = time.time()
            # 1. k trajectories per task (each turn tagged with the policy version that made it),
            #    scored by the reward service as they are made, in the background
            while next_launch <= config.train.steps and len(jobs) <= config.train.max_staleness:
                tasks = draw.draw()
                jobs.append(Job(next_launch, tasks, in_background(strategy.run, tasks, sampling(next_launch), generation_seed(config, next_launch, 0))))
                next_launch += 1
            rollouts = jobs.popleft().rollouts.result()
            temperature, refill_metrics = rollout.temperature_at(step), {}
            if config.train.max_refill_rounds:  # more prompts while too few groups are informative
                rollouts, refill_metrics = refill(rollouts, config.train.prompts_per_step, config.train.max_refill_rounds,
                                                  lambda n, round_index, step=step: more_rollouts(step, n, round_index))
            t_ready = time.time()
            for group in rollouts.groups:
                draw.update(group[0].task.id, sum(t.outcome.passed for t in group) / len(group))

            # 2. the batch: advantages within each task's group of k, per token, kept groups
            samples = to_sequences(rollouts.groups, token_rewards=learn.dense_rewards, concat=config.env.train_as == "concat")
            kl_in_reward = learn.kl is not None and learn.kl.into == "reward" and learn.kl_coef_at(step) > 0
            ppo = learn.advantage.type == "ppo"
            if kl_in_reward or ppo:  # per token, from the learner as it is before this step
                samples.turn_kl, samples.turn_values = learner.token_stats(samples.flat(), temperature, kl=kl_in_reward, values=ppo)
            critic_step = observe(critic, rollouts) if critic is not None else None  # it learns while the policy does
            if critic_coef > 0:
                samples.critic_p_passed = torch.tensor(critic_step.p_passed()).view(len(rollouts.groups), k)
            batch = build_batch(samples, learn, step, critic_coef, max_new_tokens=rollout.max_new_tokens, turn_cost=config.env.turn_cost)
            sequences = batch.sequences + (replay.reuse(batch.groups) if replay is not None else [])
            rollout_summary = rollouts.summary(rollouts_group.version)

            # 3. one learner step (the next step's rollouts are being made meanwhile),
            # 4. new weights to the rollout workers
            stats, sync = {}, {"sync_s": 0.0}
            if len(sequences) >= learn.optimizer_steps * learn.num_ranks:  # else every group was uniform
                stats = learner.train_step(sequences, learn.loss, temperature, learn.loss_kl_coef(step), rollout.max_new_tokens)
            t_learn = time.time()
            if stats and skips.applied("rl", step, stats, learn.optimizer_steps):
                sync = push_weights(rollouts_group, learner)

            # 5. metrics, evaluation, checkpoint
            record = step_record(step, t0, t_ready, t_learn, run_start, first_step, rollouts_group.version, rollout_summary,
                                 rollouts.metrics, batch.metrics, stats, sync, rewards_service.retries,
                                 critic_step.metrics() if critic_step else {}, kl_coef=learn.kl_coef_at(step),
                                 temperature=temperature, curriculum_level=draw.curriculum.level,
                                 rollout_workers_stuck=rollouts_group.stuck, **refill_metrics)
            metrics.write("rl", step, **record)
            skips.check("rl")
            if resources is not None and step % config.train.resources_every == 0:
                metrics.write("resources", step, **resources.sample())
            monitor.step_done(step, record)
            shown = rng.randrange(len(rollouts.groups))  # one group per step, to read what the policy writes
            group = rollouts.groups[shown]
            turns = {"turns": [[turn.text for turn in t.turns] for t in group]} if config.env.multi_turn else {}
            samples_log.write("rl", step, task=group[0].task.id, completions=[t.turns[-1].text for t in group],
                              rewards=batch.rewards[shown].tolist(), feedback=[t.outcome.feedback for t in group], **turns)
            bar.set_postfix(reward=f"{record['reward_mean']:.3f}", pass_rate=f"{record['pass_rate']:.2f}", samples_s=f"{record['samples_per_s']:.0f}")
            if config.train.eval_every and step % config.train.eval_every == 0 and step != config.train.steps:
                run_eval("rl", step)
            if config.train.checkpoint_every and step % config.train.checkpoint_every == 0 and step != config.train.steps:
                save_checkpoint(step, f"step_{step}")

        final = run_eval("rl", config.train.steps)
        save_checkpoint(config.train.steps, f"step_{config.train.steps}")
        final_link = ckpt_root / "final"
        if final_link.is_symlink():
            final_link.unlink()
        elif final_link.exists():
            shutil.rmtree(final_link)
        final_link.symlink_to(f"step_{config.train.steps}")
        plot_training(out / "metrics.jsonl", out / "training.png")
        summary = {"base": base, "after_sft": after_sft, "final": final, "policy_version": rollouts_group.version, "output_dir": str(out)}
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        write_report(out)  # last: it shows summary.json too
    finally:
        console.ending()
        learner.kill()
        if critic is not None:
            critic.kill()
        for actor in workers:
            ray.kill(actor)
        rewards_service.close()
        metrics.close()
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
        "learner_idle_fraction": 1.0 - (t_learn - t_ready) / dt,
        "time_step_s": dt,
        "reward_requests_retried": reward_retries,
        **batch_metrics,
        **critic_metrics,
        **stats,
    }
