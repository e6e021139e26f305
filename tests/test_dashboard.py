"""Ray's dashboard during a run, as its user sees it: `coderloo train` started as a user starts it
(its own local Ray), the dashboard's address on the run's first line, and in headless Chromium the
Actors view listing every rollout worker, learner rank, reward replica and sandbox executor of the
run by name, and the Serve view showing the reward application. The run's resource samples carry
the dashboard's own series."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from browser import page_text, run_chromium
from coderloo.metrics import read_metrics
from runs import SMALL

REPO = Path(__file__).resolve().parent.parent
KINDS = {"rollout workers": "coderloo-rollout-", "learner ranks": "coderloo-learner-",
         "sandbox executors": "coderloo-sandbox-", "reward replicas": "SERVE_REPLICA::coderloo-rewards#"}
FIRST_LINE = re.compile(r"run run: Ray dashboard at (http://127\.0\.0\.1:\d+); Ray metrics \(Prometheus\) at ")


def until(what: str, check, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(1)
    return found


def alive_names(url: str) -> list[str]:
    """The names of the live actors, from the dashboard's own API."""
    with urllib.request.urlopen(f"{url}/api/v0/actors?limit=1000", timeout=10) as answer:
        actors = json.loads(answer.read())["data"]["result"]["result"]
    return [a.get("name") or "" for a in actors if a["state"] == "ALIVE"]


@pytest.mark.slow
def test_a_run_shows_its_actors_in_the_dashboard(tiny_model, tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "coderloo.cli", "train", "--config", "configs/default.yaml", f"model.path={tiny_model}",
               f"train.output_dir={out}", *SMALL, "train.steps=50", "train.resources_every=1", "reward.pool.max_executors=2"]
    stdout, stderr = (tmp_path / "stdout").open("w+"), (tmp_path / "stderr").open("w+")
    process = subprocess.Popen(command, cwd=REPO, stdout=stdout, stderr=stderr, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def said() -> str:
        assert process.poll() is None, f"the run ended: {Path(stderr.name).read_text()[-3000:]}"
        return Path(stdout.name).read_text()

    try:
        first = until("the run's first line", lambda: said().split("\n")[0] if "\n" in said() else None)
        address = FIRST_LINE.match(first)
        assert address, first
        url = address[1]
        names = until("the run's actors", lambda: (n := alive_names(url)) and all(
            any(name.startswith(prefix) for name in n) for prefix in KINDS.values()) and n)
        views = {view: page_text(run_chromium(tmp_path, "--virtual-time-budget=20000", "--dump-dom", f"{url}/#/{view}"))
                 for view in ("actors", "serve")}
        for kind, prefix in KINDS.items():
            ours = [n for n in names if n.startswith(prefix)]
            assert all(n in views["actors"] for n in ours), (kind, ours, views["actors"][:3000])
        assert "coderloo-rewards" in views["serve"] and "RewardService" in views["serve"], views["serve"][:3000]
        sample = until("a resources record", lambda: next(
            (r for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "resources"), None)
            if (out / "metrics.jsonl").exists() else None)
        assert sample["rss_mb/dashboard"] > 50, sorted(sample)  # its own series, not the driver's
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)  # as Ctrl-C: the run stops its actors and its Ray
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
