"""End-to-end RL training samples/s: TRL's RLOOTrainer against coderloo's own loop, in one run.

    python -m bench.bench_trl          # BENCH_TRL_STEPS=8 steps each, BENCH_TRL_REPEATS=3 runs each

Both sides train the same tiny Qwen2 model (coderloo.models.build_tiny_model, built offline),
warm-started by coderloo's SFT phase (so that the samples are programs that compile and run, and
the sandbox is exercised: the random model's samples almost never compile), on the same synthetic
train tasks, with k=8 samples per prompt, the same prompts per step, the same max new tokens,
temperature 1, learning rate, no KL, and rewards from the same reward service (the Ray Serve app
and its sandbox pool, through the same RewardClient: TRL's reward function calls it). Each runs a
fixed number of steps, BENCH_TRL_REPEATS times, alternating; the figures are the medians. Samples/s
counts the completions of the RL steps over the time of those steps (generation, scoring and
learning; not start-up):
- coderloo: `coderloo.controller.train` with SFT off and minimal evaluation; `samples` and
  `time_step_s` of the RL steps in metrics.jsonl. Its defaults stay: vLLM generation, the
  synchronous loop (max_staleness 0, the faster on 2 cores: bench_pipeline), two optimizer steps
  per batch. Uninformative groups are kept (filter off), so that both sides learn from every sample.
- TRL: RLOOTrainer (transformers generation in the training process, one optimizer step per
  batch); the time of each optimizer step, from a TrainerCallback.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from bench.plots import alternating, comparison, medians

STEPS = int(os.environ.get("BENCH_TRL_STEPS", "8"))
REPEATS = int(os.environ.get("BENCH_TRL_REPEATS", "3"))
PROMPTS_PER_STEP = 8
K = 8
MAX_NEW_TOKENS = 48
LR = 2e-4


def warm_start(out: Path) -> Path:
    """The tiny model after coderloo's default SFT phase (no RL step): both sides start from it."""
    from coderloo.config import load_config
    from coderloo.controller import train

    train(load_config("configs/default.yaml", [
        f"model.path={out / 'tiny-qwen2'}", f"train.output_dir={out / 'sft'}", "train.steps=0",
        "tasks.max_eval_tasks=1", "eval.samples_per_task=1", "eval.k=[1]", "eval.greedy=false",
    ]))
    return out / "sft" / "checkpoints" / "final"


def run_coderloo(model: Path, out: Path) -> dict:
    from coderloo.config import load_config
    from coderloo.controller import train
    from coderloo.metrics import read_metrics

    config = load_config("configs/default.yaml", [
        f"model.path={model}", "model.build_tiny=false", f"train.output_dir={out}", "sft.steps=0",
        f"train.steps={STEPS}", f"train.prompts_per_step={PROMPTS_PER_STEP}", "train.eval_every=0",
        "train.checkpoint_every=0", f"rollout.samples_per_prompt={K}", f"rollout.max_new_tokens={MAX_NEW_TOKENS}",
        f"learner.lr={LR}", "learner.advantage.filter_uninformative=false",
        "rollout.stop=[]",  # TRL's generation has no stop strings: both stop at EOS or MAX_NEW_TOKENS
        "tasks.max_eval_tasks=1", "eval.samples_per_task=1", "eval.k=[1]", "eval.greedy=false",
    ])
    train(config)
    rl = [r for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "rl"]
    return _rates([r["samples"] for r in rl], [r["time_step_s"] for r in rl]) | {
        "mean_reward": sum(r["reward_mean"] for r in rl) / len(rl)}


def _rates(samples: list[int], seconds: list[float]) -> dict:
    """Samples/s over all steps, and over all but the first (which carries one-off warm-up)."""
    return {"steps": len(seconds), "samples": sum(samples), "seconds": sum(seconds),
            "samples_per_s": sum(samples) / sum(seconds),
            "samples_per_s_after_first": sum(samples[1:]) / sum(seconds[1:])}


def run_trl(model: Path, out: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import RLOOConfig, RLOOTrainer

    from coderloo.config import load_config
    from coderloo.runtime import init_ray
    from coderloo.tasksets.synthetic import synthetic_suite
    from reward_service.client import RewardClient

    tasks = synthetic_suite()["train"]
    by_id = {t.id: t for t in tasks}
    config = load_config("configs/default.yaml")
    init_ray(address=config.ray_address)
    client = RewardClient(config.reward)
    rewards_seen = []

    def sandbox_reward(completions, task_id, **_):
        rewards = client.score([by_id[i] for i in task_id], list(completions))
        rewards_seen.extend(r.total for r in rewards)
        return [r.total for r in rewards]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.seconds, self.started = [], None

        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds.append(time.perf_counter() - self.started)

    torch.set_num_threads(config.learner.threads)
    timer = StepTimer()
    args = RLOOConfig(
        output_dir=str(out), num_generations=K, per_device_train_batch_size=PROMPTS_PER_STEP * K,
        gradient_accumulation_steps=1, max_completion_length=MAX_NEW_TOKENS, max_steps=STEPS, learning_rate=LR,
        beta=0.0, temperature=1.0, bf16=False, use_cpu=True, report_to="none", save_strategy="no", seed=0,
        logging_steps=1, disable_tqdm=True,
    )
    trainer = RLOOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model),
        reward_funcs=sandbox_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [t.prompt for t in tasks], "task_id": [t.id for t in tasks]}),
        processing_class=AutoTokenizer.from_pretrained(model),
        callbacks=[timer],
    )
    trainer.remove_callback(PrinterCallback)  # its per-step dicts would fill the report
    try:
        trainer.train()
    finally:
        client.close()
    return _rates([PROMPTS_PER_STEP * K] * len(timer.seconds), timer.seconds) | {
        "mean_reward": sum(rewards_seen) / len(rewards_seen)}


def main() -> list[dict]:
    from coderloo.runtime import apply_env_defaults

    apply_env_defaults()
    root = Path(tempfile.mkdtemp(prefix="bench-trl-"))
    model = warm_start(root)
    runs = alternating(REPEATS, {"coderloo": lambda i: run_coderloo(model, root / f"coderloo-{i}"),
                                 "trl": lambda i: run_trl(model, root / f"trl-{i}")})
    median = medians(runs)
    ratios = [c["samples_per_s"] / t["samples_per_s"] for c, t in zip(runs["coderloo"], runs["trl"])]
    print(f"RL training, tiny model after SFT, {STEPS} steps of {PROMPTS_PER_STEP} prompts x {K} samples, "
          f"{MAX_NEW_TOKENS} new tokens, rewards from the same sandboxed reward service; medians of {REPEATS} runs each")
    for name, m in median.items():
        each = ", ".join(f"{r['samples_per_s']:.1f}" for r in runs[name])
        print(f"  {name:8s} {m['samples_per_s']:7.1f} samples/s  (runs: {each}; {m['samples_per_s_after_first']:.1f} "
              f"without the first step)  mean reward {m['mean_reward']:.3f}")
    print(f"  coderloo / TRL RLOOTrainer: {median['coderloo']['samples_per_s'] / median['trl']['samples_per_s']:.2f}x samples/s "
          f"(per pair of runs: {', '.join(f'{r:.2f}x' for r in ratios)})")
    return [comparison(f"RL training, tiny model, {STEPS} steps, median of {REPEATS}", "samples/s", "coderloo",
                       {"coderloo": median["coderloo"]["samples_per_s"], "TRL RLOOTrainer": median["trl"]["samples_per_s"]})]


if __name__ == "__main__":
    main()
