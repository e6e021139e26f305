"""Benchmark loaders: counts, splits, known records, and every reference solution passing its tests."""
from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from coderloo.tasksets.benchmarks import (
    load_humaneval,
    load_mbpp,
    load_sanitized_mbpp,
    load_task_set,
    mbpp_prompt,
)
from reward_service.tasks import Task, TaskFileError, load_jsonl, save_jsonl

FILES = {"mbpp": "mbpp.jsonl", "mbpp-sanitized": "sanitized-mbpp.json", "humaneval": "HumanEval.jsonl.gz"}
COUNTS = {"mbpp": 974, "mbpp-sanitized": 427, "humaneval": 164}


@pytest.fixture(scope="module")
def task_sets(shared_data: Path) -> dict[str, list[Task]]:
    return {name: load_task_set(name, shared_data / file) for name, file in FILES.items()}


def by_id(tasks: list[Task]) -> dict[str, Task]:
    return {task.id: task for task in tasks}


def failing_references(tasks: list[Task], workdir: Path) -> dict[str, str]:
    """Run each task's reference program with its setup and tests in its own interpreter.

    Returns {task id: reason} for the ones that fail; the caller asserts it is empty.
    """

    def run(task: Task) -> tuple[str, str | None]:
        program = task.reference + "\n" + task.test_setup + "\n" + "\n".join(task.tests)
        try:
            result = subprocess.run(
                [sys.executable, "-I", "-S", "-c", program], capture_output=True, text=True, timeout=60, cwd=workdir
            )
        except subprocess.TimeoutExpired:
            return task.id, "timed out after 60 s"
        return task.id, None if result.returncode == 0 else f"exit {result.returncode}: {result.stderr[-400:]}"

    with ThreadPoolExecutor(max_workers=2 * (os.cpu_count() or 1)) as pool:
        results = list(pool.map(run, tasks))
    assert len(results) == len(tasks)
    return {task_id: reason for task_id, reason in results if reason is not None}


@pytest.mark.parametrize("name", FILES)
def test_every_reference_solution_passes_its_tests(name, task_sets, tmp_path):
    tasks = task_sets[name]
    assert len(tasks) == COUNTS[name]
    assert failing_references(tasks, tmp_path) == {}


def test_the_reference_runner_reports_a_wrong_solution(task_sets, tmp_path):
    good = by_id(task_sets["mbpp"])["mbpp/2"]
    wrong_reference = "def similar_elements(a, b):\n    return ()\n"
    wrong = good.model_copy(update={"id": "mbpp/2-wrong", "reference": wrong_reference})
    failures = failing_references([good, wrong], tmp_path)
    assert list(failures) == ["mbpp/2-wrong"]
    assert "AssertionError" in failures["mbpp/2-wrong"]


@pytest.mark.parametrize("name", FILES)
def test_counts_and_unique_ids(name, task_sets):
    tasks = task_sets[name]
    assert len(tasks) == COUNTS[name]
    assert len(by_id(tasks)) == COUNTS[name]
    assert all(1 <= task.difficulty <= 5 for task in tasks)
    assert len({task.difficulty for task in tasks}) == 5, "the difficulty heuristic should use the whole range"


def test_mbpp_standard_splits(task_sets):
    tasks = task_sets["mbpp"]
    assert Counter(task.split for task in tasks) == {"fewshot": 10, "test": 500, "validation": 90, "train": 374}
    tasks_by_id = by_id(tasks)
    edges = {
        1: "fewshot", 10: "fewshot", 11: "test", 510: "test",
        511: "validation", 600: "validation", 601: "train", 974: "train",
    }
    assert {n: tasks_by_id[f"mbpp/{n}"].split for n in edges} == edges


def test_known_mbpp_task(task_sets):
    task = by_id(task_sets["mbpp"])["mbpp/2"]
    tests = [
        "assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)",
        "assert similar_elements((1, 2, 3, 4),(5, 4, 3, 7)) == (3, 4)",
        "assert similar_elements((11, 12, 14, 13),(17, 15, 14, 13)) == (13, 14)",
    ]
    assert task.tests == tests and task.shown == tests[:1] and task.held == tests[1:]
    assert task.prompt == (  # the first test shown, the others held
        "You are an expert Python programmer, and here is your task: "
        "Write a function to find the similar elements from the given two tuple lists. "
        "Your code should pass these tests:\n\n" + tests[0] + "\n"
    )
    assert task.reference == (
        "def similar_elements(test_tup1, test_tup2):\n  res = tuple(set(test_tup1) & set(test_tup2))\n  return (res) "
    )
    assert task.entry_point == "similar_elements"
    assert (task.source, task.split, task.prompt_is_code, task.test_setup) == ("mbpp", "fewshot", False, "")
    assert task.difficulty == 2
    # A completion is the whole program for a prose prompt.
    assert task.program("def f(): pass") == "def f(): pass"


def test_mbpp_test_setup_and_entry_points(task_sets):
    tasks = by_id(task_sets["mbpp"])
    # Tasks 367 and 927 build a tree in test_setup_code with the Node class the reference defines.
    assert tasks["mbpp/367"].test_setup.startswith("root = Node(1)")
    assert "class Node" in tasks["mbpp/367"].reference
    assert tasks["mbpp/367"].entry_point == "is_tree_balanced"
    # The reference of 126 shadows the builtin sum; the test calls it.
    assert tasks["mbpp/126"].entry_point == "sum"
    assert all(task.entry_point in task.tests[0] for task in tasks.values())


def test_mbpp_crlf_is_normalised(shared_data, task_sets):
    raw = (shared_data / "mbpp.jsonl").read_text(encoding="utf-8")
    assert "\\r\\n" in raw, "the published code uses CRLF; this test would be vacuous otherwise"
    tasks = task_sets["mbpp"]
    assert not any("\r" in task.reference or "\r" in task.test_setup or "\r" in task.prompt for task in tasks)
    assert "R = 3\nC = 3\ndef min_cost(cost, m, n): \n" in by_id(tasks)["mbpp/1"].reference


def test_known_sanitized_mbpp_task(task_sets):
    tasks = by_id(task_sets["mbpp-sanitized"])
    task = tasks["mbpp-sanitized/2"]
    # The first test wraps the call in set(...): the entry point is still the solution's function.
    assert task.tests[0] == "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))"
    assert task.entry_point == "similar_elements"
    text = "Write a function to find the shared elements from the given two lists."
    assert task.prompt == mbpp_prompt(text, task.shown) and task.public_tests == 1 and len(task.held) == 2
    assert (task.source, task.split, task.prompt_is_code, task.test_setup) == ("mbpp-sanitized", "fewshot", False, "")
    # test_imports become test_setup.
    assert tasks["mbpp-sanitized/82"].test_setup == "import math"
    assert tasks["mbpp-sanitized/82"].entry_point == "volume_sphere"
    assert sum(1 for t in tasks.values() if t.test_setup) == 13
    assert Counter(t.split for t in tasks.values()) == {"test": 257, "train": 120, "validation": 43, "fewshot": 7}


def test_known_humaneval_task(shared_data, task_sets):
    with gzip.open(shared_data / "HumanEval.jsonl.gz", "rt", encoding="utf-8") as f:
        record = json.loads(f.readline())
    task = task_sets["humaneval"][0]
    assert task.id == record["task_id"] == "HumanEval/0"
    assert task.prompt == record["prompt"]
    assert task.prompt.startswith("from typing import List\n\n\ndef has_close_elements(")
    assert task.entry_point == "has_close_elements"
    assert task.tests == [record["test"] + "\ncheck(has_close_elements)"]
    assert task.reference == record["prompt"] + record["canonical_solution"]
    assert (task.source, task.split, task.prompt_is_code, task.test_setup) == ("humaneval", "test", True, "")
    # A completion continues the prompt.
    assert task.program("    return False\n") == record["prompt"] + "    return False\n"
    assert {t.split for t in task_sets["humaneval"]} == {"test"}


def test_jsonl_round_trip(task_sets, tmp_path):
    tasks = task_sets["mbpp"][:20] + task_sets["mbpp-sanitized"][:20] + task_sets["humaneval"][:20]
    path = tmp_path / "tasks.jsonl"
    save_jsonl(tasks, path)
    assert len(path.read_text(encoding="utf-8").splitlines()) == 60
    assert load_task_set("jsonl", path) == tasks
    assert load_jsonl(path) == tasks


def test_unknown_task_set_name(tmp_path):
    with pytest.raises(ValueError, match="unknown task set 'leetcode'.*mbpp, mbpp-sanitized, humaneval, jsonl"):
        load_task_set("leetcode", tmp_path / "x")


# Malformed files: built from real records so that only the injected fault can be the reason.


def mbpp_lines(shared_data: Path, n: int) -> list[str]:
    with (shared_data / "mbpp.jsonl").open(encoding="utf-8") as f:
        return [next(f) for _ in range(n)]


def test_mbpp_fixture_lines_load(shared_data, tmp_path):
    path = tmp_path / "mbpp.jsonl"
    path.write_text("".join(mbpp_lines(shared_data, 3)), encoding="utf-8")
    assert [t.id for t in load_mbpp(path)] == ["mbpp/1", "mbpp/2", "mbpp/3"]


def where(path: Path) -> str:
    """A regex matching the start of an error message about path."""
    return "^" + re.escape(str(path))


def test_invalid_json_line_names_file_and_line(shared_data, tmp_path):
    path = tmp_path / "mbpp.jsonl"
    lines = mbpp_lines(shared_data, 3)
    lines[2] = lines[2][:-20] + "\n"  # truncated record
    path.write_text("".join(lines), encoding="utf-8")
    with pytest.raises(TaskFileError, match=where(path) + ":3: invalid JSON"):
        load_mbpp(path)


def test_missing_field_names_field_and_line(shared_data, tmp_path):
    path = tmp_path / "mbpp.jsonl"
    lines = mbpp_lines(shared_data, 3)
    record = json.loads(lines[1])
    del record["code"]
    lines[1] = json.dumps(record) + "\n"
    path.write_text("".join(lines), encoding="utf-8")
    with pytest.raises(TaskFileError, match=where(path) + ":2: missing field 'code'$"):
        load_mbpp(path)


def test_wrong_field_type_and_duplicate_id(shared_data, tmp_path):
    path = tmp_path / "mbpp.jsonl"
    lines = mbpp_lines(shared_data, 2)
    record = json.loads(lines[1])
    path.write_text(lines[0] + json.dumps({**record, "test_list": "assert True"}) + "\n", encoding="utf-8")
    with pytest.raises(TaskFileError, match=where(path) + ":2: field 'test_list' should be a list of strings"):
        load_mbpp(path)
    path.write_text(lines[0] + lines[1] + "\n" + lines[1], encoding="utf-8")
    duplicate = ":4: duplicate task id 'mbpp/2' \\(first at " + re.escape(str(path)) + ":2\\)$"
    with pytest.raises(TaskFileError, match=where(path) + duplicate):
        load_mbpp(path)


def test_test_calling_no_defined_function_is_reported(shared_data, tmp_path):
    path = tmp_path / "mbpp.jsonl"
    record = json.loads(mbpp_lines(shared_data, 2)[1])
    path.write_text(json.dumps({**record, "test_list": ["assert len((1,)) == 1"] * 2}) + "\n", encoding="utf-8")
    reason = ":1: the first test calls no function that the reference defines"
    with pytest.raises(TaskFileError, match=where(path) + reason):
        load_mbpp(path)
    path.write_text(json.dumps({**record, "test_list": []}) + "\n", encoding="utf-8")
    with pytest.raises(TaskFileError, match=where(path) + ":1: test_list is empty"):
        load_mbpp(path)


def test_sanitized_mbpp_malformed(shared_data, tmp_path):
    records = json.loads((shared_data / "sanitized-mbpp.json").read_text(encoding="utf-8"))[:3]
    path = tmp_path / "sanitized-mbpp.json"
    path.write_text(json.dumps(records, indent=1), encoding="utf-8")
    assert len(load_sanitized_mbpp(path)) == 3
    del records[1]["test_list"]
    path.write_text(json.dumps(records), encoding="utf-8")
    with pytest.raises(TaskFileError, match=where(path) + ": record 1: missing field 'test_list'$"):
        load_sanitized_mbpp(path)
    path.write_text('[\n{"task_id": 2,\n "prompt": }\n]', encoding="utf-8")
    with pytest.raises(TaskFileError, match=where(path) + ":3: invalid JSON"):
        load_sanitized_mbpp(path)
    path.write_text("[]", encoding="utf-8")
    with pytest.raises(TaskFileError, match=where(path) + ": no tasks in file$"):
        load_sanitized_mbpp(path)


def test_humaneval_malformed(shared_data, tmp_path):
    with gzip.open(shared_data / "HumanEval.jsonl.gz", "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(2)]
    path = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(lines[0] + json.dumps({k: v for k, v in json.loads(lines[1]).items() if k != "entry_point"}) + "\n")
    with pytest.raises(TaskFileError, match=where(path) + ":2: missing field 'entry_point'$"):
        load_humaneval(path)
    path.write_bytes(gzip.compress(lines[0].encode())[:-10])
    with pytest.raises(TaskFileError, match=where(path) + ": not a complete gzip file"):
        load_humaneval(path)
