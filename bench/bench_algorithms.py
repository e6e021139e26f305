"""The source designs' algorithms against plain RLOO, on the synthetic suite with the same budget.

    python -m bench.bench_algorithms          # BENCH_ALGORITHMS_STEPS=60 RL steps per run

Four training runs of the default config (its SFT warm-up, then the same number of RL steps of the
same prompts, seed and sampling), each evaluated at its end on the held-out tasks:

- rloo: the default, RLOO's leave-one-out baseline. A critic (critic.enabled) trains alongside on
  the scored samples; with critic.reward_coef 0 it does not touch the policy's update, and the
  final evaluation reports its best-of-8 pick (pass@1_critic) against a random pick of the same 8
  samples (pass@1_random), a majority vote and a critic-weighted vote among them, and its
  held-out accuracy and AUC at the last step.
- rloo+dense: learner.dense_rewards, the reward service's per-token rewards on top of RLOO.
- rloo+refine: refine.enabled, up to 3 attempts per sample from execution feedback, RLOO over each
  trajectory's outcome; evaluation reports pass@1 after rounds 1, 2 and 3. (It generates more than
  the others per step: the failed samples' rewrites.)
- reinforce: no baseline at all (learner.advantage_estimator=reinforce, no whitening, which would
  subtract the batch mean): what the leave-one-out baseline buys.
"""
from __future__ import annotations

import os
import tempfile

from bench.plots import comparison
from coderloo.config import load_config
from coderloo.controller import train
from coderloo.metrics import read_metrics

STEPS = int(os.environ.get("BENCH_ALGORITHMS_STEPS", "60"))
VARIANTS = {
    "rloo": ["critic.enabled=true"],
    "rloo+dense": ["learner.dense_rewards=true"],
    "rloo+refine": ["refine.enabled=true", "refine.rounds=3"],
    "reinforce": ["learner.advantage_estimator=reinforce", "learner.normalize_advantages=false"],
}


def run(overrides: list[str], out: str) -> dict:
    config = load_config("configs/default.yaml", [
        f"train.output_dir={out}", f"train.steps={STEPS}", "train.eval_every=0", "train.checkpoint_every=0",
        "train.max_staleness=0", *overrides,
    ])
    summary = train(config)
    rl = [r for r in read_metrics(f"{out}/metrics.jsonl") if r["phase"] == "rl"]
    return {
        "after_sft": summary["after_sft"], "final": summary["final"], "last_step": rl[-1],
        "rl_seconds": sum(r["time_step_s"] for r in rl), "samples": sum(r["samples"] for r in rl),
    }


def main() -> list[dict]:
    root = tempfile.mkdtemp(prefix="bench-algorithms-")
    results = {name: run(overrides, f"{root}/{name.replace('+', '-')}") for name, overrides in VARIANTS.items()}
    print(f"algorithms on the synthetic suite, default config, {STEPS} RL steps each (held-out pass@1 at the end)")
    print("| run | pass@1 after SFT | pass@1 | greedy pass@1 | RL time | more |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        final, last = r["final"], r["last_step"]
        more = []
        if "pass@1_round1" in final:
            more.append("pass@1 after rounds 1/2/3: " + " / ".join(f"{final[f'pass@1_round{i}']:.3f}" for i in (1, 2, 3)))
        if "pass@1_critic" in final:
            more.append(f"of 8 samples, the critic's pick: {final['pass@1_critic']:.3f}, a random pick: {final['pass@1_random']:.3f}, "
                        f"majority vote: {final['pass@1_vote']:.3f}, critic-weighted vote: {final['pass@1_critic_vote']:.3f}; "
                        f"critic accuracy {last.get('critic_accuracy')}, AUC {last.get('critic_auc')} (last step, held-out tasks)")
        print(f"| {name} | {r['after_sft']['pass@1']:.3f} | {final['pass@1']:.3f} | {final['greedy_pass@1']:.3f} | "
              f"{r['rl_seconds']:.0f} s | {'; '.join(more)} |")
    rloo = results["rloo"]["final"]
    print(f"  rloo / reinforce: {rloo['pass@1'] / max(results['reinforce']['final']['pass@1'], 1e-9):.2f}x pass@1")
    return [comparison(f"held-out pass@1 after {STEPS} RL steps", "pass@1", "rloo",
                       {name: r["final"]["pass@1"] for name, r in results.items()})]


if __name__ == "__main__":
    main()
