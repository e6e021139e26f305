"""End-to-end RL training samples/s: TRL's RLOOTrainer against coderloo's own loop, in one run, at
equal learner work.

    python -m bench.bench_trl   # BENCH_TRL_STEPS=8 batches, BENCH_TRL_REPEATS=3 runs, BENCH_TRL_OPTIMIZER_STEPS="1 2"

Both sides train the same tiny Qwen2 model (coderloo.models.build_tiny_model, built offline),
warm-started by coderloo's SFT phase (so that the samples are programs that compile and run, and
the sandbox is exercised: the random model's samples almost never compile), on the same synthetic
train tasks, with k=8 samples per prompt, the same prompts per batch, the same max new tokens,
temperature 1, learning rate, no KL, and rewards from the same reward service (the Ray Serve app
and its sandbox pool, through the same RewardClient: TRL's reward function calls it). For each
count of optimizer steps per batch (1, and 2: coderloo's default `learner.optimizer_steps`; TRL's
`steps_per_generation`), each side runs STEPS batches, REPEATS times, alternating; the figures are
the medians. Samples/s counts the completions of the RL batches over the time of those batches
(generation, scoring and learning; not start-up), also without the first batch (warm-up).

What each side computes per batch of 64 samples:
- coderloo (`coderloo.controller.train`, SFT off, minimal evaluation, its defaults otherwise: the
  synchronous loop, uninformative groups kept so that both sides learn from every sample): vLLM
  generates in its rollout actor while the sandbox pool scores each group as it finishes; the
  learner actor runs a forward and backward per micro-batch and an optimizer step per mini-batch;
  with two mini-batches, a no-gradient forward first for the step-start logprobs (with one, the
  training forward's own); then the new weights are pushed to vLLM.
- TRL (RLOOTrainer, in this process): transformers generates the batch, the reward function scores
  it after generation, a no-gradient forward computes the old logprobs (always, in RLOOTrainer
  1.16), then a forward and backward and an optimizer step per `steps_per_generation` slice. Its
  batch time is the sum of its optimizer steps' (a TrainerCallback), generation falling in the first.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from bench.plots import alternating, comparison, medians

STEPS = int(os.environ.get("BENCH_TRL_STEPS", "8"))
REPEATS = int(os.environ.get("BENCH_TRL_REPEATS", "3"))
OPTIMIZER_STEPS = [int(n) for n in os.environ.get("BENCH_TRL_OPTIMIZER_STEPS", "1 2").split()]
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


def run_coderloo(model: Path, out: Path, optimizer_steps: int) -> dict:
    from coderloo.config import load_config
    from coderloo.controller import train
    from coderloo.metrics import read_metrics

    config = load_config("configs/default.yaml", [
        f"model.path={model}", "model.build_tiny=false", f"train.output_dir={out}", "sft.steps=0",
        f"train.steps={STEPS}", f"train.prompts_per_step={PROMPTS_PER_STEP}", "train.eval_every=0",
        "train.checkpoint_every=0", f"rollout.samples_per_prompt={K}", f"rollout.max_new_tokens={MAX_NEW_TOKENS}",
        f"learner.lr={LR}", f"learner.optimizer_steps={optimizer_steps}", "learner.advantage.filter_uninformative=false",
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


def run_trl(model: Path, out: Path, optimizer_steps: int) -> dict:
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
        output_dir=str(out), num_generations=K, per_device_train_batch_size=PROMPTS_PER_STEP * K // optimizer_steps,
        steps_per_generation=optimizer_steps, gradient_accumulation_steps=1, max_completion_length=MAX_NEW_TOKENS,
        max_steps=STEPS * optimizer_steps, learning_rate=LR,
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
    batches = [sum(timer.seconds[i:i + optimizer_steps]) for i in range(0, len(timer.seconds), optimizer_steps)]
    return _rates([PROMPTS_PER_STEP * K] * len(batches), batches) | {
        "mean_reward": sum(rewards_seen) / len(rewards_seen)}


def main() -> list[dict]:
    from coderloo.runtime import apply_env_defaults

    apply_env_defaults()
    root = Path(tempfile.mkdtemp(prefix="bench-trl-"))
    model = warm_start(root)
    figures = []
    for n in OPTIMIZER_STEPS:
        runs = alternating(REPEATS, {"coderloo": lambda i: run_coderloo(model, root / f"coderloo-{n}-{i}", n),
                                     "trl": lambda i: run_trl(model, root / f"trl-{n}-{i}", n)})
        median = medians(runs)
        default = " (coderloo's default)" if n == 2 else ""
        print(f"RL training at {n} optimizer step(s) per batch{default}, tiny model after SFT, {STEPS} batches of "
              f"{PROMPTS_PER_STEP} prompts x {K} samples, {MAX_NEW_TOKENS} new tokens, rewards from the same sandboxed "
              f"reward service; medians of {REPEATS} runs each")
        for name, m in median.items():
            each = ", ".join(f"{r['samples_per_s']:.1f}" for r in runs[name])
            print(f"  {name:8s} {m['samples_per_s']:7.1f} samples/s  (runs: {each}; {m['samples_per_s_after_first']:.1f} "
                  f"without the first batch)  mean reward {m['mean_reward']:.3f}")
        for key, label in (("samples_per_s", "overall"), ("samples_per_s_after_first", "without the first batch")):
            pairs = [c[key] / t[key] for c, t in zip(runs["coderloo"], runs["trl"])]
            print(f"  coderloo / TRL RLOOTrainer, {label}: {median['coderloo'][key] / median['trl'][key]:.2f}x "
                  f"(per pair of runs: {', '.join(f'{r:.2f}x' for r in pairs)})")
        figures.append(comparison(f"RL training, tiny model, {n} optimizer step(s) per batch, {STEPS} batches, median of {REPEATS}",
                                  "samples/s", "coderloo",
                                  {"coderloo": median["coderloo"]["samples_per_s"], "TRL RLOOTrainer": median["trl"]["samples_per_s"]},
                                  key=f"trl, {n} optimizer steps"))
    return figures


if __name__ == "__main__":
    main()
