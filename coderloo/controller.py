"""The training loop: prompts -> rollouts -> rewards -> advantages -> learner step -> weight push.

It reads top to bottom on purpose; each stage is one call into the component that owns it.
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import ray
import torch
from tqdm import tqdm

from coderloo.config import Config, dump_config
from coderloo.evaluation import evaluate
from coderloo.metrics import MetricsLog, plot_training
from coderloo.models import build_tiny_model, load_tokenizer
from coderloo.runtime import REPO_ROOT, init_ray
from coderloo.tasksets.loading import load_tasks
from coderloo.tasksets.synthetic import corpus_for_tokenizer
from learner.actor import Learner
from learner.advantages import rloo_advantages, whiten
from learner.batch import TrainSequence
from reward_service.client import RewardClient
from rollout_workers import GenerationParams, RolloutGroup, RolloutWorker


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


def train(config: Config) -> dict:
    out = resolve(config.train.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    dump_config(config, out / "config.yaml")
    metrics = MetricsLog(out / "metrics.jsonl")
    samples_log = MetricsLog(out / "samples.jsonl")
    rng = random.Random(config.train.seed)

    # --- set-up: tasks, model, Ray actors ---
    train_tasks, eval_tasks = load_tasks(config.tasks)
    model_path = prepare_model(config)
    tokenizer = load_tokenizer(model_path)
    init_ray(address=config.ray_address)
    rewards_service = RewardClient(config.reward)
    learner = Learner.remote(str(model_path), config.learner, config.rollout.temperature, sft_lr=config.sft.lr)
    workers = [
        RolloutWorker.remote(str(model_path), config.rollout.backend, seed=config.learner.seed + i, threads=config.rollout.threads)
        for i in range(config.rollout.num_workers)
    ]
    rollouts_group = RolloutGroup(workers, config.rollout.weight_sync.settings())
    try:
        rollouts_group.connect(learner)
        rollout = config.rollout
        k = rollout.samples_per_prompt
        params = GenerationParams(n=k, max_new_tokens=rollout.max_new_tokens, temperature=rollout.temperature, top_p=rollout.top_p, stop=rollout.stop)
        def run_eval(stage: str, step: int) -> dict[str, float]:
            result = evaluate(
                rollouts_group, rewards_service, eval_tasks, n=config.eval.samples_per_task, ks=config.eval.k,
                temperature=config.eval.temperature, max_new_tokens=rollout.max_new_tokens, stop=rollout.stop,
                greedy=config.eval.greedy,
            )
            metrics.write("eval", step, stage=stage, version=rollouts_group.version, **result)
            tqdm.write(f"[eval {stage} step {step}] " + " ".join(f"{k}={v:.3f}" for k, v in result.items()))
            return result

        base = run_eval("base", 0)

        # --- SFT warm-up on reference solutions ---
        examples = sft_examples(train_tasks, tokenizer)
        for step in tqdm(range(config.sft.steps), desc="sft", dynamic_ncols=True):
            batch = rng.sample(examples, min(config.sft.batch_size, len(examples)))
            stats = ray.get(learner.sft_step.remote(batch))
            metrics.write("sft", step + 1, **stats)
        if config.sft.steps:
            rollouts_group.push()
        after_sft = run_eval("rl", 0)

        # --- RL: RLOO ---
        order: list = []
        bar = tqdm(range(1, config.train.steps + 1), desc="rl", dynamic_ncols=True)
        for step in bar:
            t0 = time.time()
            if len(order) < config.train.prompts_per_step:
                order += rng.sample(train_tasks, len(train_tasks))
            tasks, order = order[: config.train.prompts_per_step], order[config.train.prompts_per_step:]

            # 1. k samples per prompt, tagged with the policy version that made them
            rollouts = rollouts_group.generate([t.prompt for t in tasks], params)
            t_gen = time.time()

            # 2. rewards: every program runs against its tests in the sandbox pool
            flat = [(task, s) for task, r in zip(tasks, rollouts) for s in r.samples]
            rewards = rewards_service.score([task for task, _ in flat], [s.text for _, s in flat])
            t_score = time.time()

            # 3. RLOO advantages within each prompt's group of k
            reward_matrix = torch.tensor([r.total for r in rewards]).view(len(tasks), k)
            advantages = rloo_advantages(reward_matrix)
            if config.learner.normalize_advantages:
                advantages = whiten(advantages)
            sequences = [
                TrainSequence(r.prompt_ids, s.token_ids, s.logprobs, float(a))
                for r, adv_row in zip(rollouts, advantages)
                for s, a in zip(r.samples, adv_row)
            ]

            # 4. one learner step, 5. new weights to the rollout workers
            stats = ray.get(learner.train_step.remote(sequences))
            t_learn = time.time()
            sync = rollouts_group.push()
            dt = time.time() - t0

            record = {
                "version": rollouts_group.version,
                "reward_mean": float(reward_matrix.mean()),
                "pass_rate": sum(r.passed for r in rewards) / len(rewards),
                "syntax_rate": sum(r.components.syntax for r in rewards) / len(rewards),
                "completion_tokens_mean": sum(len(s.token_ids) for _, s in flat) / len(flat),
                "samples_per_s": len(flat) / dt,
                "time_generate_s": t_gen - t0,
                "time_score_s": t_score - t_gen,
                "time_learn_s": t_learn - t_score,
                "time_sync_s": sync["sync_s"],
                **stats,
            }
            metrics.write("rl", step, **record)
            shown = rng.randrange(len(tasks))  # one group per step, to read what the policy writes
            samples_log.write("rl", step, task=tasks[shown].id, completions=[s.text for s in rollouts[shown].samples],
                              rewards=reward_matrix[shown].tolist())
            bar.set_postfix(reward=f"{record['reward_mean']:.3f}", pass_rate=f"{record['pass_rate']:.2f}", samples_s=f"{record['samples_per_s']:.0f}")
            if config.train.eval_every and step % config.train.eval_every == 0 and step != config.train.steps:
                run_eval("rl", step)
            if config.train.checkpoint_every and step % config.train.checkpoint_every == 0:
                ray.get(learner.save.remote(str(out / "checkpoints" / f"step_{step}")))

        final = run_eval("rl", config.train.steps)
        ray.get(learner.save.remote(str(out / "checkpoints" / "final")))
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
        for actor in (learner, *workers):
            ray.kill(actor)
        rewards_service.close()
    return summary
