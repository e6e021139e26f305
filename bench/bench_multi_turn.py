"""Multi-turn environments against single turns, from the same SFT and RL budget, on the synthetic
suite.

    python -m bench.bench_multi_turn        # BENCH_MULTI_TURN_STEPS=60 RL steps per run

Three training runs of the default config's SFT steps and RL steps, prompts and samples per step:

- single: configs/default.yaml, one attempt per sample.
- refine: configs/refine.yaml, up to 3 attempts from execution feedback, SFT with refinement
  demonstrations; its evaluations give pass@1 after rounds 1, 2 and 3 and single-turn pass@1 of the
  same checkpoint.
- interpreter: configs/interpreter.yaml, one run of the code interpreter before the answer, SFT
  with tool-use traces; its evaluations give pass@1 with the tool and single-turn pass@1 of the same
  checkpoint.
- refine+cost: refine with env.turn_cost 0.2 (a pass in round 2 earns 0.2 less than one in round 1):
  whether paying for the first attempt keeps it as good as a single-turn policy's.
- refine+critic: refine with a critic (critic.enabled) that chooses which 2 of a task's failed
  attempts are refined each round (env.per_round 2, env.choose critic), as CodeRL does; its
  evaluations also give pass@1 of the same policy when 2 are chosen at random (pass@1_random_choice).

Each row gives the held-out numbers after SFT and at the end, the RL phase's wall time and the
trajectories it sampled (and the policy's turns), so that what a gain costs is on the same line.
With single and refine among the variants, one more single-turn run gets as many RL steps as fit
in refine's RL time (`single, equal time`): refine is compared at equal samples and at equal time.
Feedback quotes a task's shown tests only; rewards and evaluations count its held tests
(docs/evaluation.md, "Shown and held tests").
"""
from __future__ import annotations

import os
import tempfile

from bench.bench_algorithms import run
from bench.plots import comparison

STEPS = int(os.environ.get("BENCH_MULTI_TURN_STEPS", "60"))
VARIANTS = {  # name: (config file, overrides)
    "single": ("configs/default.yaml", []),
    "refine": ("configs/refine.yaml", []),
    "interpreter": ("configs/interpreter.yaml", []),
    "refine+cost": ("configs/refine.yaml", ["env.turn_cost=0.2"]),
    "refine+critic": ("configs/refine.yaml", ["critic.enabled=true", "env.per_round=2", "env.choose=critic"]),
}


def _rates(metrics: dict) -> str:
    rounds = [metrics[f"pass@1_round{r}"] for r in (1, 2, 3) if f"pass@1_round{r}" in metrics]
    parts = []
    if rounds:
        parts.append("rounds 1/2/3 " + " / ".join(f"{r:.3f}" for r in rounds))
    if "single_turn_pass@1" in metrics:
        parts.append(f"single-turn {metrics['single_turn_pass@1']:.3f} (greedy {metrics['single_turn_greedy_pass@1']:.3f})")
    if "pass@1_random_choice" in metrics:
        parts.append(f"chosen at random {metrics['pass@1_random_choice']:.3f}")
    if metrics.get("tool_calls_mean"):
        parts.append(f"tool calls {metrics['tool_calls_mean']:.2f}")
    return "; ".join(parts) or "-"


def main() -> list[dict]:
    root = tempfile.mkdtemp(prefix="bench-multi-turn-")
    chosen = os.environ.get("BENCH_MULTI_TURN_VARIANTS")
    names = chosen.split(",") if chosen else list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"BENCH_MULTI_TURN_VARIANTS: unknown {', '.join(unknown)}; valid: {', '.join(VARIANTS)}")
    results = {name: run(*VARIANTS[name], f"{root}/{name.replace('+', '-')}", steps=STEPS) for name in names}
    if "single" in results and "refine" in results:
        steps = round(STEPS * results["refine"]["rl_seconds"] / results["single"]["rl_seconds"])
        results["single, equal time"] = run(*VARIANTS["single"], f"{root}/single-equal-time", steps=steps)
    print(f"multi-turn environments on the synthetic suite, the default's SFT and {STEPS} RL steps each "
          f"(held-out pass@1, 8 samples per task, T=1; run directories in {root})")
    print("| run | pass@1 after SFT | there: | pass@1 | greedy pass@1 | at the end: | RL time | trajectories | policy turns |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        sft, final, rl = r["after_sft"], r["final"], r["rl"]
        turns = sum(x.get("turns_mean", 1.0) * x["samples"] for x in rl)
        print(f"| {name} | {sft['pass@1']:.3f} | {_rates(sft)} | {final['pass@1']:.3f} | {final['greedy_pass@1']:.3f} | "
              f"{_rates(final)} | {r['rl_seconds']:.0f} s | {r['samples']} | {turns:.0f} |")
    for name in ("refine", "interpreter", "refine+cost"):
        for base in ("single", "single, equal time"):
            if name in results and base in results:
                r, b = results[name], results[base]
                print(f"  {name} - {base}: {100 * (r['final']['pass@1'] - b['final']['pass@1']):+.1f} points of pass@1, "
                      f"{r['rl_seconds'] / max(b['rl_seconds'], 1e-9):.2f}x RL time, {r['samples'] / max(b['samples'], 1):.2f}x trajectories")
    for name in ("refine", "refine+cost", "refine+critic"):
        if name in results:
            final = results[name]["final"]
            print(f"  {name}: round 3 - round 1 = {100 * (final['pass@1_round3'] - final['pass@1_round1']):+.1f} points of held-out pass@1")
    if "refine+critic" in results:
        final = results["refine+critic"]["final"]
        print(f"  refine+critic: the critic's choice - a random choice = {100 * (final['pass@1'] - final['pass@1_random_choice']):+.1f} "
              "points of held-out pass@1 (the same policy)")
    return [comparison(f"held-out pass@1 after {STEPS} RL steps", "pass@1", "single" if "single" in results else names[0],
                       {name: r["final"]["pass@1"] for name, r in results.items()})]


if __name__ == "__main__":
    main()
