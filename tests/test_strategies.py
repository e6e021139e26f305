"""The rollout strategies' logic, against a scripted rollout group and reward service: single
attempts, refinement's rounds, the feedback prompt, the pass rate by turn, and the config's checks.
The real engines and service run them in tests/test_refine_training.py and the end-to-end test."""
import pytest

from coderloo.config import ConfigError, load_config
from coderloo.tasksets.synthetic import synthetic_suite
from reward_service.extract import extract
from reward_service.schemas import Components, ItemReward
from reward_service.tasks import Task
from rollout_workers import GenerationParams, PromptRollout, Sample
from rollout_workers.config import RefineConfig
from rollout_workers.strategies import Refinement, SingleAttempt, feedback_prompt, pass_rates_by_turn
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


class ScriptedGroup:
    """Each call writes '    return <call number>' for each prompt, one sample per prompt and n."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, params, seed):
        self.calls.append((prompts, params, seed))
        n = len(self.calls)
        return [PromptRollout([n, i], [Sample([7, i], [-0.5, -0.25], f"    return {n}\n", "stop", 3)] * params.n) for i in range(len(prompts))]

    def generate_each(self, prompts, params, seed, done):
        for i, rollout in enumerate(self.generate(prompts, params, seed)):
            done(i, rollout)
        return 0


class ScriptedRewards:
    per_token = False

    def __init__(self, passes):
        self.passes = list(passes)  # per call: passed flags in order
        self.calls = []

    def score(self, tasks, completions):
        self.calls.append(completions)
        return [reward(p) for p in self.passes.pop(0)]

    def submit(self, tasks, completions, token_ids=None):
        return self.score(tasks, completions)

    def collect(self, pending):
        return pending


def test_single_attempt_makes_one_turn_trajectories_in_task_order():
    group, service = ScriptedGroup(), ScriptedRewards([[True, False], [False, False]])
    tasks = synthetic_suite()["train"][:2]
    rollouts = SingleAttempt(group, service).run(tasks, GenerationParams(n=2), seed=5)
    assert [[t.task.id for t in g] for g in rollouts.groups] == [[tasks[0].id] * 2, [tasks[1].id] * 2]
    assert [[t.outcome.passed for t in g] for g in rollouts.groups] == [[True, False], [False, False]]
    first = rollouts.groups[0][0].turns
    assert len(first) == 1 and first[0].prompt_ids == [1, 0] and first[0].token_ids == [7, 0]
    assert first[0].sampler_logprobs == [-0.5, -0.25] and first[0].policy_mask == [True, True] and first[0].policy_version == 3
    assert rollouts.metrics["rollout_retries"] == 0 and group.calls[0][2] == 5


def test_refinement_rewrites_only_failed_trajectories_until_they_pass():
    group, service = ScriptedGroup(), ScriptedRewards([[False, True, False], [True, False], [False]])
    params = GenerationParams(n=3, max_new_tokens=16, temperature=0.7)
    rollouts = Refinement(group, service, RefineConfig(enabled=True, rounds=3)).run([TASK], params, 11)
    # round 2: trajectories 0 and 2, one sample each with round 1's settings; round 3: trajectory 2 only
    assert [len(prompts) for prompts, _, _ in group.calls] == [1, 2, 1]
    # one sample each, and a feedback prompt too long for the engine loses its start, not the task
    assert group.calls[1][1] == GenerationParams(n=1, max_new_tokens=16, temperature=0.7, truncate_prompt_left=True)
    assert len({seed for _, _, seed in group.calls}) == 3  # each round samples with its own seed
    assert "#     return 2\n" in group.calls[2][0][0]  # round 3 is told about round 2's attempt
    trajectories = rollouts.groups[0]
    assert [len(t.turns) for t in trajectories] == [2, 1, 3]
    assert trajectories[0].turns[1].prompt_ids == [2, 0] and trajectories[0].outcome.passed  # the outcome is the last attempt's
    assert [t.reward.passed for t in trajectories[2].turns] == [False, False, False] and not trajectories[2].outcome.passed
    assert [rollouts.metrics[f"pass@1_round{r}"] for r in (1, 2, 3)] == pytest.approx([1 / 3, 2 / 3, 2 / 3])
    assert rollouts.metrics["rounds_mean"] == 2.0


def test_pass_rates_by_turn_count_a_pass_from_its_turn_on():
    group, service = ScriptedGroup(), ScriptedRewards([[False, True]])
    trajectories = SingleAttempt(group, service).run([TASK], GenerationParams(n=2), None).groups[0]
    assert pass_rates_by_turn(trajectories, 3) == [0.5, 0.5, 0.5]
    trajectories[0].turns.append(trajectories[1].turns[0])  # a second turn that passed
    assert pass_rates_by_turn(trajectories, 2) == [0.5, 1.0]


def test_refine_config_checks():
    assert load_config("configs/default.yaml", []).refine.enabled is False
    with pytest.raises(ConfigError, match="refine.enabled and learner.dense_rewards are not supported together"):
        load_config("configs/default.yaml", ["refine.enabled=true", "learner.dense_rewards=true"])
    with pytest.raises(ConfigError, match="refine: .*rounds=1: refinement needs at least 2"):
        load_config("configs/default.yaml", ["refine.enabled=true", "refine.rounds=1"])
    with pytest.raises(ConfigError, match="refine.feedback_chars"):
        load_config("configs/default.yaml", ["refine.feedback_chars=0"])


def test_evaluation_follows_the_eval_config():
    from coderloo.config import EvalConfig
    from coderloo.evaluation import evaluate

    heldout = synthetic_suite()["heldout"]
    tasks = [next(t for t in heldout if t.difficulty == level) for level in (1, 2)]  # two families, two levels
    breakdown = {"by_difficulty": {"1": 1.0, "2": 0.0}, "by_family": {tasks[0].family: 1.0, tasks[1].family: 0.0},
                 "by_kind": {"assert": 0.5}}

    def evaluate_with(config, passes):
        group, service = ScriptedGroup(), ScriptedRewards(passes)
        return evaluate(Refinement(group, service, RefineConfig(enabled=True, rounds=2)), tasks, config, 16, []), group

    # sampled only: two samples per task; one failed sample is rewritten and passes
    metrics, group = evaluate_with(EvalConfig(samples_per_task=2, k=[1, 2], greedy=False), [[True, False], [False, False], [True, False, False]])
    assert metrics == {"pass@1": 0.5, "pass@2": 0.5, "pass@1_round1": 0.25, "pass@1_round2": 0.5, **breakdown}
    assert [params.temperature for _, params, _ in group.calls] == [1.0, 1.0]
    # greedy only (eval.sampled false): one greedy trajectory per task, no pass@k
    metrics, group = evaluate_with(EvalConfig(sampled=False), [[True], [False], [False]])
    assert metrics == {"greedy_pass@1": 0.5, **breakdown} and group.calls[0][1].temperature == 0.0
