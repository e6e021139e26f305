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

    python -m bench.bench_trl real   # the catalogue's Qwen2.5-Coder-0.5B-Instruct, 1 optimizer step

The same comparison on real weights (`coderloo model fetch qwen2.5-coder-0.5b-instruct`), from
configs/real-0.5b.yaml: MBPP's train split, each prompt rendered with the model's chat template
(TRL is given the rendered text, so both sides sample from the same token ids), PROMPTS x K
samples of up to REAL_MAX_NEW_TOKENS, its learning rate and the learner's resolved dtype on both
sides (float32 where bf16 would be emulated). Both learners recompute activations (gradient
checkpointing) and go through a batch in micro-batches: coderloo's of
learner.max_tokens_per_micro_batch tokens, TRL's of REAL_MICRO_BATCH sequences, its gradients
accumulated to the same optimizer steps. Sized for about half an hour on 2 cores
(BENCH_TRL_STEPS=3 batches, one run each unless BENCH_TRL_REPEATS says more).
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.plots import alternating, comparison, medians

REPEATS = int(os.environ.get("BENCH_TRL_REPEATS", "3"))
OPTIMIZER_STEPS = [int(n) for n in os.environ.get("BENCH_TRL_OPTIMIZER_STEPS", "1 2").split()]
PROMPTS_PER_STEP = 8
K = 8
MAX_NEW_TOKENS = 48
LR = 2e-4
REAL_MODEL = "qwen2.5-coder-0.5b-instruct"
REAL_MAX_NEW_TOKENS = 256  # MBPP's answers are a few dozen lines; half an hour holds 3 batches of 16 at this length
REAL_MICRO_BATCH = 4  # sequences per TRL micro-batch: about coderloo's 2,048 tokens of ~400-token sequences


@dataclass(frozen=True)
class Setting:
    """What both sides train: the config they start from (and its task set), the batch, the
    lengths, the learning rate, and TRL's micro-batch (None: the whole slice of a batch at once)."""

    config: str
    overrides: list[str] = field(default_factory=list)
    prompts: int = PROMPTS_PER_STEP
    k: int = K
    max_new_tokens: int = MAX_NEW_TOKENS
    lr: float = LR
    micro_batch: int | None = None
    checkpointing: bool = False
    batches: int = 8  # BENCH_TRL_STEPS overrides it

    @property
    def steps(self) -> int:
        return int(os.environ.get("BENCH_TRL_STEPS", self.batches))


TINY = Setting("configs/default.yaml")
REAL = Setting("configs/real-0.5b.yaml", ["tasks.max_eval_tasks=1"], prompts=4, k=4, max_new_tokens=REAL_MAX_NEW_TOKENS,
               lr=1e-6, micro_batch=REAL_MICRO_BATCH, checkpointing=True, batches=3)


def warm_start(out: Path) -> Path:
    """The tiny model after coderloo's default SFT phase (no RL step): both sides start from it."""
    from coderloo.config import load_config
    from coderloo.controller import train

    train(load_config("configs/default.yaml", [
        f"model.path={out / 'tiny-qwen2'}", f"train.output_dir={out / 'sft'}", "train.steps=0",
        "tasks.max_eval_tasks=1", "eval.samples_per_task=1", "eval.k=[1]", "eval.greedy=false",
    ]))
    return out / "sft" / "checkpoints" / "final"


def run_coderloo(model: Path, out: Path, optimizer_steps: int, setting: Setting = TINY) -> dict:
    from coderloo.config import load_config
    from coderloo.controller import train
    from coderloo.metrics import read_metrics

    config = load_config(setting.config, [
        f"model.path={model}", "model.build_tiny=false", f"train.output_dir={out}", "sft.steps=0",
        f"train.steps={setting.steps}", f"train.prompts_per_step={setting.prompts}", "train.eval_every=0",
        "train.checkpoint_every=0", f"rollout.samples_per_prompt={setting.k}", f"rollout.max_new_tokens={setting.max_new_tokens}",
        f"learner.lr={setting.lr}", f"learner.optimizer_steps={optimizer_steps}", "learner.advantage.filter_uninformative=false",
        "rollout.stop=[]",  # TRL's generation has no stop strings: both stop at EOS or the length
        "tasks.max_eval_tasks=1", "eval.samples_per_task=1", "eval.k=[1]", "eval.greedy=false", "eval.sampled=true",
        *setting.overrides,
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


def run_trl(model: Path, out: Path, optimizer_steps: int, setting: Setting = TINY) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import RLOOConfig, RLOOTrainer

    from coderloo.config import load_config
    from coderloo.runtime import init_ray
    from coderloo.tasksets.loading import load_tasks
    from reward_service.client import RewardClient
    from rollout_workers.prompts import answered_task, render

    config = load_config(setting.config, [f"model.path={model}", "model.build_tiny=false", *setting.overrides])
    tokenizer = AutoTokenizer.from_pretrained(model)
    # as coderloo's rollout renders them (a chat template or the prompt as it is) and scores the answers
    train = load_tasks(config.tasks)[0]
    tasks = [answered_task(t, tokenizer, config.prompt) for t in train]
    prompts = [render(t, tokenizer, config.prompt) for t in train]
    by_id = {t.id: t for t in tasks}
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
    batch = setting.prompts * setting.k
    micro = setting.micro_batch or batch // optimizer_steps
    bf16 = config.learner.dtype == "bfloat16"  # the learner's resolved dtype: the same arithmetic on both sides
    args = RLOOConfig(
        output_dir=str(out), num_generations=setting.k, per_device_train_batch_size=micro,
        steps_per_generation=batch // micro, gradient_accumulation_steps=batch // micro // optimizer_steps,
        max_completion_length=setting.max_new_tokens, max_steps=setting.steps * optimizer_steps, learning_rate=setting.lr,
        gradient_checkpointing=setting.checkpointing,
        beta=0.0, temperature=1.0, bf16=bf16, use_cpu=True, report_to="none", save_strategy="no", seed=0,
        logging_steps=1, disable_tqdm=True,
    )
    trainer = RLOOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16 if bf16 else torch.float32),
        reward_funcs=sandbox_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts, "task_id": [t.id for t in tasks]}),
        processing_class=tokenizer,
        callbacks=[timer],
    )
    trainer.remove_callback(PrinterCallback)  # its per-step dicts would fill the report
    try:
        trainer.train()
    finally:
        client.close()
    batches = [sum(timer.seconds[i:i + optimizer_steps]) for i in range(0, len(timer.seconds), optimizer_steps)]
    return _rates([batch] * len(batches), batches) | {
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
        print(f"RL training at {n} optimizer step(s) per batch{default}, tiny model after SFT, {TINY.steps} batches of "
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
        figures.append(comparison(f"RL training, tiny model, {n} optimizer step(s) per batch, {TINY.steps} batches, median of {REPEATS}",
                                  "samples/s", "coderloo",
                                  {"coderloo": median["coderloo"]["samples_per_s"], "TRL RLOOTrainer": median["trl"]["samples_per_s"]},
                                  key=f"trl, {n} optimizer steps"))
    return figures


def real_main() -> list[dict]:
    """coderloo against TRL's RLOOTrainer on the catalogue's 0.5B (see the module's docstring)."""
    from coderloo.model_import import fetch
    from coderloo.runtime import apply_env_defaults

    apply_env_defaults()
    root = Path(tempfile.mkdtemp(prefix="bench-trl-real-"))
    model = fetch(REAL_MODEL)
    repeats = int(os.environ.get("BENCH_TRL_REPEATS", "1"))
    runs = alternating(repeats, {"coderloo": lambda i: run_coderloo(model, root / f"coderloo-{i}", 1, REAL),
                                 "trl": lambda i: run_trl(model, root / f"trl-{i}", 1, REAL)})
    median = medians(runs)
    print(f"RL training at 1 optimizer step per batch, {REAL_MODEL}, {REAL.steps} batches of {REAL.prompts} MBPP train "
          f"prompts x {REAL.k} samples, up to {REAL.max_new_tokens} new tokens, lr {REAL.lr:g}, rewards from the same "
          f"sandboxed reward service; medians of {repeats} run(s) each")
    for name, m in median.items():
        print(f"  {name:8s} {m['samples_per_s']:7.3f} samples/s  ({m['seconds']:.0f} s for {m['samples']} samples; "
              f"{m['samples_per_s_after_first']:.3f} without the first batch)  mean reward {m['mean_reward']:.3f}")
    for key, label in (("samples_per_s", "overall"), ("samples_per_s_after_first", "without the first batch")):
        print(f"  coderloo / TRL RLOOTrainer, {label}: {median['coderloo'][key] / median['trl'][key]:.2f}x")
    return [comparison(f"RL training, {REAL_MODEL}, 1 optimizer step per batch, {REAL.steps} batches", "samples/s", "coderloo",
                       {"coderloo": median["coderloo"]["samples_per_s"], "TRL RLOOTrainer": median["trl"]["samples_per_s"]},
                       key="trl, real 0.5b")]


if __name__ == "__main__":
    real_main() if sys.argv[1:] == ["real"] else main()
