"""Refinement's pure parts: the feedback prompt, the rounds (against a scripted model and reward
service), the pass rate by round, a trajectory's outcome, and the config's checks."""
import pytest

from coderloo.config import ConfigError, load_config
from coderloo.pipeline import StepRollouts
from coderloo.refine import RefineConfig, Round, feedback_prompt, pass_rates_by_round, refine
from coderloo.tasksets.synthetic import synthetic_suite
from coderloo.tasksets.task import Task
from reward_service.extract import extract
from reward_service.schemas import Components, ItemReward
from rollout_workers import GenerationParams, PromptRollout, Sample
from sandbox_pool import Status

TASK = synthetic_suite()["train"][0]  # prompt_is_code: def solve(x): + docstring
FEEDBACK = "1 of 5 tests failed\nfirst failing test: assert solve(-7) == -6\nAssertionError"


def reward(passed: bool, feedback: str = FEEDBACK) -> ItemReward:
    components = Components(syntax=1.0, functionality=float(passed), lint=None, performance=None)
    return ItemReward(components=components, total=float(passed), passed=passed, status=Status.passed if passed else Status.failed,
                      diagnostics=[], feedback="" if passed else feedback, token_rewards=None)


def test_feedback_prompt_of_a_code_task_comments_the_attempt_and_ends_with_the_task_prompt():
    prompt = feedback_prompt(TASK, "    return x - 1\n```\nThat should do.", FEEDBACK, 500)
    header, rest = prompt.split("\n\n", 1)
    assert rest == TASK.prompt  # the model continues the task's code, as in round 1
    assert all(line.startswith("#") for line in header.splitlines())
    # the previous program (prompt + extracted code, without the prose after the fence) and the feedback
    assert "#     return x - 1\n# What running it said:\n# 1 of 5 tests failed\n" in prompt
    assert "That should do" not in prompt
    assert "# first failing test: assert solve(-7) == -6\n# AssertionError\n# Write it again, fixed.\n" in prompt
    # the rewrite is scored as a plain completion of the task
    assert compile(prompt + "    return x + 1\n", "<refined>", "exec")
    assert TASK.program(extract("    return x + 1\n", TASK.prompt_is_code).code) == TASK.reference


def test_feedback_prompt_cuts_the_feedback_and_keeps_a_prose_tasks_format():
    task = Task(id="prose/1", prompt="Write a function add(a, b).\n[BEGIN]\n", tests=["assert add(1, 2) == 3"], entry_point="add",
                reference="def add(a, b):\n    return a + b\n", difficulty=1, source="test", prompt_is_code=False)
    prompt = feedback_prompt(task, "Sure:\n```python\ndef add(a, b):\n    return a - b\n```\n", "x" * 50, 10)
    assert prompt.endswith("\n\n" + task.prompt)
    assert "# def add(a, b):\n#     return a - b\n" in prompt and "Sure" not in prompt
    assert "# xxxxxxxxxx [...]\n" in prompt and "x" * 11 not in prompt
    with pytest.raises(ValueError, match="feedback chars must be at least 1, got 0"):
        feedback_prompt(task, "", "", 0)


class ScriptedModel:
    """Writes 'attempt <n>' for each prompt; passes are decided by the scripted reward service."""

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, params, seed):
        self.calls.append((prompts, params, seed))
        return [PromptRollout([len(self.calls), i], [Sample([7], [-0.5], f"    return {len(self.calls)}\n", "stop", 3)]) for i in range(len(prompts))]


class ScriptedRewards:
    def __init__(self, passes):
        self.passes = list(passes)  # per call: passed flags in order
        self.calls = []

    def score(self, tasks, completions):
        self.calls.append(completions)
        return [reward(p) for p in self.passes.pop(0)]


def test_refine_rewrites_only_failed_trajectories_until_they_pass():
    model, service = ScriptedModel(), ScriptedRewards([[True, False], [False]])
    params = GenerationParams(n=4, max_new_tokens=16, temperature=0.7)
    first = [reward(False), reward(True), reward(False)]
    later = refine(model, service, [TASK] * 3, ["    return 0\n"] * 3, first, RefineConfig(enabled=True, rounds=3), params, 11)
    # round 2: trajectories 0 and 2, one sample each with round 1's settings; round 3: trajectory 2 only
    assert [len(prompts) for prompts, _, _ in model.calls] == [2, 1]
    # one sample each, and a feedback prompt too long for the engine loses its start, not the task
    assert model.calls[0][1] == GenerationParams(n=1, max_new_tokens=16, temperature=0.7, truncate_prompt_left=True)
    assert model.calls[0][2] != model.calls[1][2]  # each round samples with its own seed
    assert "#     return 1\n" in model.calls[1][0][0]  # round 3 is told about round 2's attempt
    assert [len(t) for t in later] == [1, 0, 2]
    assert later[0][0].reward.passed and later[0][0].prompt_ids == [1, 0]
    assert [r.reward.passed for r in later[2]] == [False, False]
    assert pass_rates_by_round(first, later, 3) == pytest.approx([1 / 3, 2 / 3, 2 / 3])


def test_a_trajectorys_outcome_is_its_last_attempt():
    samples = [Sample([1], [0.0], "a", "stop", 0), Sample([2], [0.0], "b", "stop", 0)]
    tasks = synthetic_suite()["train"][:1]
    batch = StepRollouts(1, tasks, [PromptRollout([0], samples)], [[reward(False), reward(True)]])
    assert [r.passed for r in batch.final_rewards()] == [False, True]  # no refinement: the samples
    batch.later = [[Round([5], samples[0], reward(False)), Round([6], samples[0], reward(True))], []]
    assert [r.passed for r in batch.final_rewards()] == [True, True]
    assert batch.pass_rates_by_round(3) == [0.5, 0.5, 1.0]


def test_refine_config_checks():
    assert load_config("configs/default.yaml", []).refine.enabled is False
    with pytest.raises(ConfigError, match="refine.enabled and learner.dense_rewards are not supported together"):
        load_config("configs/default.yaml", ["refine.enabled=true", "learner.dense_rewards=true"])
    with pytest.raises(ConfigError, match="refine: .*rounds=1: refinement needs at least 2"):
        load_config("configs/default.yaml", ["refine.enabled=true", "refine.rounds=1"])
    with pytest.raises(ConfigError, match="refine.feedback_chars"):
        load_config("configs/default.yaml", ["refine.feedback_chars=0"])
