"""The run report: `report.html` in a run directory, built from its metrics.jsonl and samples.jsonl
alone (and config.yaml and summary.json when they are there), so `coderloo report RUN_DIR` can
rebuild it for any run, finished or not, old or new.

One self-contained file: the run's numbers as inline JSON and a small script of ours
(report.js) that draws the charts as SVG in the browser. It fetches nothing, and its content
security policy lets only that script and that style sheet run: a completion that says
`<script>` or `onerror=` is model output, shown as text and never executed."""
from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import time
from pathlib import Path

import yaml

from coderloo.metrics import read_metrics

PAGE_DIR = Path(__file__).parent
# The step's own parts, in order; they sum to time_step_s (coderloo.controller.step_record) up to
# the few instructions between them, shown as "other".
# The wait for rollouts is split by what the learner waited for (a run from before the split has
# the wait whole).
STEP_PARTS = {"time_wait_generation_s": "wait: generation", "time_wait_scoring_s": "wait: scoring",
              "time_wait_refill_s": "wait: refill rounds", "time_learn_s": "learn", "time_sync_s": "weight sync"}
WHOLE_WAIT_PARTS = {"time_wait_rollouts_s": "wait for rollouts", "time_learn_s": "learn", "time_sync_s": "weight sync"}
# The step's rollouts: made in the background, so they overlap the learning of the steps before.
ROLLOUT_PARTS = {"time_generate_s": "generate", "time_score_tail_s": "score after the last sample",
                 "time_env_s": "environment (multi-turn: scoring and runs between turns)"}
# Config fields worth reading in the header, with their labels.
HIGHLIGHTS = {
    "model.path": "model", "rollout.backend": "engine", "tasks.train_set": "train set", "tasks.eval_set": "eval set",
    "learner.advantage.type": "estimator", "learner.lr": "lr", "learner.kl.coef": "KL coef",
    "sft.steps": "SFT steps", "train.steps": "RL steps", "train.prompts_per_step": "prompts / step",
    "rollout.samples_per_prompt": "samples / prompt", "train.max_staleness": "max staleness",
    "eval.samples_per_task": "eval samples / task", "env.name": "environment", "critic.enabled": "critic",
    "curriculum.enabled": "curriculum",
}
SAMPLE_STEPS = 3  # the latest RL steps whose sampled group the report shows


def write_report(run_dir: str | Path) -> Path:
    """Write `report.html` into `run_dir` from the run's files; returns its path."""
    run_dir = Path(run_dir)
    path = run_dir / "report.html"
    path.write_text(render(report_data(run_dir)), encoding="utf-8")
    return path


def report_data(run_dir: Path) -> dict:
    """What the page shows, as plain JSON: series per chart, tables, the header."""
    records = read_metrics(run_dir / "metrics.jsonl")
    samples_path = run_dir / "samples.jsonl"
    samples = read_metrics(samples_path) if samples_path.exists() else []
    rl = [r for r in records if r["phase"] == "rl"]
    sft = [r for r in records if r["phase"] == "sft"]
    evals = [r for r in records if r["phase"] == "eval"]
    times = [r["time"] for r in records if isinstance(r.get("time"), (int, float))]
    return {
        "run": run_dir.resolve().name,
        "span": _span(times),
        "highlights": _highlights(run_dir / "config.yaml"),
        "summary": _summary(run_dir / "summary.json"),
        "train": _train(rl),
        "sft": {"step": [r["step"] for r in sft], "loss": _column(sft, "sft_loss")},
        "evals": [{"label": _eval_label(r), **{k: _number(v) for k, v in r.items() if k.startswith(("pass@", "greedy_pass@"))}}
                  for r in evals],
        "timeline": _timeline(rl),
        "by_difficulty": _breakdown(evals, "by_difficulty", key=int),
        "by_family": _breakdown(evals, "by_family", key=str),
        "samples": [_sample(r) for r in samples[-SAMPLE_STEPS:]][::-1],
    }


def _train(rl: list[dict]) -> dict:
    """The RL steps' series: reward and pass rate, entropy, clipping, PPO's value model, and the mean
    score of coverage and of each plugged-in reward component (component_<name>_mean)."""
    columns = ("reward_mean", "pass_rate", "entropy", "clip_fraction_low", "clip_fraction_high", "explained_variance", "value_loss")
    components = dict.fromkeys(k for r in rl for k in r if k.startswith("component_") and k.endswith("_mean"))
    return {"step": [r["step"] for r in rl], **{key: _column(rl, key) for key in columns},
            "components": {key.removeprefix("component_").removesuffix("_mean"): _column(rl, key) for key in components}}


def render(data: dict) -> str:
    script = (PAGE_DIR / "report.js").read_text(encoding="utf-8")
    style = (PAGE_DIR / "report.css").read_text(encoding="utf-8")
    policy = f"default-src 'none'; script-src {_sha256(script)}; style-src {_sha256(style)}"
    return (
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{policy}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>coderloo run {html.escape(data['run'])}</title>\n<style>{style}</style>\n</head>\n<body>\n"
        f"<script type=\"application/json\" id=\"run-data\">{_inline_json(data)}</script>\n"
        "<main id=\"report\"></main>\n<noscript>This report draws its charts with JavaScript.</noscript>\n"
        f"<script>{script}</script>\n</body>\n</html>\n"
    )


def _inline_json(data: dict) -> str:
    """JSON that stays one text node inside <script>: with <, > and & escaped as \\u00XX (still the
    same JSON), no `</script>` or `<!--` in a completion can end the block."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _number(value) -> float | None:
    """A finite number, or None (JSON has no NaN; a missing value is a gap in a chart)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def _column(records: list[dict], key: str) -> list[float | None]:
    return [_number(r.get(key)) for r in records]


def _span(times: list[float]) -> str:
    if not times:
        return ""
    start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(min(times)))
    return f"first record {start}, last {(max(times) - min(times)) / 60:.1f} min later"


def _highlights(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    config = yaml.safe_load(path.read_text()) or {}
    out = []
    for dotted, label in HIGHLIGHTS.items():
        value = config
        for part in dotted.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            out.append([label, str(value)])
    return out


def _summary(path: Path) -> dict | None:
    """The run's base / after-SFT / final evaluation (summary.json: only a finished run has it)."""
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    return {stage: {k: _number(v) for k, v in summary[stage].items() if "pass@" in k}
            for stage in ("base", "after_sft", "final") if isinstance(summary.get(stage), dict)}


def _eval_label(record: dict) -> str:
    if record.get("stage") == "base":
        return "start"
    return "after SFT" if record["step"] == 0 else f"step {record['step']}"


def _timeline(rl: list[dict]) -> dict | None:
    if not any("time_step_s" in r for r in rl):
        return None
    parts = STEP_PARTS if any("time_wait_generation_s" in r for r in rl) else WHOLE_WAIT_PARTS
    step_parts = {label: _column(rl, key) for key, label in parts.items()}
    step_parts["other"] = [None if total is None else max(0.0, total - sum(v or 0.0 for v in parts))
                           for total, *parts in zip(_column(rl, "time_step_s"), *step_parts.values())]
    rollout_parts = {label: _column(rl, key) for key, label in ROLLOUT_PARTS.items() if any(key in r for r in rl)}
    return {"step": [r["step"] for r in rl], "step_parts": step_parts, "rollout_parts": rollout_parts or None}


def _breakdown(evals: list[dict], field: str, key) -> dict | None:
    """Pass rate per group at the start, after SFT and at the last evaluation that recorded it."""
    recorded = [r for r in evals if isinstance(r.get(field), dict)]
    if not recorded:
        return None
    picked: list[dict] = []
    for record in [recorded[0], *[r for r in recorded if _eval_label(r) == "after SFT"][:1], recorded[-1]]:
        if record not in picked:
            picked.append(record)
    groups = sorted({g for r in picked for g in r[field]}, key=key)
    return {"columns": [_eval_label(r) for r in picked], "rows": {g: [_number(r[field].get(g)) for r in picked] for g in groups}}


def _sample(record: dict) -> dict:
    feedback = record.get("feedback")
    rows = [{"text": text, "reward": _number(reward), "feedback": feedback[i] if feedback is not None else None}
            for i, (text, reward) in enumerate(zip(record["completions"], record["rewards"]))]
    return {"step": record["step"], "task": record["task"], "rows": rows}
