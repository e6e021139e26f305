"""The critic on a real backbone (issue 63): Qwen2.5-Coder-0.5B-Instruct's own samples on MBPP+,
their outcomes as the sandbox judged them (every test deciding), a critic started from the same
model and trained on half of the tasks, and its pick among each held-out task's K samples against
a random pick, a majority vote and a vote weighted by it.

    python -m bench.bench_real_critic        # the samples once (coderloo eval), then the critic

The samples come from `coderloo eval --samples` (K per task at temperature 0.8, the chat template's
prompts, the first TASKS tasks of MBPP+); each is given to the critic as a run gives it (the rendered
prompt's ids and the answer's). The critic's backbone is frozen (critic.backbone frozen): its
features are computed once per program, a forward pass without gradients, and the head trains on
them (`critic.observe` EPOCHS times: the same calls a training run makes each step). Fine-tuning the
backbone as well, a forward and backward of 630M parameters per program and optimizer step, takes
hours here. Which tasks it never trains on is `learner.critic.heldout_task` at HELDOUT, by task as
in a run. A record of each run is appended to bench/real_critic.jsonl.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.bench_real_rl import CONFIG, MODEL, _commit

RECORDS = Path(__file__).parent / "real_critic.jsonl"
OUT = Path(os.environ.get("BENCH_REAL_CRITIC_DIR", "runs/bench-real-critic"))
TASKS = int(os.environ.get("BENCH_REAL_CRITIC_TASKS", "60"))
K = 4
EPOCHS = int(os.environ.get("BENCH_REAL_CRITIC_EPOCHS", "10"))
HELDOUT = 0.5
RANK_COEF = float(os.environ.get("BENCH_REAL_CRITIC_RANK_COEF", "0"))  # critic.rank_coef
SEED = 0


def samples() -> Path:
    """The policy's K samples per task (written once; a later run reuses them)."""
    path = OUT / f"samples-{TASKS}x{K}.jsonl"
    if not path.exists():
        OUT.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        with open(OUT / "samples.log", "w") as log:
            rc = subprocess.call([sys.executable, "-m", "coderloo.cli", "eval", "--config", CONFIG, "--sets", "mbpp+",
                                  "--samples", str(partial), "--out", str(OUT / "samples-eval.json"), "--overwrite",
                                  f"tasks.max_eval_tasks={TASKS}", f"eval.samples_per_task={K}", "eval.k=[1]",
                                  "eval.greedy=false", "eval.sampled=true", "eval.temperature=0.8", f"train.seed={SEED}"],
                                 stdout=log, stderr=subprocess.STDOUT)
        if rc:
            raise SystemExit(f"coderloo eval failed ({rc}): see {OUT / 'samples.log'}")
        partial.rename(path)
    return path


def main() -> dict:
    from coderloo.config import load_config
    from coderloo.evaluation import pass_rate_of_pick, vote_scores
    from coderloo.model_import import fetch
    from coderloo.runtime import init_ray
    from coderloo.tasksets.evalsets import load_eval_set
    from common.hf import load_tokenizer
    from learner.config import CriticConfig
    from learner.critic import OUTCOMES, OnlineCritic, heldout_task
    from reward_service.schemas import OUTCOME_CLASS
    from rollout_workers.prompts import render
    from sandbox_pool import Status

    start = time.monotonic()
    rows = [json.loads(line) for line in samples().read_text().splitlines()]
    sampled_s = time.monotonic() - start
    config = load_config(CONFIG, [])
    model = fetch(MODEL)
    tokenizer = load_tokenizer(model)
    tasks = {t.id: t for t in load_eval_set("mbpp+", config.eval.data_dir, TASKS)}
    ids = [r["task_id"] for r in rows]
    prompts = [tokenizer(render(tasks[i], tokenizer, config.prompt), add_special_tokens=False)["input_ids"] for i in ids]
    answers = [tokenizer(r["completion"], add_special_tokens=False)["input_ids"] for r in rows]
    classes = [OUTCOME_CLASS.get(Status(r["status"])) for r in rows]  # None: the sandbox failed, no label
    labels = [None if c is None else OUTCOMES.index(c) for c in classes]

    init_ray(num_cpus=2)
    critic_config = CriticConfig(enabled=True, backbone="frozen", heldout_fraction=HELDOUT, lr=1e-3, batch_size=32,
                                 steps_per_rl_step=8, select_n=K, threads=2,
                                 rank_coef=RANK_COEF)
    critic = OnlineCritic(str(model), critic_config, seed=SEED)
    trained = time.monotonic()
    try:
        by_epoch = []
        for _ in range(EPOCHS):
            step = critic.observe(ids, prompts, answers, labels)
            by_epoch.append({k: v if v is None else round(v, 4) for k, v in step.metrics().items()})
        held = [i for i, task_id in enumerate(ids) if heldout_task(task_id, HELDOUT)]
        odds = critic.log_odds([prompts[i] for i in held], [answers[i] for i in held])
    finally:
        critic.kill()
    trained_s = time.monotonic() - trained

    groups: dict[str, list[int]] = {}  # the held-out samples of each task, in order
    for n, i in enumerate(held):
        groups.setdefault(ids[i], []).append(n)
    whole = [g for g in groups.values() if len(g) == K]
    passed = np.array([[rows[held[n]]["passed"] for n in g] for g in whole], dtype=float)
    scores = np.array([[odds[n] for n in g] for g in whole])
    p_passed = 1 / (1 + np.exp(-scores))
    texts = [[rows[held[n]]["completion"] for n in g] for g in whole]
    record = {
        "commit": _commit(), "tasks": TASKS, "k": K, "epochs": EPOCHS, "backbone": "frozen", "rank_coef": RANK_COEF, "heldout_tasks": len(whole),
        "train_tasks": len(set(ids)) - len(groups), "mixed_heldout_tasks": int(((passed.sum(1) > 0) & (passed.sum(1) < K)).sum()),
        "pass@1_random": round(float(passed.mean()), 4),
        "pass@1_critic": round(pass_rate_of_pick(passed, scores), 4),
        "pass@1_vote": round(pass_rate_of_pick(passed, vote_scores(texts, np.ones_like(scores))), 4),
        "pass@1_critic_vote": round(pass_rate_of_pick(passed, vote_scores(texts, p_passed)), 4),
        "p_passed_tied_at_top": int(sum((row == row.max()).sum() > 1 for row in p_passed.astype(np.float32))),
        "pass@k": round(float((passed.sum(1) > 0).mean()), 4),
        "last_epoch": by_epoch[-1], "auc_by_epoch": [m["critic_auc"] for m in by_epoch],
        "sampled_s": round(sampled_s), "critic_s": round(trained_s),
    }
    with open(OUT / f"scores-rank{RANK_COEF:g}.jsonl", "w") as f:  # each held-out sample's score, for a closer look
        for n, i in enumerate(held):
            f.write(json.dumps({"task_id": ids[i], "passed": rows[i]["passed"], "log_odds": float(odds[n])}) + "\n")
    with open(RECORDS, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record, indent=1))
    return record


if __name__ == "__main__":
    main()
