"""`coderloo eval` on every benchmark and competitive set with the tiny model: it runs end to end
(vLLM, the reward service, the sandbox, EvalPlus's checks in the tester) and reports numbers in [0, 1]."""
from __future__ import annotations

import json
from pathlib import Path

from coderloo.cli import main, results_table
from coderloo.models import TinyModelSpec, build_tiny_model
from coderloo.tasksets.synthetic import corpus_for_tokenizer

SETS = ["mbpp", "mbpp-sanitized", "humaneval", "humaneval+", "mbpp+"]
COMPETITIVE = ["apps", "codecontests", "taco", "livecodebench"]


def competitive_data(data: Path) -> None:
    """APPS, CodeContests, TACO and LiveCodeBench from their fixtures (tests/fixtures/competitive),
    laid out in `data` as eval.data_dir expects the published files (Parquet for CodeContests and
    TACO, a directory of releases for LiveCodeBench)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.test_tasksets_competitive import FIXTURE_DIR

    def rows(name):
        return [json.loads(line) for line in (FIXTURE_DIR / name).read_text().splitlines() if line.strip()]

    (data / "livecodebench").mkdir(parents=True)
    (data / "apps-test.jsonl").write_text((FIXTURE_DIR / "apps-test.jsonl").read_text())
    pq.write_table(pa.Table.from_pylist(rows("codecontests-test.jsonl")), data / "codecontests-test.parquet")
    pq.write_table(pa.Table.from_pylist(rows("taco-test.jsonl")), data / "taco-test.parquet")
    (data / "livecodebench" / "test.jsonl").write_text((FIXTURE_DIR / "livecodebench-test.jsonl").read_text())


def test_eval_on_every_benchmark_and_competitive_set(ray_cluster, shared_data, tmp_path, capsys):
    """One `coderloo eval` over every set, 2 tasks each: the benchmark sets from ../shared/data and
    the competitive sets from their fixtures, with pass@k by the sets' own difficulty names and, for
    dated problems, by month (the breakdowns and the date filter by hand: test_tasksets_competitive.py)."""
    # The default tiny model takes 512 positions; the 3-shot MBPP and HumanEval prompts are longer
    # in its small vocabulary, so this one takes 8192.
    model = build_tiny_model(tmp_path / "tiny-long", corpus_for_tokenizer(), TinyModelSpec(max_position_embeddings=8192))
    data = tmp_path / "data"
    competitive_data(data)
    for path in shared_data.iterdir():
        (data / path.name).symlink_to(path)
    out = tmp_path / "report.json"
    sets = [*SETS, *COMPETITIVE]
    args = [
        "eval", "--model", str(model), "--sets", ",".join(sets), "--data-dir", str(data), "--out", str(out),
        "tasks.max_eval_tasks=2", "eval.samples_per_task=2", "eval.k=[1,2]", "eval.max_new_tokens=16",
    ]
    assert main(args) == 0
    report = json.loads(out.read_text())
    assert report["model"] == str(model) and list(report["sets"]) == sets
    for name, result in report["sets"].items():
        assert result["tasks"] == 2, name
        assert {"pass@1", "pass@2", "greedy_pass@1"} <= set(result), name
        assert 0.0 <= result["pass@1"] <= result["pass@2"] <= 1.0, name
    for name in SETS:
        result = report["sets"][name]
        assert result["pass@1"] == result["pass@2"] == result["greedy_pass@1"] == 0.0  # an untrained model passes nothing
    levels = {"apps": {"introductory", "interview", "competition"}, "livecodebench": {"easy", "medium", "hard"}}
    for name, names in levels.items():
        assert report["sets"][name]["by_level"] and set(report["sets"][name]["by_level"]) <= names, name
    assert set(report["sets"]["livecodebench"]["by_month"]) <= {"2023-11", "2024-05", "2024-08"}
    assert "by_month" not in report["sets"]["apps"]  # APPS has no dates
    shown = capsys.readouterr()
    assert results_table(report["sets"]) in shown.out
    assert "| humaneval+ " in shown.out
    # the actors' lines went next to the report, not to the terminal
    assert f"logs in {tmp_path / 'report.logs'}" in shown.err
    assert "(RolloutWorker pid=" in (tmp_path / "report.logs" / "actors.log").read_text()
    assert "pid=" not in shown.out + shown.err
    # --after with nothing left: said before anything starts
    assert main(["eval", "--sets", "apps", "--data-dir", str(data), "--after", "2024-01-01"]) == 2  # no dates
    assert "apps" in capsys.readouterr().err


def test_eval_rejects_an_unknown_set(capsys):
    assert main(["eval", "--sets", "mbpp,apps2"]) == 2
    assert "unknown evaluation set 'apps2'" in capsys.readouterr().err


def test_eval_refuses_refinement_that_the_critic_chooses(capsys):
    assert main(["eval", "env.name=refine", "env.per_round=2", "env.choose=critic", "critic.enabled=true"]) == 2
    said = capsys.readouterr().err
    assert "env.choose critic: the critic that chooses which failed attempts are refined trains in a training run" in said


def test_results_table():
    table = results_table({"mbpp": {"tasks": 500, "pass@1": 0.5, "greedy_pass@1": 0.25},
                           "mbpp+": {"tasks": 378, "greedy_pass@1": 0.125}})
    assert table.splitlines() == [
        "| set   | tasks | pass@1 | greedy pass@1 |",
        "|-------|-------|--------|---------------|",
        "| mbpp  | 500   | 50.0%  | 25.0%         |",
        "| mbpp+ | 378   | -      | 12.5%         |",
    ]
