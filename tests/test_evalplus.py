"""EvalPlus sets (HumanEval+, MBPP+) and the benchmark sets of `coderloo eval`: the oracle's rules,
the loaders, and every reference solution passing its own tests in the real sandbox.

The sandbox check runs every base input and an evenly spread subset of PLUS_LIMIT plus inputs
per task (about 4 minutes on 2 cores). The full check, every plus input, takes longer:

    CODERLOO_EVALPLUS_FULL=1 .venv/bin/python -m pytest -q tests/test_evalplus.py -k reference
"""
from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path

import pytest

from coderloo.tasksets import evalplus_oracle as oracle
from coderloo.runtime import USER_CACHE
from coderloo.tasksets.evalplus import CODE_DIGEST, file_sha256, left_out, load_evalplus, time_limit
from coderloo.tasksets.evalsets import EVAL_SETS, load_eval_set
from reward_service.scorer import FEEDBACK_PART_CHARS
from reward_service.tasks import Task, TaskFileError

FULL = os.environ.get("CODERLOO_EVALPLUS_FULL") == "1"
PLUS_LIMIT = None if FULL else 25
HUMANEVAL_PLUS = "HumanEvalPlus-v0.1.10.jsonl.gz"
MBPP_PLUS = "MbppPlus-v0.2.0.jsonl.gz"


# ---- the oracle, as pure logic (it runs in the sandbox's tester in real use) ----

def _oracle(dataset, entry_point, cases, atol=0, num_base=None):
    namespace = {"__name__": "evalplus_oracle"}
    exec(Path(oracle.__file__).read_text(), namespace)
    encoded = [[oracle.encode(args), oracle.encode(out)] for args, out in cases]
    namespace["load"](dataset, entry_point, atol, len(cases) if num_base is None else num_base, json.dumps(encoded),
                      [1.0] * len(cases), lambda seconds, fn, *args: fn(*args))  # the tester's limit: in the sandbox
    return namespace["check"]


def test_codec_round_trips_the_values_tasks_use():
    value = [(1, 2), {3, 4}, frozenset({5}), {(1, 2): "a", 3: [None, True]}, 1.5, complex(1, -2), b"\x00\xff",
             2**20000, -(2**20000), "é", float("inf")]
    assert oracle.decode(json.loads(json.dumps(oracle.encode(value)))) == value
    assert math.isnan(oracle.decode(json.loads(json.dumps(oracle.encode(float("nan"))))))
    from collections import Counter

    assert oracle.decode(oracle.encode(Counter("aab"))) == {"a": 2, "b": 1}
    with pytest.raises(TypeError, match="not a plain value: map"):
        oracle.encode(map(str, []))


def test_exact_match_and_float_tolerance():
    check = _oracle("humaneval", "f", [([1], 2), ([2], [1.0, 2.0])])
    check(lambda x: 2, 0)
    with pytest.raises(AssertionError, match=r"^input 0: f\(1\) returned 3, expected 2$"):
        check(lambda x: 3, 0)
    # a float expectation gets atol 1e-6 (and rtol 1e-7), of the same type and length only
    check(lambda x: [1.0 + 5e-7, 2.0], 1)
    with pytest.raises(AssertionError):
        check(lambda x: [1.0 + 1e-5, 2.0], 1)
    with pytest.raises(AssertionError):
        check(lambda x: (1.0, 2.0), 1)
    with pytest.raises(AssertionError):
        check(lambda x: [1.0, 2.0, 3.0], 1)


def test_a_failed_check_names_the_call_and_both_values_within_a_feedback_line():
    long = list(range(1000))
    check = _oracle("mbpp", "f", [([long, "x" * 500], long)])
    with pytest.raises(AssertionError) as failed:
        check(lambda a, b: None, 0)
    said = str(failed.value)
    assert said.startswith("input 0: f([0, 1, 2,") and "returned None, expected [0, 1, 2," in said
    assert len("AssertionError: " + said) <= FEEDBACK_PART_CHARS  # the feedback's line keeps the whole message
    check = _oracle("mbpp", "check_str", [(["annie"], True)])  # only whether the canonical output was None
    with pytest.raises(AssertionError, match=r"check_str\('annie'\) returned None, expected a value other than None$"):
        check(lambda s: None, 0)


def test_evalplus_time_limit_of_an_input():
    # max(1 s, 4 x the canonical solution's time on it)
    assert [time_limit(t) for t in (0.0, 0.25, 0.5)] == [1.0, 1.0, 2.0]
    assert time_limit(0.5, factor=10) == 5.0  # EvalPlus's --gt-time-limit-factor


def test_record_atol_and_sticky_float_atol():
    check = _oracle("mbpp", "f", [([1], 1.0), ([2], 5)], atol=1e-4)
    check(lambda x: 1.00005, 0)
    with pytest.raises(AssertionError):
        check(lambda x: 1.001, 0)
    # EvalPlus: once a float was expected, atol stays 1e-6 for the rest of the input group,
    # so an int output close to an int expectation... is still compared with type and allclose
    check = _oracle("humaneval", "f", [([1], 1.0), ([2], [1, 2])])
    check(lambda x: 1.0, 0)
    with pytest.raises(AssertionError):
        check(lambda x: [1, 3], 1)
    check(lambda x: [1, 2], 1)


def test_special_oracles():
    # HumanEval/32 find_zero: |poly(xs, x)| <= atol, whatever root the program found
    check = _oracle("humaneval", "find_zero", [([[-6, 11, -6, 1]], 1.0)], atol=1e-4)
    check(lambda xs: 3.0, 0)
    check(lambda xs: 2.0, 0)
    with pytest.raises(AssertionError, match="poly"):
        check(lambda xs: 2.5, 0)
    # MBPP set comparisons
    check = _oracle("mbpp", "similar_elements", [([(1, 2), (2, 1)], (1, 2))])
    check(lambda a, b: (2, 1), 0)
    check(lambda a, b: [1, 2, 2], 0)
    with pytest.raises(AssertionError):
        check(lambda a, b: (1,), 0)
    # MBPP: only None-ness matters (the canonical output was a re.Match: expected True)
    check = _oracle("mbpp", "text_match_three", [(["abbb"], True), (["a"], False)])
    check(lambda s: object(), 0)
    check(lambda s: True, 0)
    check(lambda s: None, 1)
    with pytest.raises(AssertionError):
        check(lambda s: None, 0)
    with pytest.raises(AssertionError):
        check(lambda s: True, 1)
    # MBPP sum_div also accepts 0; surface_Area and digit_distance_nums also EvalPlus's own oracle
    check = _oracle("mbpp", "sum_div", [([8], 7)])
    check(lambda n: 0, 0)
    check = _oracle("mbpp", "digit_distance_nums", [([123, 9], 99)])
    check(lambda a, b: oracle._digit_distance_nums(123, 9), 0)


# ---- the loaders ----

@pytest.fixture(scope="module")
def evalplus_sets(shared_data, tmp_path_factory):
    return {
        "humaneval+": load_evalplus(shared_data / HUMANEVAL_PLUS, plus_limit=PLUS_LIMIT),
        "mbpp+": load_evalplus(shared_data / MBPP_PLUS, plus_limit=PLUS_LIMIT),
    }


@pytest.fixture(scope="module")
def untimed_evalplus_sets(shared_data):
    """The sets with EvalPlus's time limits 1,000 times the canonical solution's time, not 4: the
    references' outputs are checked, not the speed of a machine running four of them on two cores
    beside the rest of the suite."""
    return {name: load_evalplus(shared_data / file, plus_limit=PLUS_LIMIT, time_limit_factor=1000)
            for name, file in (("humaneval+", HUMANEVAL_PLUS), ("mbpp+", MBPP_PLUS))}


def test_evalplus_tasks(evalplus_sets, shared_data):
    he, mbpp = {t.id: t for t in evalplus_sets["humaneval+"]}, {t.id: t for t in evalplus_sets["mbpp+"]}
    assert len(he) == 164 and len(mbpp) == 378
    first = he["humaneval+/0"]
    assert first.prompt_is_code and first.entry_point == "has_close_elements" and first.source == "humaneval+"
    assert first.tests[0] == "_evalplus['check'](has_close_elements, 0)"
    # the base inputs shown, the plus inputs held
    assert first.public_tests == 7 and first.held[0] == "_evalplus['check'](has_close_elements, 7)"
    assert first.reference.startswith(first.prompt)
    # the expected outputs are in the tester's setup, never in the program
    assert "_evalplus['load']('humaneval'" in first.test_setup and first.test_setup not in first.program("pass")
    # Mbpp/793: plus_input is {} in v0.2.0: its base inputs only, all shown
    assert len(mbpp["mbpp+/793"].tests) == 3 and mbpp["mbpp+/793"].public_tests == 3
    # the base variant: the base inputs only
    base = {t.id: t for t in load_evalplus(shared_data / HUMANEVAL_PLUS, plus=False)}
    assert len(base["humaneval+base/0"].tests) == 7 and base["humaneval+base/0"].public_tests == 0
    # EvalPlus's allowance for the run: each input group min(60 s, its inputs' limits, 1 s each here) + 2 s,
    # which raises a lower limit of the evaluation's
    plus_inputs = len(first.tests) - 7
    assert (base["humaneval+base/0"].run_time_s, first.run_time_s) == (7 + 2, 7 + 2 + min(60, plus_inputs) + 2)
    from sandbox_pool import Limits

    assert first.run_limits(Limits(wall_timeout_s=5, cpu_time_s=5)).model_dump(include={"wall_timeout_s", "cpu_time_s"}) \
        == {"wall_timeout_s": first.run_time_s, "cpu_time_s": first.run_time_s}
    # inputs whose expected outputs are too large to cross the sandbox's channel (over 4 MiB)
    assert left_out(shared_data / MBPP_PLUS) == {"Mbpp/255": [85, 86, 90, 96, 100]}
    assert {k: len(v) for k, v in left_out(shared_data / HUMANEVAL_PLUS).items()} == {
        "HumanEval/15": 21, "HumanEval/100": 1, "HumanEval/130": 10}
    assert (USER_CACHE / "evalplus" / f"{file_sha256(shared_data / MBPP_PLUS)}-{CODE_DIGEST}.json").is_file()


def test_a_bad_evalplus_file_names_the_line(tmp_path, shared_data):
    with gzip.open(shared_data / MBPP_PLUS, "rt") as f:
        lines = [f.readline(), f.readline()]
    record = json.loads(lines[1])
    del record["atol"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(lines[0] + json.dumps(record) + "\n")
    with pytest.raises(TaskFileError, match=r"bad.jsonl:2: missing field 'atol'"):
        load_evalplus(bad, cache_dir=tmp_path)
    record = json.loads(lines[0])
    record["canonical_solution"] = "def similar_elements(a, b):\n    raise KeyError('boom')\n"
    bad.write_text(json.dumps(record) + "\n")
    with pytest.raises(TaskFileError, match=r"bad.jsonl:1: the canonical solution of Mbpp/2 fails on its base inputs: KeyError"):
        load_evalplus(bad, cache_dir=tmp_path)


def test_expected_outputs_are_computed_once_into_the_cache_then_read_from_it(tmp_path, shared_data):
    """The cold path that every machine's first run takes (the suite's runs find the user's cache
    warm): the canonical solutions run, the outputs are written whole, and the next load reads them."""
    with gzip.open(shared_data / MBPP_PLUS, "rt") as f:
        first = tmp_path / "MbppPlus-first.jsonl"
        first.write_text(f.readline() + f.readline())
    cache = tmp_path / "cache"
    computed = load_evalplus(first, plus_limit=3, cache_dir=cache)
    written = list(cache.iterdir())
    assert [p.name for p in written] == [f"{file_sha256(first)}-{CODE_DIGEST}.json"]  # no partial file left
    outputs = json.loads(written[0].read_text())
    assert sorted(outputs) == ["Mbpp/2", "Mbpp/3"] and {"base", "plus", "base_time", "plus_time"} <= set(outputs["Mbpp/2"])
    written[0].write_text(json.dumps({**outputs, "Mbpp/2": {**outputs["Mbpp/2"], "base": ["from the cache"] * len(outputs["Mbpp/2"]["base"])}}))
    again = load_evalplus(first, plus_limit=3, cache_dir=cache)
    assert [t.id for t in again] == [t.id for t in computed] and again[1] == computed[1]
    assert again[0] != computed[0] and "from the cache" in json.dumps(again[0].model_dump())


def test_mbpp_three_shot_prompt(shared_data):
    tasks = {t.id: t for t in load_eval_set("mbpp", shared_data)}
    assert len(tasks) == 500 and min(int(i.split("/")[1]) for i in tasks) == 11
    prompt = tasks["mbpp/11"].prompt
    assert prompt.count("[BEGIN]") == 4 and prompt.count("[DONE]") == 3 and prompt.endswith("[BEGIN]\n")
    assert prompt.index("similar_elements") < prompt.index("is_not_prime") < prompt.index("heap_queue_largest")
    sanitized = load_eval_set("mbpp-sanitized", shared_data)
    assert len(sanitized) == 257 and all(t.prompt.endswith("[BEGIN]\n") for t in sanitized)


# ---- every reference solution passes in the real sandbox ----

def _failing_references(pool, tasks: list[Task], limits) -> dict[str, str]:
    from sandbox_pool import Status

    # all the tests, then the shown ones alone (what refinement's feedback runs)
    runs = [(t, t) for t in tasks] + [(t, t.examples()) for t in tasks if t.public_tests]
    results = pool.run([judged.execution_request(t.reference, limits) for t, judged in runs])
    return {
        t.id: f"{r.status.value}: {r.detail} {[o.error for o in r.tests if not o.passed][:2]}"
        for (t, _), r in zip(runs, results) if r.status != Status.passed
    }


@pytest.fixture(scope="module")
def sandbox(ray_cluster):
    from sandbox_pool import PoolSettings, SandboxPool

    pool = SandboxPool(PoolSettings(min_executors=2, max_executors=2, concurrency_per_executor=2))
    yield pool
    pool.shutdown()


@pytest.mark.parametrize("name", ["mbpp", "mbpp-sanitized", "humaneval", "humaneval+", "mbpp+"])
def test_every_reference_solution_passes_in_the_sandbox(name, sandbox, shared_data, untimed_evalplus_sets):
    from sandbox_pool import Limits

    tasks = untimed_evalplus_sets[name] if name in untimed_evalplus_sets else load_eval_set(name, shared_data)
    assert len(tasks) == {"mbpp": 500, "mbpp-sanitized": 257, "humaneval": 164, "humaneval+": 164, "mbpp+": 378}[name]
    # generous limits: this checks the tests, not the speed of a loaded machine
    limits = Limits(wall_timeout_s=120, cpu_time_s=60, memory_mb=2048)
    failing = _failing_references(sandbox, tasks, limits)
    assert failing == {}
    print(f"{name}: all {len(tasks)} reference solutions passed "
          f"({sum(len(t.tests) for t in tasks)} tests)")


def test_a_wrong_solution_fails_its_evalplus_tests(sandbox, evalplus_sets):
    from sandbox_pool import Limits, Status

    task = next(t for t in evalplus_sets["mbpp+"] if t.id == "mbpp+/2")
    wrong = task.prompt + "def similar_elements(a, b):\n    return tuple(set(a) | set(b))\n"
    fake = task.prompt + "class Yes:\n    def __eq__(self, other):\n        return True\ndef similar_elements(a, b):\n    return Yes()\n"
    # EvalPlus's time limit of an input, max(1 s, 4 x the canonical time): 1 s on each of these
    slow = task.prompt + "import time\ndef similar_elements(a, b):\n    time.sleep(1.5)\n    return tuple(set(a) & set(b))\n"
    results = sandbox.run([task.execution_request(p, Limits()) for p in (wrong, fake, slow)])
    assert [r.status for r in results] == [Status.failed, Status.failed, Status.timeout]
    assert 0 < results[0].fraction_passed < 1  # the inputs with one empty list still pass
    assert results[1].num_passed == 0
    # the tester stops waiting at the first input's limit; the program, still in that call, answers no more
    assert "CallTimedOut: no answer within the test's time limit of 1.00 s" in results[2].tests[0].error
    assert results[2].num_passed == 0 and "no longer running" in results[2].tests[1].error


def test_mbpp_plus_120_assertions_need_math(sandbox, shared_data):
    """The data's own `assertion` field (not used for scoring): Mbpp/120's calls math.isclose
    without importing math; with `import math` in the test setup the canonical solution passes."""
    from sandbox_pool import ExecutionRequest, Limits, Status

    with gzip.open(shared_data / MBPP_PLUS, "rt") as f:
        record = next(r for r in map(json.loads, f) if r["task_id"] == "Mbpp/120")
    request = ExecutionRequest(program=record["prompt"] + record["canonical_solution"], tests=[record["assertion"]],
                               test_setup="import math", limits=Limits())
    with_math, without = sandbox.run([request, request.model_copy(update={"test_setup": ""})])
    assert with_math.status == Status.passed
    assert without.status == Status.failed and "NameError" in str(without.tests[0].error)


def test_eval_sets_name_existing_files(shared_data):
    # the competitive-programming sets' files are not in the shared data (their loaders are tested
    # on fixtures: tests/test_tasksets_competitive.py)
    for name, spec in EVAL_SETS.items():
        if name not in ("apps", "codecontests", "taco", "livecodebench"):
            assert (shared_data / spec.file).exists(), name
