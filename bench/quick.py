"""`make bench-quick`: the hot paths' benchmarks in smaller runs (about 8 minutes), each figure next to
the one committed in bench/results.json, to run before a change to a hot path lands.

    python -m bench.quick            # all of QUICK
    python -m bench.quick sandbox    # the named ones

Each benchmark runs in this process with the sizes of QUICK (environment variables its module reads
at import). For each of its figures, found in results.json by its key, every value is printed now
and as committed, with the ratio between them; and ours against each alternative, now and
committed. On the same machine the two columns should agree within the run-to-run spread; across
machines only the within-run ratios compare. Nothing is written: `make bench` keeps the record.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time

from bench.plots import ratios
from bench.run import BENCHMARKS, RESULTS_DIR, cpu

# name: the environment that sizes its quick run
QUICK = {
    "trl": {"BENCH_TRL_REPEATS": "2", "BENCH_TRL_OPTIMIZER_STEPS": "1"},
    "sandbox": {},
    "reward_service": {},
    "pipeline": {"BENCH_PIPELINE_MODES": "sync", "BENCH_PIPELINE_REPEATS": "1", "BENCH_PIPELINE_STEPS": "8",
                 "BENCH_PIPELINE_PINNED_REPEATS": "0", "BENCH_PIPELINE_STREAM_REPEATS": "0"},
}


def committed() -> tuple[str, dict[str, dict], dict[str, str]]:
    """The committed record's commit line, its figures by key, and what each benchmark was
    measured on (CPU, commit, day; absent for records older than that field)."""
    record = json.loads((RESULTS_DIR / "results.json").read_text())
    commit = next((line for line in record["machine"] if "commit" in line), "")
    figures = {c.get("key", c["title"]): c for numbers in record["benchmarks"].values() for c in numbers["comparisons"]}
    measured_on = {name: numbers["measured_on"] for name, numbers in record["benchmarks"].items() if "measured_on" in numbers}
    return commit.strip("- "), figures, measured_on


def side_by_side(figure: dict, old: dict | None) -> list[str]:
    key = figure["key"]
    if old is None:
        return [f"  {key}: no committed figure (run `python -m bench.run` for its record)"]
    unit = figure["unit"]
    lines = [f"  {key} ({unit}; now | committed | now / committed)"]
    for label, value in figure["values"].items():
        before = old["values"].get(label)
        then = f"{before:10.3f} | x{value / before:5.2f}" if before else f"{'-':>10s} |"
        lines.append(f"    {label:44s} {value:10.3f} | {then}")
    now_r, old_r = ratios(figure), ratios(old)
    for label, r in now_r.items():
        then = f"{old_r[label]:.2f}x" if label in old_r else "-"
        lines.append(f"    {figure['ours']} / {label}: {r:.2f}x now, {then} committed")
    return lines


def main(names: list[str]) -> None:
    commit, record, measured_on = committed()
    report, started = [], time.time()
    for name in names:
        os.environ.update(QUICK[name])
        start = time.time()
        print(f"[bench-quick] {name} (python -m {BENCHMARKS[name]}, {' '.join(f'{k}={v}' for k, v in QUICK[name].items()) or 'as in make bench'})",
              flush=True)
        figures = importlib.import_module(BENCHMARKS[name]).main()
        then = measured_on.get(name, "an earlier machine, unnamed")
        other = "" if then.startswith(cpu() + ",") else " (another CPU than now's: compare the ratios within each run, not the values)"
        report.append(f"{name} ({time.time() - start:.0f} s; committed on {then}{other}):")
        for figure in figures:
            report.extend(side_by_side(figure, record.get(figure["key"])))
    print(f"\nbench-quick against bench/results.json ({commit}), {time.time() - started:.0f} s in all")
    print("\n".join(report))


if __name__ == "__main__":
    if unknown := sorted(set(sys.argv[1:]) - set(QUICK)):
        raise SystemExit(f"bench.quick: no quick benchmark named {', '.join(unknown)} (of {', '.join(QUICK)})")
    main(sys.argv[1:] or list(QUICK))
