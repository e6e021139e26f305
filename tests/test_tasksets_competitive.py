"""Competitive-programming loaders (coderloo/tasksets/competitive.py) on hand-written fixtures in
the published schemas (tests/fixtures/competitive/README.md): tasks, kinds of tests, limits,
levels and dates; malformed records named by file and line; LiveCodeBench's compressed cases
and the unpickler that refuses globals; the generic mapping on JSONL and Parquet; the date
filter and the breakdowns by level and month.

For the sandbox checks: FIXTURES lists (fixture file, loader name), load_fixture loads one (the
generic one with GENERIC_COLUMNS), and PROGRAMS maps each task id to a right and a wrong program."""
from __future__ import annotations

import base64
import datetime
import json
import os
import pickle
import shutil
import zlib
from pathlib import Path

import numpy as np
import pyarrow
import pyarrow.parquet
import pytest

from coderloo.config import ConfigError, TasksConfig
from coderloo.evaluation import pass_rate_by
from coderloo.tasksets.benchmarks import load_task_set
from coderloo.tasksets.competitive import (
    CALL_INSTRUCTION,
    STDIO_INSTRUCTION,
    ColumnMapping,
    decompress_test_cases,
    load_codecontests,
    load_generic,
    split_of,
)
from coderloo.tasksets.evalsets import EVAL_SETS, load_eval_set, published_after
from coderloo.tasksets.loading import load_tasks
from reward_service.tasks import Task, TaskFileError
from sandbox_pool.results import CallTest, IOTest

FIXTURE_DIR = Path(__file__).parent / "fixtures" / "competitive"
FIXTURES = [
    (FIXTURE_DIR / "apps-test.jsonl", "apps"),
    (FIXTURE_DIR / "codecontests-test.jsonl", "codecontests"),
    (FIXTURE_DIR / "taco-test.jsonl", "taco"),
    (FIXTURE_DIR / "livecodebench-test.jsonl", "livecodebench"),
    (FIXTURE_DIR / "generic-train.jsonl", "generic"),
    (FIXTURE_DIR / "deepcoder", "deepcoder"),
    (FIXTURE_DIR / "code-r1-test.jsonl", "code-r1"),
]
GENERIC_COLUMNS = ColumnMapping(id="uid", prompt="statement", input_output="tests", solutions="solution",
                                difficulty="level", source="mine")
PROGRAMS: dict[str, dict[str, str]] = json.loads((FIXTURE_DIR / "programs.json").read_text())


def load_fixture(path: Path, loader: str) -> list[Task]:
    return load_task_set(loader, path, GENERIC_COLUMNS if loader == "generic" else None)


def by_id(tasks: list[Task]) -> dict[str, Task]:
    return {task.id: task for task in tasks}


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def compress(value) -> str:
    """LiveCodeBench's compressed form of test cases: base64 of zlib of a pickle."""
    return base64.b64encode(zlib.compress(pickle.dumps(value))).decode()


@pytest.mark.parametrize("path, loader", FIXTURES, ids=[loader for _, loader in FIXTURES])
def test_every_fixture_task_has_a_right_and_a_wrong_program(path, loader):
    tasks = load_fixture(path, loader)
    assert set(by_id(tasks)) <= set(PROGRAMS)
    for task in tasks:
        assert task.prompt_is_code is False and task.language == "python"
        assert task.reference in ("", PROGRAMS[task.id]["right"])  # the record's Python solution, if it has one
        assert PROGRAMS[task.id]["right"] != PROGRAMS[task.id]["wrong"]
    assert set(PROGRAMS) == {task.id for path, loader in FIXTURES for task in load_fixture(path, loader)}


def test_apps():
    tasks = load_fixture(FIXTURE_DIR / "apps-test.jsonl", "apps")
    assert list(by_id(tasks)) == ["apps/test/4000", "apps/test/4001", "apps/test/4002", "apps/test/4003"]  # 4004 has no tests
    plain, lines, function, method = tasks
    assert [t.test_kind for t in tasks] == ["stdio", "stdio", "call", "call"]
    assert [t.entry_point for t in tasks] == [None, None, "digital_root", "maxSubArray"]
    assert [(t.level, t.difficulty) for t in tasks] == [("introductory", 1), ("interview", 3), ("introductory", 1),
                                                         ("competition", 5)]
    assert all(t.split == "test" and t.public_tests == 0 and t.source == "apps" for t in tasks)
    assert all(t.time_limit_s is None and t.memory_mb is None and t.date is None for t in tasks)
    assert plain.tests[1] == IOTest(stdin="-5 11\n", stdout="6\n")
    assert lines.tests == [IOTest(stdin="3\n4 -2 9", stdout="9 -2"), IOTest(stdin="1\n7", stdout="7 7")]  # lists of lines joined
    # APPS passes a call when the result is the expected value or that list's first item
    assert function.tests[0] == CallTest(args=[16], accepted=[[7], 7])
    assert method.tests[0] == CallTest(args=[[-2, 1, -3, 4, -1, 2, 1, -5, 4]], accepted=[6])
    assert plain.reference == json.loads(records(FIXTURE_DIR / "apps-test.jsonl")[0]["solutions"])[0]
    assert plain.prompt.startswith("You are given two integers") and plain.prompt.endswith(STDIO_INSTRUCTION + "\n")
    assert CALL_INSTRUCTION.format(name="maxSubArray") in method.prompt
    assert method.prompt.endswith("```python\nclass Solution:\n    def maxSubArray(self, nums: List[int]) -> int:\n```\n")


def test_codecontests():
    tasks = load_fixture(FIXTURE_DIR / "codecontests-test.jsonl", "codecontests")
    # the problem that reads input.txt is left out
    assert list(by_id(tasks)) == ["codecontests/1600_A. Even Sum", "codecontests/REVWORDS",
                                  "codecontests/p00001 Sum of a Range"]
    even, words, aizu = tasks
    assert all(t.test_kind == "stdio" and t.entry_point is None and t.split == "test" for t in tasks)
    # public cases first, then private, then generated
    assert [t.stdin for t in even.tests] == ["4\n1 2 3 4\n", "3\n1 3 5\n", "1\n-2\n", "5\n2 2 2 2 2\n"]
    assert [t.public_tests for t in tasks] == [1, 1, 1]
    assert [(t.level, t.difficulty) for t in tasks] == [("A", 1), ("MEDIUM", 2), ("UNKNOWN_DIFFICULTY", 3)]
    assert [t.time_limit_s for t in tasks] == [2.0, 1.5, None]
    assert [t.memory_mb for t in tasks] == [245, None, 128]  # 256000000 bytes, 0 (none), 2**27
    # the first PYTHON3 solution (language 3); REVWORDS has C++ and Python 2 ones only
    assert even.reference == PROGRAMS[even.id]["right"] and words.reference == "" and aizu.reference != ""
    assert PROGRAMS[words.id]["wrong"] == records(FIXTURE_DIR / "codecontests-test.jsonl")[1]["incorrect_solutions"]["solution"][0]
    assert even.prompt.endswith("\n\n" + STDIO_INSTRUCTION + "\n")


def test_codecontests_parquet_rows_give_the_same_tasks(tmp_path):
    rows = records(FIXTURE_DIR / "codecontests-test.jsonl")
    path = tmp_path / "test-00000-of-00001-9c49eeff30aacaa8.parquet"
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    assert load_codecontests(path) == load_fixture(FIXTURE_DIR / "codecontests-test.jsonl", "codecontests")
    rows[2]["public_tests"]["input"].append("2 4\n")
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    with pytest.raises(TaskFileError, match=rf"^{path}: row 2: field 'public_tests' should be \{{input: \[str\], output: \[str\]\}}"):
        load_codecontests(path)


def test_taco():
    tasks = load_fixture(FIXTURE_DIR / "taco-test.jsonl", "taco")
    # ids are rows of the split, as TACO numbers its tasks; row 1 has no tests and is left out
    assert list(by_id(tasks)) == ["taco/test/0", "taco/test/2", "taco/test/3"]
    _, digits, fibonacci = tasks
    assert [t.test_kind for t in tasks] == ["stdio", "call", "stdio"]
    assert digits.entry_point == "split_digits" and digits.tests[0] == CallTest(args=[123], accepted=[[[1, 2, 3]], [1, 2, 3]])
    assert [(t.level, t.difficulty) for t in tasks] == [("EASY", 1), ("MEDIUM_HARD", 3), ("UNKNOWN_DIFFICULTY", 3)]
    assert [t.time_limit_s for t in tasks] == [1.0, None, 2.5]
    assert [t.memory_mb for t in tasks] == [256, None, 512]
    assert [t.date for t in tasks] == [datetime.date(2021, 2, 23), None, datetime.date(2020, 10, 4)]
    assert all(t.public_tests == 0 and t.source == "taco" for t in tasks)
    assert digits.prompt.endswith("```python\ndef split_digits(n):\n```\n")
    assert fibonacci.reference == PROGRAMS[fibonacci.id]["right"]


def test_livecodebench():
    tasks = load_fixture(FIXTURE_DIR / "livecodebench-test.jsonl", "livecodebench")
    assert list(by_id(tasks)) == ["livecodebench/abc900_a", "livecodebench/3900", "livecodebench/1999_F"]
    product, pairs, primes = tasks
    assert all(t.split == "test" and t.reference == "" and t.public_tests == 1 for t in tasks)
    assert [(t.level, t.difficulty) for t in tasks] == [("easy", 1), ("medium", 3), ("hard", 5)]
    assert [t.date for t in tasks] == [datetime.date(2024, 5, 4), datetime.date(2024, 8, 10), datetime.date(2023, 11, 20)]
    # public case, then the private ones (compressed in the record)
    assert product.tests == [IOTest(stdin="3 5\n", stdout="15\n"), IOTest(stdin="1 1\n", stdout="1\n"),
                             IOTest(stdin="100 100\n", stdout="10000\n")]
    assert len(primes.tests) == 4 and primes.tests[-1] == IOTest(stdin="1000000\n", stdout="78498\n")
    # functional: one JSON value per line of input, the arguments; the output a JSON value
    assert pairs.entry_point == "countPairs" and pairs.test_kind == "call"
    assert pairs.tests[:2] == [CallTest(args=[[-1, 1, 2, 3, 1], 2], accepted=[3]),
                               CallTest(args=[[-6, 2, 5, -2, -7, -1, 3], -2], accepted=[10])]
    assert pairs.prompt.endswith("```python\nclass Solution:\n    def countPairs(self, nums: List[int], target: int) -> int:\n```\n")


def test_deepcoder():
    """Each subset's own shape of tests, in the dataset's folders (lcbv5, primeintellect, taco, codeforces)."""
    tasks = by_id(load_fixture(FIXTURE_DIR / "deepcoder", "deepcoder"))
    assert list(tasks) == ["deepcoder/codeforces/test/0", "deepcoder/lcbv5/test/0", "deepcoder/lcbv5/test/1",
                           "deepcoder/primeintellect/train/0", "deepcoder/primeintellect/train/1", "deepcoder/taco/train/0"]
    assert [t.test_kind for t in tasks.values()] == ["stdio", "stdio", "call", "stdio", "call", "stdio"]
    assert tasks["deepcoder/codeforces/test/0"].tests == [IOTest(stdin="abc\n", stdout="cba\n"), IOTest(stdin="x\n", stdout="x\n")]
    maximum = tasks["deepcoder/lcbv5/test/1"]  # LiveCodeBench's functional cases, the function from metadata
    assert maximum.entry_point == "maxOf" and maximum.tests[0] == CallTest(args=[[3, 1, 2]], accepted=[3])
    assert maximum.prompt.endswith("```python\nclass Solution:\n    def maxOf(self, nums: List[int]) -> int:\n```\n")
    double = tasks["deepcoder/primeintellect/train/1"]  # PrimeIntellect's function_call: the output wrapped in a list
    assert double.entry_point == "double" and double.tests[0] == CallTest(args=[4], accepted=[[8], 8])
    # PrimeIntellect's gold solutions are markdown code blocks: the reference is the code
    assert tasks["deepcoder/primeintellect/train/0"].reference == "n = int(input())\nprint(sum(map(int, input().split())))\n"
    assert tasks["deepcoder/taco/train/0"].tests == [IOTest(stdin="5\n", stdout="25\n"), IOTest(stdin="0\n", stdout="0\n")]
    assert all(t.source == "deepcoder" and t.difficulty == 3 for t in tasks.values())
    # one subset's folder, or one file of it, names the subset too
    assert [t.id for t in load_fixture(FIXTURE_DIR / "deepcoder" / "taco", "deepcoder")] == ["deepcoder/taco/train/0"]
    one = FIXTURE_DIR / "deepcoder" / "lcbv5" / "test-00000-of-00001.jsonl"
    assert [t.id for t in load_fixture(one, "deepcoder")] == ["deepcoder/lcbv5/test/0", "deepcoder/lcbv5/test/1"]


def test_deepcoder_parquet_rows_give_the_same_tasks(tmp_path):
    rows = records(FIXTURE_DIR / "deepcoder" / "primeintellect" / "train-00000-of-00001.jsonl")
    (tmp_path / "primeintellect").mkdir()
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), tmp_path / "primeintellect" / "train-00000-of-00001.parquet")
    assert load_fixture(tmp_path, "deepcoder") == load_fixture(FIXTURE_DIR / "deepcoder" / "primeintellect", "deepcoder")


@pytest.mark.parametrize("change, reason", [
    (lambda r: r.pop("problem"), "missing field 'problem'"),
    (lambda r: r.update(tests="[1, 2]"), "field 'tests' should be an object of inputs and outputs or a list of cases"),
    (lambda r: r.update(tests=json.dumps([{"type": "function_call", "input": 4, "output": [8]}])),
     "field 'tests': case 0 should be"),
    (lambda r: r.update(tests=json.dumps([{"type": "function_call", "fn_name": "a", "input": [1], "output": [1]},
                                          {"type": "function_call", "fn_name": "b", "input": [1], "output": [1]}])),
     "field 'tests' calls several functions: a, b"),
    (lambda r: r.update(tests=json.dumps([{"input": "1", "output": "1", "testtype": "functional"}])),
     "functional test cases need metadata's func_name"),
    (lambda r: r.update(tests=json.dumps([{"stdin": "1"}])), "field 'tests': cases of no known shape"),
    (lambda r: r.update(solutions="print(1)"), "fields 'starter_code' \\(a string\\) and 'solutions'"),
])
def test_malformed_deepcoder_record(tmp_path, change, reason):
    rows = records(FIXTURE_DIR / "deepcoder" / "primeintellect" / "train-00000-of-00001.jsonl")
    change(rows[1])
    (tmp_path / "primeintellect").mkdir()
    path = write_jsonl(tmp_path / "primeintellect" / "train.jsonl", rows)
    with pytest.raises(TaskFileError, match=rf"^{path}:2: {reason}"):
        load_fixture(tmp_path, "deepcoder")


def test_code_r1():
    """verl's RL rows: a chat prompt (its user message is the task's prompt), the tests in reward_model."""
    rows = records(FIXTURE_DIR / "code-r1-test.jsonl")
    leetcode, taco, stdio = load_fixture(FIXTURE_DIR / "code-r1-test.jsonl", "code-r1")
    assert [t.id for t in (leetcode, taco, stdio)] == ["code-r1/test/0", "code-r1/test/1", "code-r1/test/2"]
    assert leetcode.prompt == rows[0]["prompt"][1]["content"] + "\n"  # the row's system message is not the task's
    # {functional: test code}: one statement test, run after the program in the tester
    assert leetcode.test_kind == "assert" and leetcode.tests == [json.loads(rows[0]["reward_model"]["ground_truth"])["functional"]]
    assert taco.test_kind == "assert" and "square(*i)" in taco.tests[0]
    assert stdio.tests == [IOTest(stdin="2 3\n", stdout="5\n"), IOTest(stdin="10 -4\n", stdout="6\n")]
    assert all(t.source == "code-r1" and t.reference == PROGRAMS[t.id]["right"] for t in (leetcode, taco, stdio))


def test_generic_jsonl():
    tasks = load_fixture(FIXTURE_DIR / "generic-train.jsonl", "generic")
    assert list(by_id(tasks)) == ["mine/train/g1", "mine/train/2"]
    reverse, add = tasks
    assert reverse.tests[0] == IOTest(stdin="abc\n", stdout="cba\n") and reverse.entry_point is None
    assert add.tests == [CallTest(args=[1, 2], accepted=[3]), CallTest(args=[-3, 3], accepted=[0])] and add.entry_point == "add"
    assert [(t.difficulty, t.source, t.split, t.level) for t in tasks] == [(1, "mine", "train", None), (2, "mine", "train", None)]
    assert [t.reference for t in tasks] == [PROGRAMS[t.id]["right"] for t in tasks]


def test_generic_parquet_with_stdin_and_stdout_columns(tmp_path):
    columns = ColumnMapping(id="id", prompt="question", inputs="stdin", outputs="stdout", solutions="solutions")
    rows = [{"id": 7, "question": "Print n + 1.", "stdin": ["1\n", "41\n"], "stdout": ["2\n", "42\n"],
             "solutions": json.dumps(["print(int(input()) + 1)\n"])},
            {"id": 8, "question": "Print nothing.", "stdin": ["x\n"], "stdout": [""], "solutions": "pass\n"}]
    path = tmp_path / "mine_validation.parquet"
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    first, second = load_generic(path, columns)
    assert (first.id, first.split, first.difficulty, first.source) == ("generic/validation/7", "validation", 3, "generic")
    assert first.tests == [IOTest(stdin="1\n", stdout="2\n"), IOTest(stdin="41\n", stdout="42\n")]
    assert first.reference == "print(int(input()) + 1)\n" and second.reference == "pass\n"  # a JSON list, one program
    rows[1]["stdout"] = ["", "extra"]
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    with pytest.raises(TaskFileError, match=rf"^{path}: row 1: field 'stdin/stdout' has 1 inputs and 2 outputs$"):
        load_generic(path, columns)


def test_a_directory_of_files_gives_each_its_split(tmp_path):
    rows = records(FIXTURE_DIR / "codecontests-test.jsonl")
    write_jsonl(tmp_path / "train-00000-of-00002.jsonl", rows[:1])
    write_jsonl(tmp_path / "train-00001-of-00002.jsonl", rows[1:2])
    write_jsonl(tmp_path / "valid-00000-of-00001.jsonl", rows[2:3])
    (tmp_path / "README.md").write_text("not data")
    tasks = load_codecontests(tmp_path)
    assert [(t.id, t.split) for t in tasks] == [("codecontests/1600_A. Even Sum", "train"), ("codecontests/REVWORDS", "train"),
                                                ("codecontests/p00001 Sum of a Range", "validation")]
    write_jsonl(tmp_path / "valid-00000-of-00001.jsonl", rows[:1])
    with pytest.raises(TaskFileError, match=r"valid-00000-of-00001.jsonl: task id 'codecontests/1600_A. Even Sum' is also in "
                                            r".*train-00000-of-00002.jsonl"):
        load_codecontests(tmp_path)


def test_split_from_the_file_name():
    assert [split_of(Path(name)) for name in ("train.jsonl", "test2.jsonl", "apps-test.jsonl", "valid-00000-of-00001.parquet",
                                              "train-00000-of-00039-e991a271dbfa9925.parquet")] == \
        ["train", "test", "test", "validation", "train"]
    # a file whose name names no split is a split of its own, whatever its name
    assert [split_of(Path(name)) for name in ("problems.jsonl", "apps_2026.jsonl.gz", "mine.parquet", "rows.json")] == \
        ["problems", "apps_2026", "mine", "rows"]


def test_a_file_of_any_name_loads_as_the_split_of_its_name(tmp_path):
    shutil.copy(FIXTURE_DIR / "apps-test.jsonl", tmp_path / "apps_problems.jsonl")
    config = TasksConfig(train_set="apps", train_path=str(tmp_path / "apps_problems.jsonl"), train_split="apps_problems",
                         eval_set="synthetic", eval_split="heldout")
    train, _ = load_tasks(config)
    assert [t.id for t in train] == ["apps/apps_problems/4000", "apps/apps_problems/4001", "apps/apps_problems/4002",
                                     "apps/apps_problems/4003"]
    with pytest.raises(ValueError, match="no tasks in split 'train'; its splits: apps_problems"):
        load_tasks(config.model_copy(update={"train_split": "train"}))


# --- malformed records: the file, the line and the reason --------------------------------------


def malformed(tmp_path: Path, fixture: str, line: int, change) -> Path:
    """The fixture with record `line` (from 1) changed in place."""
    rows = records(FIXTURE_DIR / fixture)
    change(rows[line - 1])
    return write_jsonl(tmp_path / fixture, rows)


APPS_FAULTS = [
    (lambda r: r.pop("question"), "missing field 'question'"),
    (lambda r: r.update(problem_id="4001"), "field 'problem_id' should be int, got '4001'"),
    (lambda r: r.update(input_output='{"inputs": ["1"], "outputs": '), "field 'input_output' is not valid JSON: Expecting value"),
    (lambda r: r.update(input_output='{"inputs": ["1", "2"], "outputs": ["1"]}'), "field 'input_output' has 2 inputs and 1 outputs"),
    (lambda r: r.update(input_output='{"inputs": [1], "outputs": ["1"]}'),
     "field 'input_output': inputs\\[0\\] should be a string or a list of lines, got 1"),
    (lambda r: r.update(input_output='{"fn_name": "f", "inputs": [3], "outputs": [[3]]}'),
     "field 'input_output': inputs\\[0\\] should be the list of f's arguments, got 3"),
    (lambda r: r.update(input_output='[["1"], ["1"]]'), "field 'input_output' should be an object with lists 'inputs' and 'outputs'"),
    (lambda r: r.update(solutions='{"a": 1}'), "field 'solutions' should be a JSON list of programs"),
    (lambda r: r.update(difficulty="easy"), "field 'difficulty' should be one of introductory, interview, competition, got 'easy'"),
]


@pytest.mark.parametrize("change, reason", APPS_FAULTS)
def test_malformed_apps_record(tmp_path, change, reason):
    path = malformed(tmp_path, "apps-test.jsonl", 2, change)
    with pytest.raises(TaskFileError, match=rf"^{path}:2: {reason}"):
        load_task_set("apps", path)


OTHER_FAULTS = [
    ("codecontests-test.jsonl", "codecontests", lambda r: r["public_tests"].update(input="1 2\n"),
     r"field 'public_tests' should be \{input: \[str\], output: \[str\]\} of equal lengths"),
    ("codecontests-test.jsonl", "codecontests", lambda r: r["solutions"].update(language=[3]),
     r"field 'solutions' should be \{language: \[int\], solution: \[str\]\} of equal lengths"),
    ("codecontests-test.jsonl", "codecontests", lambda r: r.update(difficulty=18), "field 'difficulty' should be one of 0, 1, 2"),
    ("codecontests-test.jsonl", "codecontests", lambda r: r.update(time_limit="2 seconds"),
     r"field 'time_limit' should be null or \{seconds: int, nanos: int\}"),
    ("codecontests-test.jsonl", "codecontests", lambda r: r.update(memory_limit_bytes=None), "field 'memory_limit_bytes' should be int"),
    ("taco-test.jsonl", "taco", lambda r: r.update(time_limit=2), "field 'time_limit' should be a string or null, got 2"),
    ("taco-test.jsonl", "taco", lambda r: r.pop("date"), "missing field 'date'"),
    ("taco-test.jsonl", "taco", lambda r: r.update(difficulty="EASIEST"), "field 'difficulty' should be one of EASY, MEDIUM"),
    ("livecodebench-test.jsonl", "livecodebench", lambda r: r.update(contest_date="last May"),
     "field 'contest_date' should be an ISO date and time, got 'last May'"),
    ("livecodebench-test.jsonl", "livecodebench", lambda r: r.update(metadata="{}"),
     "functional test cases need metadata's func_name"),
    ("livecodebench-test.jsonl", "livecodebench", lambda r: r.update(public_test_cases='[{"input": "1"}]'),
     r"field 'public_test_cases' should be a list of \{input: str, output: str, testtype: stdin\|functional\}"),
    ("livecodebench-test.jsonl", "livecodebench",
     lambda r: r.update(public_test_cases=json.dumps([{"input": "[1,\n", "output": "1", "testtype": "functional"}])),
     "field 'public_test_cases': case 0 is functional but not JSON values"),
    ("livecodebench-test.jsonl", "livecodebench", lambda r: r.update(private_test_cases="not base64!"),
     "field 'private_test_cases' is neither a JSON list nor its compressed form: not base64 of zlib data"),
    ("livecodebench-test.jsonl", "livecodebench", lambda r: r.update(private_test_cases=compress([1, 2])),
     "field 'private_test_cases' is neither a JSON list nor its compressed form: the pickle holds a list, not a JSON string"),
    ("livecodebench-test.jsonl", "livecodebench", lambda r: r.update(private_test_cases=compress("[{]")),
     "field 'private_test_cases' is not valid JSON"),
    ("code-r1-test.jsonl", "code-r1", lambda r: r.update(prompt=[{"role": "system", "content": "x"}]),
     "field 'prompt' has no user message"),
    ("code-r1-test.jsonl", "code-r1", lambda r: r.update(prompt="write code"), "field 'prompt' should be a list of chat messages"),
    ("code-r1-test.jsonl", "code-r1", lambda r: r["reward_model"].update(ground_truth='{"tests": []}'),
     "field 'reward_model.ground_truth' should be \\{functional: test code\\} or \\{inputs, outputs\\}"),
    ("generic-train.jsonl", "generic", lambda r: r.pop("uid"), "missing field 'uid'"),
    ("generic-train.jsonl", "generic", lambda r: r.update(uid=True), "field 'uid' should be a string or an integer, got True"),
    ("generic-train.jsonl", "generic", lambda r: r.update(level="easy"), "field 'level' should be an integer from 1 to 5"),
    ("generic-train.jsonl", "generic", lambda r: r.update(level=7), "invalid task: difficulty: Input should be less than or equal to 5"),
    ("generic-train.jsonl", "generic", lambda r: r.update(tests=[1]), "field 'tests' should be an object or a JSON string"),
]


@pytest.mark.parametrize("fixture, loader, change, reason", OTHER_FAULTS)
def test_malformed_record(tmp_path, fixture, loader, change, reason):
    path = malformed(tmp_path, fixture, 2, change)
    with pytest.raises(TaskFileError, match=rf"^{path}:2: {reason}"):
        load_fixture(path, loader)


def test_malformed_files(tmp_path):
    bad = tmp_path / "test.jsonl"
    bad.write_text('{"problem_id": 1,\n')
    with pytest.raises(TaskFileError, match=rf"^{bad}:1: invalid JSON"):
        load_task_set("apps", bad)
    bad.write_text(json.dumps(records(FIXTURE_DIR / "apps-test.jsonl")[-1]) + "\n")  # only a record without tests
    with pytest.raises(TaskFileError, match=rf"^{bad}: no tasks in file"):
        load_task_set("apps", bad)
    not_parquet = tmp_path / "test.parquet"
    not_parquet.write_text("PAR")
    with pytest.raises(TaskFileError, match=rf"^{not_parquet}: not a readable Parquet file"):
        load_task_set("codecontests", not_parquet)
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskFileError, match="empty: the directory holds no .jsonl, .jsonl.gz, .parquet file"):
        load_task_set("taco", tmp_path / "empty")
    with pytest.raises(ValueError, match="the generic task set reads its columns from tasks.columns"):
        load_task_set("generic", FIXTURE_DIR / "generic-train.jsonl")


# --- LiveCodeBench's compressed test cases --------------------------------------------------


def test_compressed_test_cases_decode():
    cases = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]
    assert decompress_test_cases(compress(json.dumps(cases))) == json.dumps(cases)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):  # a str needs no global in any protocol
        text = base64.b64encode(zlib.compress(pickle.dumps("[]", protocol=protocol))).decode()
        assert decompress_test_cases(text) == "[]"


class RunsACommand:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_pickle_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "ran"
    text = compress(RunsACommand(marker))
    with pytest.raises(ValueError, match=r"not a pickled string: UnpicklingError: refused: it asks for (posix|nt)\.system"):
        decompress_test_cases(text)
    assert not marker.exists()
    path = malformed(tmp_path, "livecodebench-test.jsonl", 1, lambda r: r.update(private_test_cases=text))
    with pytest.raises(TaskFileError, match=rf"^{path}:1: field 'private_test_cases' is neither a JSON list nor its "
                                            r"compressed form: not a pickled string: UnpicklingError: refused"):
        load_fixture(path, "livecodebench")
    assert not marker.exists()


# --- evaluation: the sets, the date filter, the breakdowns ------------------------------------


def test_competitive_eval_sets(tmp_path):
    assert {name: (EVAL_SETS[name].loader, EVAL_SETS[name].file) for name in ("apps", "codecontests", "taco", "livecodebench")} == {
        "apps": ("apps", "apps-test.jsonl"), "codecontests": ("codecontests", "codecontests-test.parquet"),
        "taco": ("taco", "taco-test.parquet"), "livecodebench": ("livecodebench", "livecodebench")}
    (tmp_path / "livecodebench").mkdir()
    write_jsonl(tmp_path / "livecodebench" / "test.jsonl", records(FIXTURE_DIR / "livecodebench-test.jsonl"))
    assert len(load_eval_set("livecodebench", tmp_path)) == 3
    after = load_eval_set("livecodebench", tmp_path, after=datetime.date(2024, 5, 3))
    assert [t.id for t in after] == ["livecodebench/abc900_a", "livecodebench/3900"]
    assert [t.id for t in load_eval_set("livecodebench", tmp_path, max_tasks=1, after=datetime.date(2024, 5, 4))] == \
        ["livecodebench/3900"]  # the day itself is left out, then the first max_tasks
    with pytest.raises(FileNotFoundError, match="evaluation set 'apps': no file"):
        load_eval_set("apps", tmp_path)


def test_published_after():
    tasks = load_fixture(FIXTURE_DIR / "taco-test.jsonl", "taco")  # dated 2021-02-23, none, 2020-10-04
    assert published_after(tasks, None, "taco") == tasks
    assert [t.id for t in published_after(tasks, datetime.date(2020, 12, 31), "taco")] == ["taco/test/0"]
    with pytest.raises(ConfigError, match=r"--after 2021-02-23: none of the 3 tasks of 'taco' was published after it \(1 have no date\)"):
        published_after(tasks, datetime.date(2021, 2, 23), "taco")


def test_pass_rates_by_level_and_by_month():
    tasks = load_fixture(FIXTURE_DIR / "livecodebench-test.jsonl", "livecodebench") + \
        load_fixture(FIXTURE_DIR / "generic-train.jsonl", "generic")  # no level, no date
    passed = np.array([[True, True], [True, False], [False, False], [True, True], [False, True]])
    assert pass_rate_by(tasks, passed, lambda task: task.level) == {"easy": 1.0, "hard": 0.0, "medium": 0.5}
    assert pass_rate_by(tasks, passed, lambda task: task.date and f"{task.date:%Y-%m}") == {
        "2023-11": 0.0, "2024-05": 1.0, "2024-08": 0.5}
    assert pass_rate_by(tasks[3:], passed[3:], lambda task: task.level) == {}
    assert pass_rate_by(tasks, passed, lambda task: task.source) == {"livecodebench": 0.5, "mine": 0.75}


def test_eval_cli_after_flag(capsys):
    from coderloo.cli import main

    # the synthetic evaluation set has no dates: nothing is left to evaluate, said before anything starts
    assert main(["eval", "--after", "2024-08-01"]) == 2
    assert "--after 2024-08-01: none of the" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "--after", "August"])
    assert "argument --after: invalid fromisoformat value: 'August'" in capsys.readouterr().err
