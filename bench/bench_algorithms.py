"""The source designs' algorithms and the loss family's presets against plain RLOO, on the synthetic
suite with the same budget.

    python -m bench.bench_algorithms          # BENCH_ALGORITHMS_STEPS=60 RL steps per run
    BENCH_ALGORITHMS_VARIANTS=ppo+dense,rloo+dense python -m bench.bench_algorithms   # some of them

Twelve training runs of the default config (its SFT warm-up, then the same number of RL steps of the
same seed and sampling), each evaluated at its end on the held-out tasks:

- rloo: the default, RLOO's leave-one-out baseline. A critic (critic.enabled) trains alongside on
  the scored samples; with critic.reward_coef 0 it does not touch the policy's update, and the
  final evaluation reports its best-of-8 pick (pass@1_critic) against a random pick of the same 8
  samples (pass@1_random), a majority vote and a critic-weighted vote among them, and its
  held-out accuracy and AUC at the last step (over all samples and within each task's group).
  rloo+critic-rank: the same with a ranking loss within each task's group next to the critic's
  cross-entropy (critic.rank_coef 1).
- rloo+dense: learner.advantage.dense, the reward service's per-token rewards on top of RLOO.
- rloo+kl, rloo+kl+soft: a KL penalty in the reward (coef 0.05, k3, as RLOO in TRL) to the policy RL
  starts from, frozen; and following the policy, 1% of the way after every step (the RLOO design's
  soft-updated target, learner.kl.reference_mix 0.01). Their rows give the KL per sample over the run.
- rloo+refine: configs/refine.yaml, up to 3 attempts per sample from execution feedback, RLOO over
  each trajectory's outcome, its SFT with refinement demonstrations; evaluation reports pass@1
  after rounds 1, 2 and 3 (bench/bench_multi_turn.py sets it against single turns and the code
  interpreter). (It generates more than the others per step: the failed samples' rewrites.)
- reinforce: no baseline at all (learner.advantage.type=reinforce, no whitening, which would
  subtract the batch mean): what the leave-one-out baseline buys.
- ppo+dense: configs/ppo.yaml without its KL term: a value model (its own engine) and GAE over the
  dense rewards, so that against rloo+dense only the estimator differs; the value model's cost is
  the learner's time per step and peak memory against rloo+dense's. ppo+dense+shared: the same
  with the value head on the policy's backbone (learner.advantage.value_model shared).
- dapo, dr-grpo, gspo: configs/dapo.yaml, configs/dr-grpo.yaml and configs/gspo.yaml, each the
  default with its paper's settings (see each file). DAPO's dynamic sampling draws more prompts
  when groups are uniform: it generates more than the others per step (the samples column).

Each row also gives the policy's mean token entropy on the last step's completions (a collapse of
exploration shows there first) and the RL phase's wall time.
"""
from __future__ import annotations

import os
import tempfile

from bench.plots import comparison
from coderloo.config import load_config
from coderloo.controller import train
from coderloo.metrics import read_metrics

STEPS = int(os.environ.get("BENCH_ALGORITHMS_STEPS", "60"))
KL = "coef: 0.05, into: reward, estimator: k3"
VARIANTS = {  # name: (config file, overrides)
    "rloo": ("configs/default.yaml", ["critic.enabled=true"]),
    "rloo+critic-rank": ("configs/default.yaml", ["critic.enabled=true", "critic.rank_coef=1"]),
    "rloo+dense": ("configs/default.yaml", ["learner.advantage.dense={}"]),
    "rloo+kl": ("configs/default.yaml", [f"learner.kl={{{KL}}}"]),
    "rloo+kl+soft": ("configs/default.yaml", [f"learner.kl={{{KL}, reference_mix: 0.01}}"]),
    "rloo+refine": ("configs/refine.yaml", []),
    "reinforce": ("configs/default.yaml", ["learner.advantage.type=reinforce", "learner.advantage.normalize=false"]),
    "ppo+dense": ("configs/ppo.yaml", ["learner.kl=null"]),
    "ppo+dense+shared": ("configs/ppo.yaml", ["learner.kl=null", "learner.advantage.value_model=shared"]),
    "dapo": ("configs/dapo.yaml", []),
    "dr-grpo": ("configs/dr-grpo.yaml", []),
    "gspo": ("configs/gspo.yaml", []),
}


def run(path: str, overrides: list[str], out: str, steps: int = STEPS) -> dict:
    config = load_config(path, [
        f"train.output_dir={out}", f"train.steps={steps}", "train.eval_every=0", "train.checkpoint_every=0",
        "train.max_staleness=0", *overrides,
    ])
    summary = train(config)
    rl = [r for r in read_metrics(f"{out}/metrics.jsonl") if r["phase"] == "rl"]
    return {
        "after_sft": summary["after_sft"], "final": summary["final"], "last_step": rl[-1],
        "rl_seconds": sum(r["time_step_s"] for r in rl), "samples": sum(r["samples"] for r in rl), "rl": rl,
        # the learner's share of a step (values, KL, advantages, the update) and its rank's peak memory
        "learn_s_per_step": sum(r["time_learn_s"] for r in rl) / len(rl),
        "learner_rss_mb": max(r.get("learner_rss_mb_max") or 0.0 for r in rl),
    }


def main() -> list[dict]:
    root = tempfile.mkdtemp(prefix="bench-algorithms-")
    chosen = os.environ.get("BENCH_ALGORITHMS_VARIANTS")
    names = chosen.split(",") if chosen else list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"BENCH_ALGORITHMS_VARIANTS: unknown {', '.join(unknown)}; valid: {', '.join(VARIANTS)}")
    results = {name: run(*VARIANTS[name], f"{root}/{name.replace('+', '-')}") for name in names}
    print(f"algorithms on the synthetic suite, default config, {STEPS} RL steps each (held-out pass@1 at the end)")
    print("| run | pass@1 after SFT | pass@1 | greedy pass@1 | entropy, last step | RL time | learner s/step | learner peak RSS | samples | more |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        final, last = r["final"], r["last_step"]
        more = []
        if "pass@1_round1" in final:
            more.append("pass@1 after rounds 1/2/3: " + " / ".join(f"{final[f'pass@1_round{i}']:.3f}" for i in (1, 2, 3)))
        if "pass@1_critic" in final:
            more.append(f"of 8 samples, the critic's pick: {final['pass@1_critic']:.3f}, a random pick: {final['pass@1_random']:.3f}, "
                        f"majority vote: {final['pass@1_vote']:.3f}, critic-weighted vote: {final['pass@1_critic_vote']:.3f}; "
                        f"critic accuracy {last.get('critic_accuracy')}, AUC {last.get('critic_auc')}, within groups "
                        f"{last.get('critic_group_auc')} (last step, held-out tasks)")
        if "kl_sequence_mean" in last:
            kl = [x["kl_sequence_mean"] for x in r["rl"]]
            tenth = max(1, len(kl) // 10)
            more.append(f"KL to the reference per sample: steps 1-{tenth} {sum(kl[:tenth]) / tenth:.3f}, "
                        f"mid-run {kl[len(kl) // 2]:.3f}, last {tenth} {sum(kl[-tenth:]) / tenth:.3f}, max {max(kl):.3f}")
        if "refill_rounds" in last:
            rl = r["rl"]
            more.append(f"refill rounds per step {sum(x['refill_rounds'] for x in rl) / len(rl):.2f}, "
                        f"informative groups per step {sum(x['informative_groups'] for x in rl) / len(rl):.1f}")
        if last.get("clip_fraction_high") is not None and name in ("dapo", "gspo"):
            rl = [x for x in r["rl"] if x.get("clip_fraction") is not None]
            more.append(f"clip fraction (mean over steps) low {sum(x['clip_fraction_low'] for x in rl) / len(rl):.3f}, "
                        f"high {sum(x['clip_fraction_high'] for x in rl) / len(rl):.3f}")
        if "explained_variance" in last:
            rl = r["rl"]
            more.append("value model: explained variance at steps 1/10/last " + " / ".join(
                f"{rl[i]['explained_variance']:.2f}" for i in (0, min(9, len(rl) - 1), -1))
                + f", value loss first/last {rl[0]['value_loss']:.3f} / {last['value_loss']:.3f}, "
                f"value clip fraction (mean) {sum(x['value_clip_fraction'] for x in rl) / len(rl):.3f}")
        entropy = last.get("entropy")
        print(f"| {name} | {r['after_sft']['pass@1']:.3f} | {final['pass@1']:.3f} | {final['greedy_pass@1']:.3f} | "
              f"{'-' if entropy is None else f'{entropy:.3f}'} | {r['rl_seconds']:.0f} s | {r['learn_s_per_step']:.2f} s | "
              f"{r['learner_rss_mb']:.0f} MB | {r['samples']} | {'; '.join(more)} |")
    ratios = [("rloo", "reinforce"), ("rloo+kl", "rloo"), ("rloo+kl+soft", "rloo"), ("rloo+kl+soft", "rloo+kl"), ("dapo", "rloo"), ("dr-grpo", "rloo"), ("gspo", "rloo"), ("ppo+dense", "rloo+dense"), ("ppo+dense", "rloo"),
              ("ppo+dense+shared", "rloo+dense"), ("ppo+dense+shared", "ppo+dense")]
    for name, base in ratios:
        if name in results and base in results:
            r, b = results[name], results[base]
            print(f"  {name} / {base}: {r['final']['pass@1'] / max(b['final']['pass@1'], 1e-9):.2f}x pass@1, "
                  f"{r['rl_seconds'] / max(b['rl_seconds'], 1e-9):.2f}x RL time, "
                  f"{r['learn_s_per_step'] / max(b['learn_s_per_step'], 1e-9):.2f}x learner time per step, "
                  f"{r['learner_rss_mb'] / max(b['learner_rss_mb'], 1e-9):.2f}x learner peak memory")
    base = "rloo" if "rloo" in results else names[0]
    return [comparison(f"held-out pass@1 after {STEPS} RL steps", "pass@1", base,
                       {name: r["final"]["pass@1"] for name, r in results.items()})]


if __name__ == "__main__":
    main()
