"""Run directories are never clobbered: a second run is refused before it writes anything, a live
run's lock names it, --overwrite replaces a finished run, --resume is the way to continue one,
and `coderloo eval --out` does not replace a report unasked."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coderloo.cli import main
from coderloo.rundir import LOCK_FILE, RunDirError, claim, claim_report

ROOT = Path(__file__).resolve().parent.parent
HOLD_LOCK = """
import sys, time
from pathlib import Path
from coderloo.rundir import claim
lock = claim(Path(sys.argv[1]), resume=False, overwrite=False)
(Path(sys.argv[1]) / "metrics.jsonl").write_text('{"phase": "rl", "step": 1}\\n')
(Path(sys.argv[1]) / "config.yaml").write_text("first run\\n")
print("locked", flush=True)
time.sleep(600)
"""


@pytest.fixture
def live_run(tmp_path):
    """Another process holding a run directory, as a training run does while it lives."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(out)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    yield out, proc.pid
    proc.kill()
    proc.wait()


def written(out: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in out.iterdir() if p.name != LOCK_FILE}


def test_a_second_run_with_a_bad_task_file_leaves_the_live_run_alone(live_run, tmp_path, tiny_model, capsys):
    out, _ = live_run
    before = written(out)
    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"id": "t/1", "prompt": "def f():\\n"}\n{not json\n')
    args = ["train", f"train.output_dir={out}", f"model.path={tiny_model}", "tasks.train_set=jsonl", f"tasks.train_path={bad}"]
    assert main(args) == 2
    assert f"{bad}:1" in capsys.readouterr().err  # the file and line, before anything was written
    assert written(out) == before


@pytest.mark.parametrize("flag", [[], ["--overwrite"], ["--resume"]])
def test_a_live_runs_directory_is_refused_by_name(live_run, tiny_model, capsys, flag):
    out, pid = live_run
    before = written(out)
    assert main(["train", *flag, f"train.output_dir={out}", f"model.path={tiny_model}"]) == 2
    err = capsys.readouterr().err
    assert f"{out} is in use by a live run (pid {pid} on " in err and ", started " in err
    assert written(out) == before


def test_a_finished_run_is_taken_only_to_resume_or_replace_it(tmp_path):
    out = tmp_path / "run"
    (out / "checkpoints" / "step_2").mkdir(parents=True)
    (out / "metrics.jsonl").write_text("{}\n")
    (out / "notes.txt").write_text("mine\n")
    with pytest.raises(RunDirError, match="holds a run already: --resume continues it, --overwrite replaces it"):
        claim(out, resume=False, overwrite=False)
    with pytest.raises(RunDirError, match="give one of them"):
        claim(out, resume=True, overwrite=True)
    claim(out, resume=True, overwrite=False).release()
    assert (out / "metrics.jsonl").exists()  # resuming keeps the run
    lock = claim(out, resume=False, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == sorted([LOCK_FILE, "notes.txt"])  # the run's files only are gone
    holder = json.loads((out / LOCK_FILE).read_text())
    assert holder["pid"] > 0 and time.strptime(holder["started"][:19], "%Y-%m-%d %H:%M:%S")
    lock.release()
    claim(out, resume=False, overwrite=False).release()  # released: a new run may take it (it is empty now)


def test_eval_does_not_replace_a_report_unasked(tmp_path, capsys):
    report = tmp_path / "report.json"
    report.write_text('{"kept": true}\n')
    assert main(["eval", "--out", str(report), "tasks.max_eval_tasks=1"]) == 2
    assert f"{report} exists: --overwrite replaces it" in capsys.readouterr().err
    assert report.read_text() == '{"kept": true}\n'


HOLD_REPORT = """
import sys, time
from pathlib import Path
from coderloo.rundir import claim_report
lock = claim_report(Path(sys.argv[1]), overwrite=False)
print("locked", flush=True)
time.sleep(600)
"""


def test_a_report_a_live_eval_is_writing_is_refused_by_name(tmp_path, capsys):
    report = tmp_path / "report.json"
    proc = subprocess.Popen([sys.executable, "-c", HOLD_REPORT, str(report)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        assert main(["eval", "--overwrite", "--out", str(report), "tasks.max_eval_tasks=1"]) == 2
        err = capsys.readouterr().err
        assert f"{report} is in use by a live run (pid {proc.pid} on " in err and "choose another --out" in err
    finally:
        proc.kill()
        proc.wait()
    assert not report.exists()
    # the lock file is hidden and goes with its holder's release; a lock taken after works
    lock = claim_report(report, overwrite=False)
    assert (tmp_path / ".report.json.lock").exists()
    lock.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("override, named", [
    ("rollout.resources={gpu_node: 1}", "rollout.resources asks for `gpu_node`, which no node type offers"),
    ("reward.replica_cpus=512", "reward.autoscaling.min_replicas x reward.replica_cpus"),
])
def test_actors_that_do_not_fit_the_local_cluster_are_refused_before_anything_is_written(tmp_path, tiny_model, capsys,
                                                                                          override, named):
    out = tmp_path / "run"
    assert main(["train", f"train.output_dir={out}", f"model.path={tiny_model}", override]) == 2
    err = capsys.readouterr().err
    assert "do not fit the local Ray cluster" in err and named in err, err
    assert not out.exists()
