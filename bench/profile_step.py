"""Where a synchronous step's time goes: py-spy flame graphs of the driver and of each actor, over
steady-state RL steps of the default config.

    python -m bench.profile_step [--label before] [--steps 20] [--from-step 6] [--seconds 20] [overrides ...]

Runs `coderloo train` on configs/default.yaml with the given overrides (SFT warm-up, then `--steps`
RL steps; no mid-run evaluation or checkpoint) in a subprocess. Once step `--from-step` is logged (the first steps carry
one-off warm-up), py-spy samples the driver and every actor of the run at once for `--seconds`
(`--nonblocking`: it reads their stacks without stopping them, so the steps keep their pace; idle
frames are left out, so a flame is CPU time). The graphs go to bench/plots/flame-LABEL-ROLE.svg
(ROLE: driver, RolloutWorker, Learner, the reward replicas, SandboxExecutor, ...), one per process,
and the steps' timeline in the sampled window is printed. The programs the sandbox runs are
forked processes of their own and are not sampled.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLOTS = Path(__file__).resolve().parent / "plots"
PARTS = ("time_generate_s", "time_score_tail_s", "time_learn_s", "time_sync_s", "time_step_s")


def rl_records(metrics: Path) -> list[dict]:
    if not metrics.exists():
        return []
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [r for r in records if r.get("phase") == "rl"]


def actor_processes(exclude: set[int]) -> dict[int, str]:
    """pid: role, of the Ray processes that run an actor (their title is ray::NAME[.method])."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            title = (entry / "cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            continue
        if title.startswith("ray::") and not title.startswith(("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")):
            found[int(entry.name)] = re.sub(r"[^A-Za-z0-9_.-]+", "_", title[5:].split(".")[0].split(" ")[0])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="now", help="the graphs' file-name label (before, after)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--from-step", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--rate", type=int, default=50, help="samples per second of each process")
    parser.add_argument("overrides", nargs="*", help="config overrides, as for coderloo train")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    out = Path(tempfile.mkdtemp(prefix="profile-step-")) / "run"
    out.mkdir()
    train = subprocess.Popen(
        [str(Path(sys.executable).with_name("coderloo")), "train", "--config", "configs/default.yaml", f"train.output_dir={out}",
         f"train.steps={args.steps}", "train.eval_every=0", "train.checkpoint_every=0", *args.overrides],
        stdout=(out / "train.log").open("w"), stderr=subprocess.STDOUT)
    metrics = out / "metrics.jsonl"
    try:
        while len(rl_records(metrics)) < args.from_step:
            if train.poll() is not None:
                raise SystemExit(f"coderloo train ended (exit {train.returncode}) before step {args.from_step}: {out / 'train.log'}")
            time.sleep(0.2)
        logged = len(rl_records(metrics))
        processes = {train.pid: "driver", **actor_processes({os.getpid(), train.pid})}
        PLOTS.mkdir(exist_ok=True)
        spies, seen = [], {}
        for pid, role in processes.items():
            seen[role] = seen.get(role, 0) + 1
            name = f"flame-{args.label}-{role}" + (f"-{seen[role]}" if seen[role] > 1 else "") + ".svg"
            spies.append((name, subprocess.Popen(
                [py_spy, "record", "--pid", str(pid), "--duration", str(args.seconds), "--rate", str(args.rate),
                 "--nonblocking", "--format", "flamegraph", "--output", str(PLOTS / name)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
        for name, spy in spies:
            _, err = spy.communicate(timeout=args.seconds + 60)
            status = "written" if spy.returncode == 0 else f"py-spy failed: {err.decode().strip().splitlines()[:1]}"
            print(f"  bench/plots/{name}: {status}")
        window = rl_records(metrics)[logged:]  # the steps that ended while py-spy sampled
    finally:
        train.terminate()
        train.wait(timeout=120)
    if not window:
        raise SystemExit("no step ended in the sampled window: sample longer (--seconds)")
    print(f"steps {window[0]['step']}-{window[-1]['step']} ended in the sampled window; medians:")
    for key in PARTS:
        print(f"  {key:20s} {statistics.median(r[key] for r in window):.3f} s")


if __name__ == "__main__":
    main()
