"""The benchmarks' numbers in one machine-readable form, a bar chart of each comparison, and the
repeated runs behind a median.

Every benchmark's `main()` returns a list of `comparison(...)` dicts; bench/run.py writes them to
results.json and draws each one with `plot` from that same data, so the report, the JSON and the
charts cannot disagree.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path


def comparison(title: str, unit: str, ours: str, values: dict[str, float], lower_is_better: bool = False,
               key: str | None = None) -> dict:
    """One figure: `values` by label, in `unit`; `ours` is the label the others are measured against.
    `key` names the figure across runs of other sizes (bench/quick.py finds the committed one by it;
    without one, by its title)."""
    if ours not in values:
        raise ValueError(f"{ours!r} is not among the values {sorted(values)}")
    return {"title": title, "unit": unit, "ours": ours, "values": {k: float(v) for k, v in values.items()},
            "lower_is_better": lower_is_better, "key": key or title}


def alternating(repeats: int, runs: dict[str, Callable[[int], dict]]) -> dict[str, list[dict]]:
    """Each named run `repeats` times, taking turns (a slow spell of the shared machine hits all of
    them); `runs[name](i)` returns run i's numbers."""
    out: dict[str, list[dict]] = {name: [] for name in runs}
    for i in range(repeats):
        for name, run in runs.items():
            out[name].append(run(i))
    return out


def medians(results: dict[str, list[dict]]) -> dict[str, dict]:
    """Per name, the median of each number over its runs."""
    return {name: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for name, rs in results.items()}


def ratios(c: dict) -> dict[str, float]:
    """Ours over each alternative, as the benchmarks print them (a time ratio reads 'x slower')."""
    ours = c["values"][c["ours"]]
    return {label: ours / value for label, value in c["values"].items() if label != c["ours"] and value}


def plot(c: dict, path: Path) -> Path:
    """A bar per value, labelled with its number; each alternative's bar also with ours / it."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    labels = list(c["values"])
    heights = [c["values"][label] for label in labels]
    by_label = ratios(c)
    fig, ax = plt.subplots(figsize=(1.6 * len(labels) + 2.5, 3.6))
    bars = ax.bar(labels, heights, color=["tab:blue" if label == c["ours"] else "tab:gray" for label in labels])
    notes = [f"{h:.4g}" + (f"\n{c['ours']} / this: {by_label[label]:.2f}x" if label in by_label else "")
             for label, h in zip(labels, heights)]
    ax.bar_label(bars, notes, fontsize=8, padding=2)
    ax.set_ylabel(c["unit"] + (" (lower is better)" if c["lower_is_better"] else ""))
    ax.set_ylim(0, max(heights) * 1.3 or 1)
    ax.set_title(c["title"], fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
