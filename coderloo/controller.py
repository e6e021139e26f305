"""The training loop: prompts -> rollouts -> rewards -> advantages -> learner step -> weight push.

It reads top to bottom on purpose; each stage is one call into the component that owns it.
"""
from __future__ import annotations

import json
import random
import shutil
import time
from collections import deque
from dataclasses import replace
from pathlib import Path

import ray
import torch
from torch.nn.utils.rnn import pad_sequence
from tqdm import tqdm

from coderloo.checkpoint import latest_checkpoint, read_state, write_checkpoint
from coderloo.config import Config, dump_config
from coderloo.curriculum import Curriculum
from coderloo.evaluation import evaluate
from coderloo.pipeline import RolloutJob
from coderloo.metrics import MetricsLog, RunMetrics, plot_training
from coderloo.models import build_tiny_model, load_tokenizer
from coderloo.runtime import REPO_ROOT, init_ray, metrics_endpoint
from coderloo.tasksets.loading import load_tasks
from coderloo.tasksets.synthetic import corpus_for_tokenizer
from learner.advantages import compute_advantages, dense_advantages, informative_groups, whiten
from learner.batch import TrainSequence
from learner.critic import OnlineCritic
from learner.group import LearnerGroup
from reward_service.client import RewardClient
from rollout_workers import GenerationParams, RolloutGroup, WeightSyncError, start_workers


def resolve(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else REPO_ROOT / p


def prepare_model(config: Config) -> Path:
    path = resolve(config.model.path)
    if not (path / "config.json").exists():
        if not config.model.build_tiny:
            raise FileNotFoundError(f"model.path: no model at {path} (and model.build_tiny is false)")
        build_tiny_model(path, corpus_for_tokenizer(), config.model.tiny)
    return path


def sft_examples(tasks, tokenizer) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, reference completion ids + EOS) for every task."""
    examples = []
    for task in tasks:
        completion = task.reference[len(task.prompt):] if task.prompt_is_code else task.reference
        prompt_ids = tokenizer(task.prompt)["input_ids"]
        completion_ids = tokenizer(completion)["input_ids"] + [tokenizer.eos_token_id]
        examples.append((prompt_ids, completion_ids))
    return examples


def generation_seed(config: Config, step: int, purpose: int) -> int:
    """The sampling seed of one generation call: the same step of the same run draws the same
    samples, whether or not the run was resumed in between."""
    return (config.train.seed * 1_000_003 + step * 7919 + purpose * 104_729) % (2**31 - 1_000)


class TemperatureSchedule:
    """The sampling temperature at an RL step: constant, or piecewise linear between
    (step, temperature) points (RLlib's PiecewiseSchedule)."""

    def __init__(self, constant: float, points: list[tuple[int, float]] | None):
        self.constant = constant
        self.schedule = None
        if points:
            from ray.rllib.utils.schedules import PiecewiseSchedule

            self.schedule = PiecewiseSchedule(points, outside_value=points[-1][1], framework=None)

    def __call__(self, step: int) -> float:
        return self.constant if self.schedule is None else float(self.schedule.value(step))


class GroupReplay:
    """Reuse of high-advantage groups from earlier steps, through RLlib's prioritized replay buffer
    (priority: a group's mean absolute advantage). Replayed samples are off-policy; the clipped
    ratio and truncated importance sampling against their sampler's logprobs account for it."""

    def __init__(self, groups_per_step: int, capacity: int):
        from ray.rllib.utils.replay_buffers import PrioritizedReplayBuffer

        self.buffer = PrioritizedReplayBuffer(capacity=capacity, alpha=0.6)
        self.groups_per_step, self.capacity = groups_per_step, capacity
        self.store: dict[int, list[TrainSequence]] = {}
        self.added = 0

    def reuse(self, groups: list[list[TrainSequence]]) -> list[TrainSequence]:
        """Sequences of `groups_per_step` replayed groups; then `groups` join the buffer."""
        from ray.rllib.policy.sample_batch import SampleBatch

        replayed = []
        if len(self.store) >= self.groups_per_step:
            sample = self.buffer.sample(self.groups_per_step, beta=0.4)
            replayed = [seq for key in sample["group"] for seq in self.store[int(key)]]
        for group in groups:
            self.store[self.added] = group
            self.buffer.add(SampleBatch({"group": [self.added]}), weight=sum(abs(s.advantage) for s in group) / len(group) + 1e-6)
            self.store.pop(self.added - self.capacity, None)  # overwritten in the buffer
            self.added += 1
        return replayed


def push_weights(rollouts_group: RolloutGroup) -> dict:
    """Push the learner's weights; if a worker died during the push, wait for it and push again."""
    try:
        return rollouts_group.push()
    except WeightSyncError as e:
        tqdm.write(f"weight push failed ({e}); recovering the rollout workers")
        rollouts_group.recover()
        return rollouts_group.push()


def train(config: Config, resume: bool = False) -> dict:
    out = resolve(config.train.output_dir)
    ckpt_root = out / "checkpoints"
    checkpoint = latest_checkpoint(ckpt_root) if resume else None
    if resume and checkpoint is None:
        raise FileNotFoundError(f"--resume: no checkpoint in {ckpt_root} (nothing to resume)")
    state = read_state(checkpoint) if checkpoint else None
    out.mkdir(parents=True, exist_ok=True)
    dump_config(config, out / "config.yaml")
    metrics = MetricsLog(out / "metrics.jsonl", resume_from=state["step"] if state else None)
    samples_log = MetricsLog(out / "samples.jsonl", resume_from=state["step"] if state else None)
    rng = random.Random(config.train.seed)

    # --- set-up: tasks, model, Ray actors ---
    train_tasks, eval_tasks = load_tasks(config.tasks)
    by_id = {t.id: t for t in train_tasks}
    model_path = prepare_model(config)
    tokenizer = load_tokenizer(model_path)
    init_ray(address=config.ray_address, metrics_export_port=config.metrics_export_port)
    monitor = RunMetrics(out.name)
    tqdm.write(f"run {out.name}: Ray metrics (Prometheus) at {metrics_endpoint()}")
    rewards_service = RewardClient(config.reward)
    learner = LearnerGroup(str(model_path), config.learner, config.rollout.temperature, sft_lr=config.sft.lr, name=out.name)
    workers = start_workers(str(model_path), config.rollout, config.learner.seed, run=out.name)
    rollouts_group = RolloutGroup(workers, config.rollout.weight_sync.settings())
    critic = OnlineCritic(str(model_path), config.critic, config.train.seed, name=f"coderloo-critic-{out.name}") if config.critic.enabled else None
    try:
        rollouts_group.connect(learner.weight_sources)
        rollout = config.rollout
        k = rollout.samples_per_prompt
        params = GenerationParams(n=k, max_new_tokens=rollout.max_new_tokens, temperature=rollout.temperature, top_p=rollout.top_p, stop=rollout.stop)

        def run_eval(stage: str, step: int) -> dict[str, float]:
            result = evaluate(
                rollouts_group, rewards_service, eval_tasks, n=config.eval.samples_per_task, ks=config.eval.k,
                temperature=config.eval.temperature, max_new_tokens=rollout.max_new_tokens, stop=rollout.stop,
                greedy=config.eval.greedy, seed=generation_seed(config, step, 1), critic=critic,
                refinement=config.refine if config.refine.enabled else None,
            )
            metrics.write("eval", step, stage=stage, version=rollouts_group.version, **result)
            monitor.eval_done(result)
            tqdm.write(f"[eval {stage} step {step}] " + " ".join(f"{k}={v:.3f}" for k, v in result.items()))
            return result

        curriculum = Curriculum(train_tasks, config.curriculum, rng)
        order: list = []
        pending_tasks: list[list[str]] = []  # tasks of steps in flight at the checkpoint (redone on resume)
        if state is None:
            base = run_eval("base", 0)
            # --- SFT warm-up on reference solutions ---
            examples = sft_examples(train_tasks, tokenizer)
            for step in tqdm(range(config.sft.steps), desc="sft", dynamic_ncols=True):
                batch = rng.sample(examples, min(config.sft.batch_size, len(examples)))
                metrics.write("sft", step + 1, **learner.sft_step(batch))
            if config.sft.steps:
                rollouts_group.push()
            after_sft = run_eval("rl", 0)
            first_step = 1
        else:
            # --- resume: weights, optimizer, data cursor, curriculum and generator from the checkpoint ---
            learner.load_state(str(checkpoint))
            if critic is not None:
                critic.load(checkpoint)
            rollouts_group.version = state["version"] - 1
            rollouts_group.push()
            rng.setstate(_to_tuple(state["rng_state"]))
            order = [by_id[i] for i in state["order"]]
            curriculum.load_state(state["curriculum"])
            pending_tasks = state["in_flight"]
            base, after_sft = state["evals"]["base"], state["evals"]["after_sft"]
            first_step = state["step"] + 1
            tqdm.write(f"resumed from {checkpoint} at RL step {state['step']}, policy version {state['version']}")

        def draw_tasks() -> list:
            nonlocal order
            n = config.train.prompts_per_step
            if pending_tasks:
                return [by_id[i] for i in pending_tasks.pop(0)]
            if config.curriculum.enabled:
                return curriculum.draw(n)
            if len(order) < n:
                order += rng.sample(train_tasks, len(train_tasks))
            tasks, order = order[:n], order[n:]
            return tasks

        jobs: deque[RolloutJob] = deque()

        def save_checkpoint(step: int, name: str) -> None:
            controller_state = {
                "step": step, "version": rollouts_group.version, "order": [t.id for t in order],
                "rng_state": rng.getstate(), "evals": {"base": base, "after_sft": after_sft},
                "curriculum": curriculum.state(), "in_flight": [[t.id for t in j.result.tasks] for j in jobs],
            }
            def write_model(directory: Path) -> None:
                learner.save(str(directory), with_state=True)
                if critic is not None:
                    critic.save(directory)

            write_checkpoint(ckpt_root, name, write_model, controller_state)

        replay = GroupReplay(config.train.replay_groups, config.train.replay_capacity) if config.train.replay_groups else None

        # --- RL: up to 1 + max_staleness steps' rollouts in flight while the learner trains ---
        learn = config.learner
        temperature = TemperatureSchedule(rollout.temperature, rollout.temperature_schedule)
        next_launch = first_step
        run_start = time.time()
        bar = tqdm(range(first_step, config.train.steps + 1), desc="rl", dynamic_ncols=True, initial=first_step - 1, total=config.train.steps)
        for step in bar:
            t0 = time.time()
            # 1. k samples per prompt (tagged with the policy version that made them), each group
            #    scored in the sandbox pool as soon as it is finished, in the background
            while next_launch <= config.train.steps and len(jobs) <= config.train.max_staleness:
                step_params = replace(params, temperature=temperature(next_launch))
                jobs.append(RolloutJob(next_launch, draw_tasks(), rollouts_group, rewards_service, step_params,
                                       generation_seed(config, next_launch, 0), config.refine if config.refine.enabled else None))
                next_launch += 1
            job = jobs.popleft()
            batch = job.wait()
            t_ready = time.time()
            tasks, rollouts = batch.tasks, batch.rollouts
            flat = [(task, s) for task, r in zip(tasks, rollouts) for s in r.samples]
            rewards = batch.first_rewards()
            step_temperature = temperature(step)

            # 2. advantages within each prompt's group of k (the reward net of KL, if configured)
            sequences = [TrainSequence(r.prompt_ids, s.token_ids, s.logprobs, 0.0) for r in rollouts for s in r.samples]
            # with refinement, a sample is a trajectory of attempts: its last reward is its outcome, and
            # its later attempts, as (trajectory, sequence), train with its advantage
            later = [(t, TrainSequence(a.prompt_ids, a.sample.token_ids, a.sample.logprobs, 0.0)) for t, attempts in enumerate(batch.later) for a in attempts]
            reward_matrix = torch.tensor([r.total for r in batch.final_rewards()]).view(len(tasks), k)
            passed = torch.tensor([float(r.passed) for r in rewards]).view(len(tasks), k)
            for task, rate in zip(tasks, passed.mean(dim=1).tolist()):
                curriculum.update(task.id, rate)
            kl_coef = learn.kl_coef_at(step)
            extra = {}
            if learn.kl_in == "reward" and kl_coef > 0:
                seq_kl = torch.tensor(learner.sequence_kl(sequences + [seq for _, seq in later], step_temperature))
                if later:  # a trajectory's KL is the sum over its attempts
                    seq_kl = seq_kl[: len(sequences)].index_add(0, torch.tensor([t for t, _ in later]), seq_kl[len(sequences) :])
                seq_kl = seq_kl.view(len(tasks), k)
                reward_matrix = reward_matrix - kl_coef * seq_kl
                extra["kl_sequence_mean"] = float(seq_kl.mean())
            if critic is not None:
                # predicted before the critic learns from these samples; it learns while the policy does
                critic_step = critic.observe(tasks, rollouts, [r.status for r in rewards])
                if config.critic.reward_coef > 0:
                    reward_matrix = reward_matrix + config.critic.reward_coef * torch.tensor(critic_step.p_passed()).view(len(tasks), k)
            advantages = compute_advantages(learn.advantage_estimator, reward_matrix)
            keep = informative_groups(reward_matrix) if learn.filter_uninformative and learn.advantage_estimator != "reinforce" else torch.ones(len(tasks), dtype=torch.bool)
            if learn.dense_rewards:
                # per token: the RLOO advantage plus the leave-one-out reward-to-go of the service's
                # per-token rewards, whitened over the kept groups' tokens
                token_rewards = pad_sequence([torch.tensor(r) for r in batch.token_rewards()], batch_first=True).view(len(tasks), k, -1)
                lengths = torch.tensor([len(s.token_ids) for _, s in flat]).view(len(tasks), k, 1)
                mask = torch.arange(token_rewards.shape[-1]) < lengths
                token_advantages = dense_advantages(advantages, token_rewards, mask, learn.dense_coef, learn.dense_gamma)
                extra["dense_advantage_abs_mean"] = float((token_advantages - advantages.unsqueeze(-1))[mask].abs().mean())
                if learn.normalize_advantages and keep.any():
                    kept_tokens = mask & keep.view(-1, 1, 1)
                    token_advantages[kept_tokens] = whiten(token_advantages[kept_tokens])
                for seq, adv, n in zip(sequences, token_advantages.flatten(0, 1), lengths.flatten().tolist()):
                    seq.token_advantages = adv[:n].tolist()
            if learn.normalize_advantages and keep.any():
                advantages[keep] = whiten(advantages[keep])
            for i, a in enumerate(advantages.flatten().tolist()):
                sequences[i].advantage = a
            for t, seq in later:
                seq.advantage = sequences[t].advantage
            groups = [sequences[g * k : (g + 1) * k] + [seq for t, seq in later if t // k == g] for g in range(len(tasks))]
            kept = [seq for g, group_keep in enumerate(keep.tolist()) if group_keep for seq in groups[g]]
            if replay is not None:
                kept += replay.reuse([groups[g] for g, group_keep in enumerate(keep.tolist()) if group_keep])
            if config.refine.enabled:
                rates = batch.pass_rates_by_round(config.refine.rounds)
                extra.update({f"pass_rate_round{r}": rate for r, rate in enumerate(rates, start=1)})
                extra.update(rounds_mean=1 + len(later) / len(sequences), time_refine_s=batch.refined - batch.scored)

            # 3. one learner step (the next step's rollouts are being made meanwhile),
            # 4. new weights to the rollout workers
            stats: dict = {}
            sync = {"sync_s": 0.0}
            staleness = [rollouts_group.version - s.policy_version for _, s in flat]
            if len(kept) >= learn.optimizer_steps * learn.num_ranks:
                stats = learner.train_step(kept, kl_coef if learn.kl_in == "loss" else 0.0, step_temperature)
                t_learn = time.time()
                sync = push_weights(rollouts_group)
            else:
                t_learn = time.time()  # nothing to learn from: every group was uniform
            if critic is not None:
                extra.update(critic_step.metrics())  # waits for the critic's update, if it lags
            dt = time.time() - t0

            record = {
                "version": rollouts_group.version,
                "reward_mean": float(torch.tensor([r.total for r in rewards]).mean()),
                "pass_rate": sum(r.passed for r in rewards) / len(rewards),
                "syntax_rate": sum(r.components.syntax for r in rewards) / len(rewards),
                "completion_tokens_mean": sum(len(s.token_ids) for _, s in flat) / len(flat),
                "groups_filtered": int((~keep).sum()),
                "kl_coef": kl_coef,
                "temperature": step_temperature,
                "staleness_mean": sum(staleness) / len(staleness),
                "staleness_max": max(staleness),
                "curriculum_level": curriculum.level,
                "samples": len(flat),
                "samples_per_s": len(flat) / dt,
                "samples_per_s_run": len(flat) * (step - first_step + 1) / (time.time() - run_start),
                # the step's timeline: its rollouts (which overlap earlier steps' training) ...
                "time_generate_s": batch.generated - batch.started,
                "time_score_tail_s": batch.scored - batch.generated,
                "rollout_retries": batch.retries,
                # ... and the controller's (learner's) side of this step
                "time_wait_rollouts_s": t_ready - t0,
                "time_learn_s": t_learn - t_ready,
                "time_sync_s": sync["sync_s"],
                "learner_idle_fraction": 1.0 - (t_learn - t_ready) / dt,
                "time_step_s": dt,
                "reward_requests_retried": rewards_service.retries,
                **extra,
                **stats,
            }
            metrics.write("rl", step, **record)
            monitor.step_done(step, record)
            shown = rng.randrange(len(tasks))  # one group per step, to read what the policy writes
            samples_log.write("rl", step, task=tasks[shown].id, completions=[s.text for s in rollouts[shown].samples],
                              rewards=reward_matrix[shown].tolist())
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
        summary = {
            "base": base,
            "after_sft": after_sft,
            "final": final,
            "policy_version": rollouts_group.version,
            "output_dir": str(out),
        }
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
    finally:
        learner.kill()
        if critic is not None:
            critic.kill()
        for actor in workers:
            ray.kill(actor)
        rewards_service.close()
    return summary


def _to_tuple(value):
    """JSON turned random.getstate()'s tuples into lists; setstate needs them back."""
    return tuple(_to_tuple(v) for v in value) if isinstance(value, list) else value
