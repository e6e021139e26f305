"""bench/run.py's results.json and charts, from a made-up benchmark (no benchmark runs)."""
from __future__ import annotations

import json
import sys
import types

import pytest

from bench import run
from bench.plots import comparison, plot, ratios


def test_ratios_are_ours_over_each_alternative():
    c = comparison("t", "programs/s", "ours", {"ours": 200, "docker": 100, "harness": 50})
    assert ratios(c) == {"docker": 2.0, "harness": 4.0}
    with pytest.raises(ValueError):
        comparison("t", "ms", "missing", {"push": 1.0})


def test_plot_writes_a_png(tmp_path):
    c = comparison("weight sync", "ms", "push", {"push": 60.0, "memcpy": 0.05}, lower_is_better=True)
    path = plot(c, tmp_path / "plots" / "weight_sync-0.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_writes_the_report_the_json_and_a_chart_per_comparison(tmp_path, monkeypatch):
    fake = types.ModuleType("fake_bench")

    def main():
        print("fake: ours 3/s, theirs 1/s")
        return [comparison("first", "items/s", "ours", {"ours": 3, "theirs": 1}),
                comparison("second", "ms", "ours", {"ours": 2, "theirs": 4}, lower_is_better=True)]

    fake.main = main
    monkeypatch.setitem(sys.modules, "fake_bench", fake)
    monkeypatch.setattr(run, "BENCHMARKS", {"fake": "fake_bench"})
    monkeypatch.setattr(run, "cpu", lambda: "2 x Test CPU")
    monkeypatch.setattr(run, "commit", lambda: "abc1234")
    run.main([], tmp_path)
    numbers = json.loads((tmp_path / "results.json").read_text())
    # each benchmark says what it was measured on: figures differ from one CPU model to another
    assert numbers["benchmarks"]["fake"]["measured_on"].startswith("2 x Test CPU, commit abc1234, 20")
    assert [c["values"] for c in numbers["benchmarks"]["fake"]["comparisons"]] == [
        {"ours": 3.0, "theirs": 1.0}, {"ours": 2.0, "theirs": 4.0}]
    report = (tmp_path / "results.md").read_text()
    assert "fake: ours 3/s, theirs 1/s" in report
    assert f"s; {numbers['benchmarks']['fake']['measured_on']})" in report.split("## fake", 1)[1].splitlines()[2]
    assert "![first](plots/fake-0.png)" in report and "![second](plots/fake-1.png)" in report
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["fake-0.png", "fake-1.png"]


def test_a_partial_run_replaces_only_its_own_sections(tmp_path, monkeypatch):
    fake = types.ModuleType("fake_bench")
    fake.main = lambda: print("new figures") or []
    monkeypatch.setitem(sys.modules, "fake_bench", fake)
    monkeypatch.setattr(run, "BENCHMARKS", {"fake": "fake_bench", "other": "fake_bench"})
    (tmp_path / "results.md").write_text("# Benchmark results\n\nold machine\n\n## fake\n\nold figures\n\n## other\n\nkept\n\n"
                                         "## soak\n\nsoaked\n")
    (tmp_path / "results.json").write_text(json.dumps({"machine": [], "benchmarks": {"other": {"seconds": 1}}}))
    run.main(["fake"], tmp_path)
    report = (tmp_path / "results.md").read_text()
    assert "old figures" not in report and "old machine" not in report and "new figures" in report
    assert report.index("## fake") < report.index("## other\n\nkept") < report.index("## soak\n\nsoaked")
    assert set(json.loads((tmp_path / "results.json").read_text())["benchmarks"]) == {"fake", "other"}


def test_repeated_runs_take_turns_and_give_medians():
    from bench.plots import alternating, medians

    calls = []

    def run(name):
        def one(i):
            calls.append((name, i))
            return {"rate": {"a": [3.0, 1.0, 2.0], "b": [5.0, 9.0, 7.0]}[name][i], "runs": i}
        return one

    runs = alternating(3, {"a": run("a"), "b": run("b")})
    assert calls == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    assert medians(runs) == {"a": {"rate": 2.0, "runs": 1}, "b": {"rate": 7.0, "runs": 1}}


def test_bench_quick_prints_each_figure_next_to_the_committed_one_found_by_its_key(tmp_path, monkeypatch, capsys):
    from bench import quick

    fake = types.ModuleType("fake_bench")
    fake.main = lambda: [comparison("rate, 2 runs", "items/s", "ours", {"ours": 6, "theirs": 2}, key="rate"),
                         comparison("new figure", "s", "ours", {"ours": 1, "theirs": 2}, lower_is_better=True)]
    monkeypatch.setitem(sys.modules, "fake_bench", fake)
    monkeypatch.setattr(quick, "BENCHMARKS", {"fake": "fake_bench"})
    monkeypatch.setattr(quick, "QUICK", {"fake": {"FAKE_BENCH_RUNS": "2"}})
    monkeypatch.setattr(quick, "RESULTS_DIR", tmp_path)
    monkeypatch.delenv("FAKE_BENCH_RUNS", raising=False)
    committed = {"title": "rate, 5 runs", "unit": "items/s", "ours": "ours", "values": {"ours": 4.0, "theirs": 2.0}, "key": "rate"}
    monkeypatch.setattr(quick, "cpu", lambda: "2 x Test CPU")

    def record(measured_on: str) -> None:
        (tmp_path / "results.json").write_text(json.dumps({"machine": ["- commit abc1234, a date"], "benchmarks": {
            "fake": {"measured_on": measured_on, "comparisons": [committed]},
            "old": {"comparisons": [{"title": "untouched", "values": {}}]}}}))

    record("2 x Test CPU, commit abc1234, 2026-12-01")
    quick.main(["fake"])
    assert "committed on 2 x Test CPU, commit abc1234, 2026-12-01):" in capsys.readouterr().out
    record("2 x Other CPU, commit abc1234, 2026-12-01")
    quick.main(["fake"])
    out = capsys.readouterr().out
    assert "committed on 2 x Other CPU, commit abc1234, 2026-12-01 (another CPU than now's" in out
    assert quick.os.environ["FAKE_BENCH_RUNS"] == "2"
    assert "(commit abc1234, a date)" in out
    assert "6.000 |      4.000 | x 1.50" in out  # ours now, committed, now / committed
    assert "ours / theirs: 3.00x now, 2.00x committed" in out
    assert "new figure: no committed figure" in out
