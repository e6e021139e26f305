"""The soak's verdict: whether any resource a run holds (coderloo.ops.resources, sampled into the
`resources` records of its metrics.jsonl) grows as it runs.

    python -m coderloo.ops.soak RUN_DIR [--chart PNG] [--results bench/results.md]

prints a table (series, first, last, slope per 100 steps, verdict) and exits 1 when a series grows.

A series is judged after a warm-up (the first `WARMUP` of its samples: engines, allocators and
caches fill, the first checkpoint is written) by its Theil-Sen slope over the steps, which a few
outliers do not move. It grows when the slope's 95% interval lies above 0 (the growth is real,
not noise) and the growth that slope makes over the judged steps exceeds a tolerance: the larger
of `RELATIVE` of the series' median and a floor per kind (50 MB of memory, 8 descriptors, 2
processes, ...): allocator noise and a worker pool that breathes are not leaks.

Some series grow by design and are judged otherwise: the run's records (metrics, samples, logs)
are appended to every step, so they may grow by at most `RECORD_BUDGET_MB` per step. Checkpoints
are judged like the rest: the soak keeps the newest few (`train.keep_checkpoints`), so their
count and total size must stay flat too, as must the latest one's size.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from scipy.stats import theilslopes

from coderloo.metrics import read_metrics

WARMUP = 0.2  # of the samples: not judged
RELATIVE = 0.05  # of the median: growth over the judged steps below this is noise
MIN_SAMPLES = 5  # judged samples needed for a verdict
RECORD_BUDGET_MB = 0.25  # per RL step: what metrics.jsonl, samples.jsonl and the logs may add
# The smallest growth over the judged steps that counts, per series kind (the key's prefix).
FLOORS = {"rss_mb": 50.0, "peak_rss_mb": 50.0, "fds": 8.0, "children": 2.0, "dev_shm_mb": 20.0, "run_dir_other_mb": 20.0,
          "checkpoint_latest_mb": 20.0, "checkpoints": 1.0, "checkpoints_mb": 20.0, "checkpoints_partial": 1.0,
          "sandbox_leaked_processes": 1.0}


@dataclass
class Verdict:
    series: str
    first: float
    last: float
    slope_per_100: float  # per 100 RL steps, over the judged samples
    verdict: str  # flat, grows, within budget, over budget, too few samples
    why: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict in ("grows", "over budget")


def kind(series: str) -> str:
    return series.split("/", 1)[0]


def judge(series: str, points: list[tuple[int, float]], warmup: float = WARMUP) -> Verdict:
    """Whether one series, (step, value) points in step order, is flat (see the module's docstring)."""
    points = sorted(points)
    judged = points[math.floor(len(points) * warmup):]
    first, last = points[0][1] if points else math.nan, points[-1][1] if points else math.nan
    if len(judged) < MIN_SAMPLES or judged[0][0] == judged[-1][0]:
        return Verdict(series, first, last, math.nan, "too few samples", f"{len(judged)} after the warm-up")
    steps, values = [s for s, _ in judged], [v for _, v in judged]
    slope, _, low, high = theilslopes(values, steps, alpha=0.95)
    span = steps[-1] - steps[0]
    verdict = Verdict(series, first, last, slope * 100, "flat")
    if series == "records_mb":
        over = slope > RECORD_BUDGET_MB
        verdict.verdict = "over budget" if over else "within budget"
        verdict.why = f"{slope * 1024:.1f} KB/step (budget {RECORD_BUDGET_MB * 1024:.0f})"
    else:
        tolerance = max(RELATIVE * abs(sorted(values)[len(values) // 2]), FLOORS.get(kind(series), 0.0))
        growth = slope * span
        if low > 0 and growth > tolerance:
            verdict.verdict = "grows"
        verdict.why = f"{growth:+.3g} over {span} steps (tolerance {tolerance:.3g})"
    return verdict


def resource_series(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """The run's `resources` records as series: key -> (RL step, value)."""
    series: dict[str, list[tuple[int, float]]] = {}
    for record in read_metrics(Path(run_dir) / "metrics.jsonl"):
        if record["phase"] != "resources":
            continue
        for key, value in record.items():
            if key not in ("phase", "step", "time") and isinstance(value, (int, float)):
                series.setdefault(key, []).append((record["step"], float(value)))
    return series


def verdicts(series: dict[str, list[tuple[int, float]]]) -> list[Verdict]:
    return [judge(name, points) for name, points in sorted(series.items())]


def table(results: list[Verdict]) -> str:
    """A Markdown table of the verdicts."""
    lines = ["| series | first | last | slope / 100 steps | verdict | |", "|---|---:|---:|---:|---|---|"]
    for v in results:
        lines.append(f"| {v.series} | {v.first:.4g} | {v.last:.4g} | {v.slope_per_100:+.3g} | {v.verdict} | {v.why} |")
    return "\n".join(lines)


def plot(series: dict[str, list[tuple[int, float]]], path: Path, title: str) -> Path:
    """Memory, descriptors and processes over the steps, one line per process; /dev/shm and the run directory."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("rss_mb", "resident memory (MB)"), ("fds", "open file descriptors"), ("children", "child processes")]
    fig, axes = plt.subplots(1, 4, figsize=(20, 6))
    for ax, (prefix, label) in zip(axes, panels):
        for name, points in sorted(series.items()):
            if kind(name) == prefix:
                ax.plot([s for s, _ in points], [v for _, v in points], label=name.split("/", 1)[1], linewidth=1)
        ax.set_title(label)
        ax.set_xlabel("RL step")
    for name in ("dev_shm_mb", "records_mb", "run_dir_other_mb", "checkpoints_mb", "sandbox_leaked_processes"):
        if name in series:
            axes[3].plot([s for s, _ in series[name]], [v for _, v in series[name]], label=name, linewidth=1)
    axes[3].set_title("node and run directory (MB; leaked: processes)")
    axes[3].set_xlabel("RL step")
    for ax in axes:
        if ax.lines:
            ax.legend(fontsize=6, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.12))  # below: lines stay readable
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_section(results_md: Path, section: str) -> None:
    """Put `section` (starting `## NAME`: the soak's, or a benchmark's from bench/run.py) in
    results_md, in place of the one of that name there, or at its end."""
    text = results_md.read_text() if results_md.exists() else ""
    start = text.find("\n" + section.split("\n", 1)[0] + "\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + 1)
        text = text[:start + 1] + (section.rstrip("\n") + "\n\n" + text[end + 1:] if end >= 0 else section)
    results_md.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coderloo.ops.soak", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--chart", type=Path, help="write the series as a PNG here")
    parser.add_argument("--results", type=Path, help="put a `soak` section (chart and verdicts) in this Markdown file")
    args = parser.parse_args(argv)
    series = resource_series(args.run_dir)
    if not series:
        print(f"{args.run_dir / 'metrics.jsonl'}: no `resources` records (train.resources_every = 0?)", file=sys.stderr)
        return 2
    results = verdicts(series)
    steps = sorted({s for points in series.values() for s, _ in points})
    failed = [v.series for v in results if v.failed]
    summary = (f"{len(results)} series, {len(steps)} samples over RL steps {steps[0]}-{steps[-1]}: "
               + (f"GROWING: {', '.join(failed)}" if failed else "nothing grows"))
    print(table(results))
    print(summary)
    if args.chart:
        plot(series, args.chart, f"soak: {args.run_dir.name}, RL steps {steps[0]}-{steps[-1]}")
    if args.results:
        chart = f"![soak: memory, descriptors, processes over RL steps]({args.chart.resolve().relative_to(args.results.resolve().parent)})\n\n" if args.chart else ""
        write_section(args.results, f"## soak\n\n`make soak` (`coderloo train --config configs/soak.yaml`, then "
                      f"`python -m coderloo.ops.soak {args.run_dir}`)\n\n{summary}\n\n{chart}{table(results)}\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
