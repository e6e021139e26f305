"""RL that lifts a real model (issue 63): held-out pass@1 of the catalogue's Qwen2.5-Coder-0.5B-Instruct
before and after RLOO on MBPP's train split, by run.

    python -m bench.bench_real_rl base        # the base model's held-out figures (once per size of evaluation)
    python -m bench.bench_real_rl full-0      # one run: train, then evaluate its final checkpoint
    python -m bench.bench_real_rl refine-base # the base model's refinement at evaluation (note, and its control)
    python -m bench.bench_real_rl synthetic   # SmolLM2-135M against the random-init tiny model on the synthetic suite
    python -m bench.bench_real_rl table       # the runs recorded so far, each against the base

A run takes most of an hour on 2 cores, so the runs of one comparison span sessions: each appends
its record (its settings, the commit, its times and held-out figures) to bench/real_rl.jsonl, which
is committed as it lands; `table` reads that file. The runs (RUNS): full fine-tuning with seeds 0
and 1 (the seeds' spread), the same run with every reward 0 (reward.weights.constant: no learning
signal, so its "gain" is the evaluation's drift), LoRA with seed 0, and trained refinement (refine-0: its
evaluation is refinement's, with the feedback as a note and without it, against refine-base's). Each trains
configs/real-0.5b.yaml for STEPS steps of PROMPTS prompts x K samples (groups of equal rewards kept,
so that the control trains as the others do), then `coderloo eval` judges its final checkpoint
greedily on the first EVAL_TASKS tasks of MBPP+ and of HumanEval+, every test deciding (EvalPlus's
base and plus inputs).

`synthetic` compares the two ways to start on `make train`'s synthetic suite at equal training time:
`make train` itself (the tiny randomly initialised model, configs/default.yaml) and the catalogue's
SmolLM2-135M-Instruct (configs/real-135m.yaml) for SYNTHETIC_STEPS steps, evaluated after each, so that
its held-out greedy pass@1 can be read at the tiny run's training time (the sum of its steps' times).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.plots import comparison

MODEL = "qwen2.5-coder-0.5b-instruct"
CONFIG = "configs/real-0.5b.yaml"
RECORDS = Path(__file__).parent / "real_rl.jsonl"
OUT = Path(os.environ.get("BENCH_REAL_RL_DIR", "runs/bench-real-rl"))
STEPS = int(os.environ.get("BENCH_REAL_RL_STEPS", "10"))
PROMPTS = int(os.environ.get("BENCH_REAL_RL_PROMPTS", "4"))
K = int(os.environ.get("BENCH_REAL_RL_K", "4"))
# Adam moves a weight about lr a step whatever the gradient's signal, and a step here has 16 samples (one
# optimizer step of them: learner.optimizer_steps' default 2 would make two of 2 groups each):
# 5e-6 cost HumanEval+ 12 points in ten steps (bench/results.md, "real_rl"); 2e-4 wrecked it in five.
LR = os.environ.get("BENCH_REAL_RL_LR", "1e-6")
LORA_LR = os.environ.get("BENCH_REAL_RL_LORA_LR", "2e-5")  # an adapter starts at zero: LoRA's usual 10x and more
EVAL_TASKS = int(os.environ.get("BENCH_REAL_RL_EVAL_TASKS", "100"))
SETS = "mbpp+,humaneval+"
REFINE = ["env.name=refine", "env.go_on=shown", "env.max_total_tokens=3072"]
RUNS = {
    "full-0": ["train.seed=0"],
    "full-1": ["train.seed=1"],
    "constant-0": ["train.seed=0", "reward.weights.constant=true"],
    "lora-0": ["train.seed=0", "learner.lora.rank=16", "learner.lora.alpha=32", "learner.lora.sync=adapter",
               "learner.lora.start=rl", f"learner.lr={LORA_LR}"],
    # Trained refinement: a failed attempt (one that fails the task's shown tests, as at evaluation) is
    # followed by a fresh one that reads what its run said (feedback note), each attempt a training
    # sequence. Up to 3 attempts make a step up to 3 times the learner's work: 6 steps keep it to an hour.
    "refine-0": ["train.seed=0", "train.steps=6", *REFINE, "env.feedback=note"],
}
# Refinement at evaluation (bench/results.md, "Refinement at evaluation"): MBPP+'s first 30 tasks, 2 samples at
# temperature 0.8, up to 3 attempts of 512 tokens, an attempt going on when it fails the shown tests; with the
# feedback as a note (`note`) and its equal-samples control (`none`, independent attempts under the same rule).
REFINE_EVAL = REFINE + [
    "eval.max_new_tokens=512", "eval.sampled=true", "eval.greedy=false", "eval.samples_per_task=2", "eval.k=[1]",
    "eval.temperature=0.8", "tasks.max_eval_tasks=30", "train.seed=0"]


def _coderloo(args: list[str], log: Path) -> float:
    """Run `coderloo ARGS` with its output in `log`; its wall time. A failed run stops the bench."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log, "w") as out:
        rc = subprocess.call([sys.executable, "-m", "coderloo.cli", *args], stdout=out, stderr=subprocess.STDOUT)
    if rc:
        raise SystemExit(f"coderloo {' '.join(args[:1])} failed ({rc}): see {log}")
    return time.monotonic() - start


def evaluate(model: Path, out: Path, adapter: Path | None = None) -> dict:
    """Greedy pass@1 on the first EVAL_TASKS of each set, and the evaluation's time."""
    report = out / "eval.json"
    seconds = _coderloo(["eval", "--config", CONFIG, "--model", str(model), *(["--adapter", str(adapter)] if adapter else []),
                         "--sets", SETS, "--out", str(report), "--overwrite", "--samples", str(out / "eval-samples.jsonl"),
                         f"tasks.max_eval_tasks={EVAL_TASKS}", "eval.greedy=true", "eval.sampled=false"], out / "eval.log")
    sets = json.loads(report.read_text())["sets"]
    return {"eval_s": round(seconds), **{name: r["greedy_pass@1"] for name, r in sets.items()},
            "passed": passed_tasks(out / "eval-samples.jsonl")}


def refinement(model: Path, out: Path) -> dict:
    """pass@1 after rounds 1, 2 and 3 with the feedback as a note and without it (the control), and their times."""
    figures = {}
    for feedback in ("note", "none"):
        where = out / f"refine-{feedback}"
        seconds = _coderloo(["eval", "--config", CONFIG, "--model", str(model), "--sets", "mbpp+", "--out", str(where / "eval.json"),
                             "--overwrite", "--samples", str(where / "samples.jsonl"), *REFINE_EVAL, f"env.feedback={feedback}"],
                            where / "eval.log")
        sets = json.loads((where / "eval.json").read_text())["sets"]["mbpp+"]
        figures[feedback] = {"eval_s": round(seconds), "rounds": [sets[f"pass@1_round{r}"] for r in (1, 2, 3)],
                             "turns_mean": sets["turns_mean"]}
    return figures


def passed_tasks(samples: Path) -> dict[str, list[str]]:
    """Each set's tasks whose greedy answer passed, from `coderloo eval --samples`: which tasks a run
    won and lost against the base, beyond the net figure."""
    passed: dict[str, list[str]] = {}
    for line in samples.read_text().splitlines():
        sample = json.loads(line)
        passed.setdefault(sample["set"], [])
        if sample["passed"]:
            passed[sample["set"]].append(sample["task_id"])
    return passed


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()


def _record(row: dict) -> None:
    with open(RECORDS, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))


def base() -> None:
    from coderloo.model_import import fetch

    commit = _commit()
    figures = evaluate(fetch(MODEL), OUT / "base")
    _record({"run": "base", "commit": commit, "eval_tasks": EVAL_TASKS, **figures})


def refine_base() -> None:
    """The base model's refinement figures, for the trained run's to be read against."""
    from coderloo.model_import import fetch

    commit = _commit()
    _record({"run": "refine-base", "commit": commit, "refinement": refinement(fetch(MODEL), OUT / "refine-base")})


def run(name: str) -> None:
    from coderloo.model_import import fetch

    out, commit = OUT / name, _commit()  # what runs: later commits may land before the run ends
    overrides = [f"model.path={fetch(MODEL)}", f"train.output_dir={out}", f"train.steps={STEPS}",
                 f"train.prompts_per_step={PROMPTS}", f"rollout.samples_per_prompt={K}", f"learner.lr={LR}",
                 "learner.advantage.filter_uninformative=false", "learner.optimizer_steps=1", "train.eval_every=0", "train.checkpoint_every=0",
                 "tasks.max_eval_tasks=1", "train.resources_every=1", *RUNS[name]]
    train_s = _coderloo(["train", "--config", CONFIG, *overrides], out.with_suffix(".train.log"))
    final = out / "checkpoints" / "final"
    lora = any(o.startswith("learner.lora.") for o in RUNS[name])
    if name.startswith("refine"):
        figures = {"refinement": refinement(final, out)}
    else:
        figures = evaluate(fetch(MODEL) if lora else final, out, final / "adapter" if lora else None)
    rl = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rl if r.get("phase") == "rl"]
    _record({"run": name, "commit": commit, "overrides": overrides[1:], "eval_tasks": EVAL_TASKS, "train_s": round(train_s),
             "samples": sum(r["samples"] for r in rl), "pass_rate_by_step": [round(r["pass_rate"], 4) for r in rl],
             **figures})


SYNTHETIC_STEPS = int(os.environ.get("BENCH_REAL_RL_SYNTHETIC_STEPS", "3"))


def _curve(out: Path) -> list[dict]:
    """A run's held-out greedy pass@1 at each evaluation (the base model's first, then after the SFT
    warm-up and after RL steps), with the training time to it: the SFT warm-up's span and the RL steps' times."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    sft = [r["time"] for r in records if r["phase"] == "sft"]
    trained = sft[-1] - records[0]["time"] if sft else 0.0  # records[0]: the base model's evaluation, which SFT follows
    by_step = {0: trained}
    for r in records:
        if r["phase"] == "rl":
            trained += r["time_step_s"]
            by_step[r["step"]] = trained
    return [{"stage": r["stage"], "step": r["step"], "train_s": round(by_step[r["step"]] if r["stage"] == "rl" else 0.0),
             "greedy": r["greedy_pass@1"]} for r in records if r["phase"] == "eval"]


def synthetic() -> None:
    from coderloo.model_import import fetch

    fetch("smollm2-135m-instruct")
    runs = {"tiny-random": ("configs/default.yaml", []),
            "smollm2-135m": ("configs/real-135m.yaml", [f"train.steps={SYNTHETIC_STEPS}", "train.eval_every=1"])}
    row = {"run": "synthetic", "commit": _commit(), "seed": 0}
    for name, (config, overrides) in runs.items():
        out = OUT / f"synthetic-{name}"
        wall = _coderloo(["train", "--config", config, f"train.output_dir={out}", "train.seed=0", "train.checkpoint_every=0",
                          *overrides], out.with_suffix(".train.log"))
        row[name] = {"config": config, "overrides": overrides, "wall_s": round(wall), "held_out": _curve(out)}
    _record(row)


def _point(p: dict) -> str:
    where = "base" if p["stage"] == "base" else f"{p['stage']} step {p['step']}"
    return f"{where} {100 * p['greedy']:.1f}% ({p['train_s']} s)"


def table() -> list[dict]:
    every = [json.loads(line) for line in RECORDS.read_text().splitlines()] if RECORDS.exists() else []
    rows = [r for r in every if r["run"] != "synthetic" and "refinement" not in r]
    bases = {r["eval_tasks"]: r for r in rows if r["run"] == "base"}
    sets = SETS.split(",")
    print(f"held-out greedy pass@1, {MODEL}, first N tasks of each set, every test deciding; gain over the base")
    print("| run | commit | lr | N | " + " | ".join(f"{s} | gain" for s in sets) + " | train | eval |")
    print("|---|---|---|---|" + "---|---|" * len(sets) + "---|---|")
    figures = []
    for r in rows:
        b = bases.get(r["eval_tasks"])
        cells = [f"{100 * r[s]:.1f}% | " + ("-" if r["run"] == "base" or b is None else f"{100 * (r[s] - b[s]):+.1f}") for s in sets]
        lr = [o.split("=", 1)[1] for o in r.get("overrides", []) if o.startswith("learner.lr=")]
        print(f"| {r['run']} | {r['commit']} | {lr[-1] if lr else '-'} | {r['eval_tasks']} | " + " | ".join(cells) +
              f" | {r.get('train_s', 0) / 60:.0f} min | {r['eval_s'] / 60:.0f} min |")
    for r in rows:
        b = bases.get(r["eval_tasks"])
        if r["run"] != "base" and b is not None and "passed" in r and "passed" in b:
            moved = [f"{s} {len(set(r['passed'][s]) - set(b['passed'][s]))} won, {len(set(b['passed'][s]) - set(r['passed'][s]))} lost"
                     for s in sets]
            print(f"{r['run']} ({r['commit']}) against the base, by task: " + "; ".join(moved))
    latest = {r["run"]: r for r in rows}
    if {"base", "full-0", "full-1", "constant-0"} <= latest.keys():
        b = latest["base"]
        for s in sets:
            gains = [latest[n][s] - b[s] for n in ("full-0", "full-1")]
            spread, control = abs(gains[0] - gains[1]), latest["constant-0"][s] - b[s]
            mean = sum(gains) / 2
            verdict = "met" if mean > 2 * spread and mean > control else "missed"
            print(f"goal 1 on {s}: mean gain {100 * mean:+.1f} against twice the seeds' spread {200 * spread:.1f} and the "
                  f"constant reward's {100 * control:+.1f}: {verdict}")
    for r in every:
        for feedback, f in r.get("refinement", {}).items():
            print(f"refinement, {r['run']} ({r['commit']}), {feedback}: pass@1 after rounds 1 / 2 / 3 "
                  + " / ".join(f"{100 * p:.1f}%" for p in f["rounds"]) + f", {f['turns_mean']:.2f} attempts, {f['eval_s']} s")
        if r["run"] == "synthetic":
            tiny, small = r["tiny-random"], r["smollm2-135m"]
            budget = tiny["held_out"][-1]["train_s"]
            within = [p for p in small["held_out"] if p["train_s"] <= budget]
            print(f"\nsynthetic suite, held-out greedy pass@1 at {r['commit']}, seed {r['seed']}: the tiny random-init model "
                  + ", ".join(_point(p) for p in tiny["held_out"]) + f" ({tiny['wall_s']} s in all); SmolLM2-135M "
                  + ", ".join(_point(p) for p in small["held_out"]) + f" ({small['wall_s']} s in all); within the tiny run's "
                  f"{budget} s of training: {100 * within[-1]['greedy']:.1f}% against {100 * tiny['held_out'][-1]['greedy']:.1f}%")
    for s in sets:
        latest = {r["run"]: 100 * r[s] for r in rows}  # a run recorded twice: its latest
        if "base" in latest and len(latest) > 1:
            figures.append(comparison(f"held-out greedy pass@1 on {s}, {MODEL}, before and after RL", "%", "base", latest,
                                      key=f"real_rl, {s}"))
    return figures


def main() -> list[dict]:
    """`make bench`'s part: the table of the runs recorded so far (each run is its own command)."""
    return table()


if __name__ == "__main__":
    what = sys.argv[1] if sys.argv[1:] else "table"
    if what == "base":
        base()
    elif what == "refine-base":
        refine_base()
    elif what == "synthetic":
        synthetic()
    elif what in RUNS:
        run(what)
    elif what != "table":
        raise SystemExit(f"bench_real_rl: {what!r}: base, refine-base, synthetic, table or one of the runs {', '.join(RUNS)}")
    table()
