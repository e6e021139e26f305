"""The synthetic suite's stdin/stdout kind: its splits, its cases checked against answers computed
here, and mixing it with the function kind leaves the function tasks as they were."""
import contextlib
import hashlib
import io
import json
import sys

import pytest

from coderloo.config import load_config
from coderloo.tasksets.loading import load_tasks
from coderloo.tasksets.synthetic import STDIO_FAMILIES, corpus_for_tokenizer, synthetic_suite

SUITE = synthetic_suite(kinds=["stdio"])
TASKS = SUITE["train"] + SUITE["heldout"]

# What each family prints (its lines), from its input and its constants, written here apart from
# the suite's program templates; and how its input is read from the case's stdin.
ANSWERS = {
    "add": lambda x, k: [x + k],
    "sub": lambda x, k: [x - k],
    "mul": lambda x, k: [x * k],
    "repeat": lambda s, k: [s * k],
    "prefix": lambda s, k: [s[:k]],
    "drop": lambda s, k: [s[k:]],
    "affine": lambda x, a, b: [a * x + b],
    "pair_add": lambda xy, k: [xy[0] + xy[1] + k],
    "pair_mul": lambda xy, k: [xy[0] * xy[1] + k],
    "lines": lambda s, k: [s] * k,
    "sum_plus": lambda xs, k: [sum(xs) + k],
    "max_plus": lambda xs, k: [max(xs) + k],
    "count_gt": lambda xs, k: [sum(1 for v in xs if v > k)],
    "sum_gt": lambda xs, k: [sum(v for v in xs if v > k)],
    "filter_gt": lambda xs, k: [v for v in xs if v > k],
}


def parse_input(family: str, stdin: str):
    lines = stdin.split("\n")
    assert lines[-1] == "", f"{stdin!r} does not end its last line"
    if family in ("add", "sub", "mul", "affine"):
        return int(lines[0])
    if family in ("repeat", "prefix", "drop", "lines"):
        return lines[0]
    if family.startswith("pair_"):
        return tuple(int(v) for v in lines[0].split())
    xs = [int(v) for v in lines[1].split()]
    assert int(lines[0]) == len(xs), f"{stdin!r}: the count is not the number of items"
    return xs


def constants(task) -> list[int]:
    return [int(v) for v in task.id.rsplit("/", 1)[1].split("_")]


def printed(program: str, stdin: str) -> str:
    """The program's stdout, run here with the real input() and print() on a swapped sys.stdin
    (the suite computes its expected outputs with its own bindings of the two)."""
    out, saved = io.StringIO(), sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out):
            exec(program, {})  # our own generated code
    finally:
        sys.stdin = saved
    return out.getvalue()


def passes(program: str, task) -> bool:
    """Every case's output equal to the expected one token by token (OutputMatch's default mode;
    the outputs here are integers and words, so its float tolerance does not come in)."""
    for case in task.tests:
        try:
            out = printed(program, case.stdin)
        except Exception:
            return False
        if out.split() != case.stdout.split():
            return False
    return True


def test_function_suite_and_its_tokenizer_corpus_are_unchanged():
    """Pinned: the default run's numbers (and its tokenizer) depend on them: every test decides, the
    two shown inputs first, then the held ones (the tests the suite had before it had shown ones)."""
    suite = synthetic_suite()
    assert suite == synthetic_suite(kinds=["function"])
    digest = hashlib.sha256(json.dumps(
        {split: [[t.id, t.difficulty, t.prompt, t.reference, t.tests, t.public_tests] for t in tasks]
         for split, tasks in suite.items()}
    ).encode()).hexdigest()
    assert digest == "336f7f328176726e80f97e7a1fdfc087df7d76450702f08354464a0c3d62819d"
    corpus = hashlib.sha256("".join(corpus_for_tokenizer()).encode()).hexdigest()
    assert corpus == "64a85743cf5cb27622f7b706ae93d500accc85e29cb056a98f16a90e0e3b6ee3"
    mixed = synthetic_suite(kinds=["function", "stdio"])
    for split in ("train", "heldout"):
        assert mixed[split] == suite[split] + SUITE[split]  # function tasks first, as they were
    stdio_corpus = list(corpus_for_tokenizer(["function", "stdio"]))
    assert all(t.reference in stdio_corpus for t in SUITE["train"])
    assert not any(t.reference in stdio_corpus for t in SUITE["heldout"])


def test_stdio_splits_are_disjoint_deterministic_and_graded():
    train, heldout = SUITE["train"], SUITE["heldout"]
    assert synthetic_suite(kinds=["stdio"]) == SUITE
    ids = [t.id for t in TASKS]
    assert len(ids) == len(set(ids))
    assert not {t.prompt for t in train} & {t.prompt for t in heldout}  # (family, constants) pairs
    families = {f"synthetic-stdio/{family.name}" for family in STDIO_FAMILIES}
    assert {t.family for t in heldout} == {t.family for t in train} == families
    assert {t.difficulty for t in heldout} == {t.difficulty for t in train} == {1, 2, 3}
    assert 0.1 < len(heldout) / len(TASKS) < 0.3
    for family in STDIO_FAMILIES:
        assert {t.difficulty for t in TASKS if t.family.endswith("/" + family.name)} == {family.difficulty}
    assert synthetic_suite(max_difficulty=1, kinds=["stdio"])["train"] == [t for t in train if t.difficulty == 1]
    with pytest.raises(ValueError, match=r"unknown synthetic task kinds \['stdin'\]"):
        synthetic_suite(kinds=["stdin"])


def test_stdio_tasks_are_programs_after_a_docstring_with_their_constants():
    for task in TASKS:
        assert (task.test_kind, task.source, task.entry_point, task.prompt_is_code) == ("stdio", "synthetic", None, True)
        assert task.prompt.startswith('"""Read ') and task.prompt.endswith('."""\n')
        assert task.reference.startswith(task.prompt) and "input()" in task.reference and "print(" in task.reference
        for value in constants(task):
            assert f" {value}" in task.prompt  # the model copies them from the statement
        assert 5 <= len(task.held) <= 8 and 1 <= task.public_tests <= 2
        assert not {case.stdin for case in task.shown} & {case.stdin for case in task.held}  # new inputs


@pytest.mark.parametrize("task", TASKS, ids=[t.id for t in TASKS])
def test_reference_prints_the_answer_computed_here(task):
    family = task.id.split("/")[1]
    for case in task.tests:
        lines = ANSWERS[family](parse_input(family, case.stdin), *constants(task))
        expected = "".join(f"{line}\n" for line in lines)
        assert case.stdout == expected, case.stdin
        assert printed(task.reference, case.stdin) == expected, case.stdin


def test_cases_tell_family_members_and_wrong_programs_apart():
    by_family: dict[str, list] = {}
    for task in TASKS:
        by_family.setdefault(task.family, []).append(task)
    # Each member's reference fails some case of every other member of its family: a program of
    # the right shape with the wrong constant does not pass.
    for members in by_family.values():
        for a in members:
            for b in members:
                assert a is b or not passes(a.reference, b), f"{a.id} passes every case of {b.id}"
    # Neither a program that prints nothing nor one that prints its input back passes a task.
    for task in TASKS:
        assert not passes(task.prompt + "pass\n", task), task.id
        assert not passes(task.prompt + "print(input())\n", task), task.id
    # Cases are mostly non-empty, so printing nothing earns little partial credit either.
    empty = [case.stdout.strip() == "" for task in TASKS for case in task.tests]
    assert sum(empty) / len(empty) < 0.1


def test_config_mixes_the_kinds_in_train_and_evaluation():
    default = load_config("configs/default.yaml")
    assert default.tasks.synthetic_kinds == ["function"]
    train, evaluation = load_tasks(default.tasks)
    assert {t.test_kind for t in train + evaluation} == {"assert"}
    mixed = load_config("configs/mixed.yaml")
    train, evaluation = load_tasks(mixed.tasks)
    assert {t.test_kind for t in train} == {t.test_kind for t in evaluation} == {"assert", "stdio"}
    assert "\nprint(" not in mixed.rollout.stop  # a stdin program prints on a line of its own
    assert mixed.model.path != default.model.path  # its tokenizer is trained on the stdin programs too


def test_train_table_shows_each_kinds_pass_rate_when_there_are_several():
    from coderloo.cli import stages_table

    after_sft = {"pass@1": 0.2, "by_kind": {"assert": 0.25, "stdio": 0.125}, "by_family": {"synthetic/add": 1.0}}
    table = stages_table({"after SFT": after_sft, "final": {**after_sft, "by_kind": {"assert": 0.5, "stdio": 0.375}}})
    assert table.splitlines()[0].split("|")[2:-1] == [" pass@1 ", " pass@1 assert ", " pass@1 stdio "]
    assert "| 20.0%  | 25.0%         | 12.5%        |" in table and "| 50.0%         | 37.5%        |" in table
    assert "assert" not in stages_table({"final": {"pass@1": 0.2, "by_kind": {"assert": 0.2}}})  # one kind: as before
