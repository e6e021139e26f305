"""Reward components a domain plugs in (reward_service/components.py): their scores in the total
and on the tokens they blame, their failures as errors naming them, and the shipped example (the
data-flow match with the reference, reward_service/dataflow.py). The pool is the scorer tests'
stand-in (pure logic); tests/test_end_to_end.py runs a component through a real training run."""
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from test_reward_scorer import ScriptedPool

from coderloo.config import ConfigError, load_config
from coderloo.tasksets.synthetic import synthetic_suite
from common.hf import load_tokenizer
from reward_service.attribution import token_end_offsets, token_rewards
from reward_service.components import ComponentError, ComponentSpec, Score, Scored
from reward_service.dataflow import _characters, dataflow_match
from reward_service.schemas import Diagnostic
from reward_service.scorer import RewardScorer, analyse
from reward_service.weights import RewardWeights
from sandbox_pool import ExecutionResult, Limits, Status

ROOT = Path(__file__).resolve().parent.parent
TASK = synthetic_suite()["train"][0]  # prompt: 'def solve(x):\n    """Return x plus 1."""\n'
RIGHT = TASK.reference[len(TASK.prompt):]
RELEASE = threading.Event()


def passed_share(item: Scored) -> float:
    return item.result.fraction_passed


CALLS = []


def knows_nothing(item: Scored):
    CALLS.append(item.completion)
    return None


def blames_the_return(item: Scored, score: float = 0.25) -> Score:
    """A quarter of the score, the rest blamed on the program's `return` keyword."""
    row = item.program.splitlines().index(next(line for line in item.program.splitlines() if "return" in line)) + 1
    column = item.program.splitlines()[row - 1].index("return") + 1
    return Score(score, [Diagnostic(code="test", message="here", row=row, column=column, end_row=row, end_column=column + 6)])


def raises(item: Scored):
    raise KeyError("no such simulator")


def hangs(item: Scored):
    RELEASE.wait(30)
    return 1.0


def says(item: Scored, value=None):
    return value


def spec(function, weight=0.5, **kw) -> ComponentSpec:
    return ComponentSpec(name=function.__name__, path=f"test_reward_components:{function.__name__}", weight=weight, **kw)


def score(components, statuses=(Status.passed, Status.failed), completions=(RIGHT, "    return None\n")):
    scorer = RewardScorer(ScriptedPool(statuses), Limits(), RewardWeights(), components)
    return scorer.score([TASK] * len(completions), list(completions))


def test_a_components_weighted_score_is_in_the_total_and_none_adds_nothing():
    CALLS.clear()
    right, wrong, again = score([spec(passed_share, weight=0.5), spec(knows_nothing, weight=3.0)],
                                completions=(RIGHT, "    return None\n", RIGHT))
    assert sorted(CALLS) == sorted([RIGHT, "    return None\n"])  # once per distinct completion of a task
    assert again == right
    assert right.components.domain == {"passed_share": 1.0, "knows_nothing": None}
    assert wrong.components.domain == {"passed_share": 0.0, "knows_nothing": None}
    assert right.total == pytest.approx(0.1 + 1.0 + 0.5) and wrong.total == pytest.approx(0.1)
    plain = score([])[0]
    assert plain.components.domain == {} and plain.total == pytest.approx(1.1)


@pytest.mark.parametrize("function, options, message", [
    (raises, {}, r"reward component 'raises' \(test_reward_components:raises\) on task .* raised KeyError: 'no such simulator'"),
    (says, {"value": 1.5}, r"reward component 'says' .* returned the score 1.5, not a number in \[0, 1\]"),
    (says, {"value": float("nan")}, r"returned the score nan, not a number in \[0, 1\]"),
    (says, {"value": True}, r"returned bool, not a score"),
    (says, {"value": "0.5"}, r"returned str, not a score"),
])
def test_a_component_that_fails_is_an_error_naming_it_never_a_zero(function, options, message):
    with pytest.raises(ComponentError, match=message):
        score([spec(passed_share), spec(function, options=options)])


def test_a_component_that_hangs_is_an_error_naming_it():
    try:
        with pytest.raises(ComponentError, match=r"reward component 'hangs' .* did not answer within 0.2 s"):
            score([spec(hangs, timeout_s=0.2)])
    finally:
        RELEASE.set()


def test_components_are_checked_when_the_config_is_read():
    good = load_config("configs/dataflow.yaml").reward.components
    assert [c.name for c in good] == ["dataflow"]
    bad = {
        "[{name: a, path: nowhere.at_all:f, weight: 1}]": "reward.components.0.path: Value error, cannot import 'nowhere.at_all'",
        "[{name: a, path: json:nothing, weight: 1}]": "reward.components.0.path: Value error, 'json' has no 'nothing'",
        "[{name: a, path: json, weight: 1}]": "reward.components.0.path: Value error, 'json' is not module:attribute",
        "[{name: a, path: json:__doc__, weight: 1}]": "reward.components.0.path: Value error, json:__doc__ is not callable",
        "[{name: lint, path: json:loads, weight: 1}]": "reward.components.0.name: Value error, 'lint' is a built-in component",
        "[{name: a, path: json:loads, weight: 0}]": "reward.components.0.weight",
        "[{name: a, path: json:loads, weight: 1}, {name: a, path: json:dumps, weight: 1}]": "components: a named more than once",
    }
    for components, message in bad.items():
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_config("configs/default.yaml", [f"reward.components={components}"])


def test_a_blamed_shortfall_falls_on_the_tokens_that_wrote_the_span(tiny_model):
    """By hand: weight 0.4, score 0.25. Every code token gets its share of the outcome and of the
    component's whole 0.4; the tokens of `return` lose the shortfall 0.4 x 0.75 = 0.3 between them;
    the values sum to the total."""
    tokenizer = load_tokenizer(tiny_model)
    completion = "    return x + 1\n"
    ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    component = spec(blames_the_return, weight=0.4)
    reward = score([component], statuses=(Status.passed,), completions=(completion,))[0]
    assert reward.components.domain == {"blames_the_return": 0.25}
    assert reward.total == pytest.approx(0.1 + 1.0 + 0.4 * 0.25)
    values, penalties = token_rewards(TASK, completion, reward, ids, tokenizer, RewardWeights(), [component])
    ends = token_end_offsets(ids, tokenizer)
    starts = [0] + ends[:-1]
    start, end = completion.index("return"), completion.index("return") + len("return")
    hit = [i for i, (s, e) in enumerate(zip(starts, ends)) if s < end and e > start]
    code = [i for i, (s, e) in enumerate(zip(starts, ends)) if e > s]
    assert hit and len(code) > len(hit)
    spread = (0.1 + 1.0 + 0.4) / len(code)
    for i in code:
        assert values[i] == pytest.approx(spread - (0.3 / len(hit) if i in hit else 0.0)), i
        assert penalties[i] == pytest.approx(-0.3 / len(hit) if i in hit else 0.0), i
    assert sum(values) == pytest.approx(reward.total)
    # without blame, the weighted score is spread like the outcome
    unblamed = spec(passed_share, weight=0.4)
    reward = score([unblamed], statuses=(Status.passed,), completions=(completion,))[0]
    values, penalties = token_rewards(TASK, completion, reward, ids, tokenizer, RewardWeights(), [unblamed])
    assert all(p == 0.0 for p in penalties) and sum(values) == pytest.approx(reward.total) == pytest.approx(1.5)


def test_the_dataflow_example_matches_codebleus_and_blames_the_flows_the_reference_lacks():
    result = ExecutionResult(status=Status.passed, tests=[], num_tests=0, duration_s=0.0)
    task = TASK.model_copy(update={"prompt": "def f(a, b):\n", "reference": (
        "def f(a, b):\n    s = a + b\n    for i in range(b):\n        s = s + i\n    return s\n")})

    def match(program: str) -> Score | None:
        return dataflow_match(Scored(task, "", "", program, result))

    assert match(task.reference) == Score(1.0, [])
    renamed = match("def f(a, b):\n    total = a + b\n    for k in range(b):\n        total = total + k\n    return total\n")
    assert renamed == Score(1.0, [])  # CodeBLEU normalises the names: the same flows
    # the sum is s = a, the loop runs to a: 5 of the reference's 12 flows are there, and the
    # program's own flows that the reference lacks are blamed where their value is received
    wrong = match("def f(a, b):\n    s = a\n    for i in range(a):\n        s = i\n    return s\n")
    assert wrong.value == pytest.approx(5 / 12)
    assert [(d.message, d.row, d.column, d.end_column) for d in wrong.blame] == [
        ("s computedFrom a", 2, 5, 6), ("i computedFrom a, range", 3, 9, 10), ("a comesFrom a", 3, 20, 21),
        ("s computedFrom i", 4, 9, 10)]
    assert _characters(["    é = a"], 0, len("    é = ".encode())) == len("    é = ")  # tree-sitter counts bytes
    assert match(task.reference) is not None and dataflow_match(Scored(
        task.model_copy(update={"reference": ""}), "", "", task.reference, result)) is None  # nothing to compare with
    # every synthetic task's own reference matches itself
    for t in synthetic_suite()["train"][:50]:
        code = t.reference[len(t.prompt):]
        assert dataflow_match(Scored(t, code, code, t.program(code), result)).value == 1.0, t.id


def test_the_dataflow_score_is_the_same_in_every_process():
    """codebleu orders a variable's parents as a set of strings does, by the process's hash seed; the
    example's normalisation does not depend on it (a reward would otherwise differ between replicas)."""
    script = (
        "from coderloo.tasksets.synthetic import synthetic_suite\n"
        "from reward_service.components import Scored\n"
        "from reward_service.dataflow import dataflow_match\n"
        "from sandbox_pool import ExecutionResult, Status\n"
        "task = synthetic_suite()['train'][0].model_copy(update={'prompt': 'def f(a, b):\\n', 'reference': "
        "'def f(a, b):\\n    s = a + b\\n    for i in range(b):\\n        s = s + i\\n    return s\\n'})\n"
        "program = 'def f(a, b):\\n    t = a + b\\n    for k in range(b):\\n        t = t + k\\n    return t\\n'\n"
        "print(dataflow_match(Scored(task, '', '', program, ExecutionResult(status=Status.passed, tests=[], num_tests=0, "
        "duration_s=0.0))).value)\n"
    )
    scores = {subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONHASHSEED": str(seed), "PYTHONPATH": str(ROOT)},
                             capture_output=True, text=True, check=True).stdout.strip() for seed in range(6)}
    assert scores == {"1.0"}


def test_coverage_is_the_share_of_executable_lines_the_tests_ran_and_blames_the_others(tiny_model):
    """By hand: `def solve`, `if`, both returns are the executable lines (the docstring is not); the
    tests ran 3 of them. Weight 0.4: the total adds 0.3, and the tokens of the untested `return 0`
    lose the shortfall 0.1."""
    from reward_service.scorer import coverage, executable_lines

    tokenizer = load_tokenizer(tiny_model)
    completion = "    if x > 0:\n        return x + 1\n    return 0\n"
    program = TASK.prompt + completion
    assert executable_lines(compile(program, "<program>", "exec")) == {1, 3, 4, 5}
    assert coverage(program, None) is None and coverage("def f(:\n", [1]) is None
    covered = coverage(program, [1, 3, 4])
    assert covered.value == 0.75 and [(d.row, d.column, d.end_column) for d in covered.blame] == [(5, 5, 13)]
    weights = RewardWeights(coverage=0.4)
    result = ExecutionResult(status=Status.passed, tests=[{"passed": True}], num_tests=1, duration_s=0.0, lines_executed=[1, 3, 4])
    reward = RewardScorer(None, Limits(), weights).reward(TASK, analyse(TASK, completion), result, None)
    assert reward.components.coverage == 0.75 and reward.components.domain == {}
    assert reward.total == pytest.approx(0.1 + 1.0 + 0.3)
    ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    values, penalties = token_rewards(TASK, completion, reward, ids, tokenizer, weights)
    ends = token_end_offsets(ids, tokenizer)
    start = completion.index("return 0")
    hit = [i for i, (s, e) in enumerate(zip([0] + ends[:-1], ends)) if s < start + len("return 0") and e > start]
    assert hit and all(p == pytest.approx(-0.1 / len(hit)) for i, p in enumerate(penalties) if i in hit)
    assert all(p == 0.0 for i, p in enumerate(penalties) if i not in hit)
    assert sum(values) == pytest.approx(reward.total)
    # off (the default): the sandbox is not asked, and nothing is added
    assert not TASK.execution_request(program, Limits()).coverage and TASK.execution_request(program, Limits(), coverage=True).coverage
    plain = RewardScorer(None, Limits(), RewardWeights()).reward(TASK, analyse(TASK, completion), result, None)
    assert plain.components.coverage is None and plain.total == pytest.approx(1.1)


def test_a_constant_reward_measures_every_component_and_pays_nothing():
    completion = "    return x + 1\n"
    result = ExecutionResult(status=Status.passed, tests=[{"passed": True}], num_tests=1, duration_s=0.0)
    paid = RewardScorer(None, Limits(), RewardWeights()).reward(TASK, analyse(TASK, completion), result, None)
    control = RewardScorer(None, Limits(), RewardWeights(constant=True, syntax=0, functionality=0)).reward(
        TASK, analyse(TASK, completion), result, None)
    assert paid.total == pytest.approx(1.1) and control.total == 0.0
    assert control.passed and control.components == paid.components  # still measured: the control's pass rates are real
    with pytest.raises(ValueError, match="at least one of the syntax and functionality weights must be positive"):
        RewardWeights(syntax=0, functionality=0)
    with pytest.raises(ConfigError, match="reward.weights.constant makes every group uniform"):
        load_config("configs/default.yaml", ["reward.weights.constant=true"])
    with pytest.raises(ConfigError, match="reward.weights.constant with dense rewards"):
        load_config("configs/default.yaml", ["reward.weights.constant=true", "learner.advantage.filter_uninformative=false",
                                             "learner.advantage.dense={}"])
    assert load_config("configs/default.yaml", ["reward.weights.constant=true",
                                                "learner.advantage.filter_uninformative=false"]).reward.weights.constant
