"""The rollout strategies' logic against a scripted rollout group, reward service and a character
tokenizer (pure logic): single attempts; multi-turn trajectories in each environment (contexts that
extend each other, observations, limits, tool calls, shown and held tests); the concatenated
training sequence; the per-turn cost; evaluation; the config's checks. The real engines, service and
sandbox run them in tests/test_multi_turn.py."""
import pytest
import torch

from coderloo.config import ConfigError, load_config
from coderloo.tasksets.synthetic import synthetic_suite
from learner.algorithm import build_batch, concatenated, to_sequences
from learner.config import LearnerConfig
from reward_service.schemas import Components, ItemReward, RunResult
from reward_service.tasks import Task
from rollout_workers import GenerationParams, PromptRollout, Sample
from rollout_workers.config import InterpreterEnv, env_config
from rollout_workers.environments import Interpreter, Refine
from rollout_workers.strategies import MultiTurn, SingleAttempt, pass_rates_by_turn
from rollout_workers.types import Trajectory, Turn
from sandbox_pool import IOTest, Status

TASK = synthetic_suite()["train"][0]  # prompt_is_code: def solve(x): + docstring
FEEDBACK = "1 of 2 tests failed\nfirst failing test: assert solve(17) == 18\nAssertionError"
EOS = 0


class CharTokenizer:
    """One token per character (id = code point + 1; 0 is EOS): contexts are readable in tests."""

    eos_token_id, eos_token, chat_template = EOS, "", None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) + 1 for c in text]}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i - 1) for i in ids if i != EOS)


TOKENIZER = CharTokenizer()


def reward(passed: bool, feedback: str = FEEDBACK) -> ItemReward:
    components = Components(syntax=1.0, functionality=float(passed), lint=None, performance=None)
    return ItemReward(components=components, total=float(passed), passed=passed, status=Status.passed if passed else Status.failed,
                      diagnostics=[], feedback="" if passed else feedback, token_rewards=None)


class ScriptedGroup:
    """Call i answers every prompt with `texts[i]` (a text, or (text, stop sequence)); token ids by the
    character tokenizer, then EOS unless it ended at a stop sequence."""

    def __init__(self, texts=None, context=10_000):
        self.texts, self.calls, self.context = texts, [], context

    def context_length(self):
        return self.context

    def generate_each(self, prompts, params, seed, done):
        self.calls.append((prompts, params, seed))
        n = len(self.calls)
        entry = f"    return {n}\n" if self.texts is None else self.texts[min(n, len(self.texts)) - 1]
        text, stop = entry if isinstance(entry, tuple) else (entry, None)
        for i, prompt in enumerate(prompts):
            ids = prompt if isinstance(prompt, list) else TOKENIZER(prompt)["input_ids"]
            tokens = TOKENIZER(text)["input_ids"] + ([] if stop else [EOS])
            done(i, PromptRollout(list(ids), [Sample(tokens, [-0.5] * len(tokens), text, "stop", 3, stop)] * params.n))
        return 0


class ScriptedRewards:
    per_token = False

    def __init__(self, passes=(), runs=None, shown=None):
        self.passes = list(passes)  # per score call by the held tests: passed flags in order
        self.shown = list(shown or [])  # the same for the calls on shown tests (Task.examples()); none given: failed
        self.calls, self.run_calls, self.shown_calls = [], [], []
        self.runs = runs
        self.held = {}

    def score(self, tasks, completions):
        if all(t.id in self.held and t.tests == self.held[t.id].shown and not t.public_tests for t in tasks):
            self.shown_calls.append((tasks, completions))
            return [reward(p) for p in (self.shown.pop(0) if self.shown else [False] * len(tasks))]
        self.held.update((t.id, t) for t in tasks)
        self.calls.append((tasks, completions))
        return [reward(p) for p in self.passes.pop(0)]

    def submit(self, tasks, completions, token_ids=None):
        return self.score(tasks, completions)

    def collect(self, pending):
        return pending

    def run(self, tasks, programs):
        self.run_calls.append(programs)
        return [RunResult(status=Status.passed, stdout=self.runs or "4\n", stderr="", exit="exited normally", duration_s=0.01)
                for _ in programs]


def multi_turn(env_class, group, service, **config):
    config = env_config(name={Refine: "refine", Interpreter: "interpreter"}[env_class], **config)
    return MultiTurn(group, env_class(service, config), config, TOKENIZER)


def test_single_attempt_makes_one_turn_trajectories_in_task_order():
    group, service = ScriptedGroup(), ScriptedRewards([[True, False], [False, False]])
    tasks = synthetic_suite()["train"][:2]
    rollouts = SingleAttempt(group, service).run(tasks, GenerationParams(n=2), seed=5)
    assert [[t.task.id for t in g] for g in rollouts.groups] == [[tasks[0].id] * 2, [tasks[1].id] * 2]
    assert [[t.outcome.passed for t in g] for g in rollouts.groups] == [[True, False], [False, False]]
    first = rollouts.groups[0][0].turns
    assert len(first) == 1 and first[0].token_ids[-1] == EOS and first[0].policy_version == 3
    assert first[0].policy_mask == [True] * len(first[0].token_ids)
    assert rollouts.metrics["rollout_retries"] == 0 and group.calls[0][2] == 5


def test_refinement_goes_on_only_after_a_failed_attempt_and_each_context_extends_the_last():
    group, service = ScriptedGroup(), ScriptedRewards([[False, True, False], [True, False], [False]])
    params = GenerationParams(n=3, max_new_tokens=16, temperature=0.7)
    rollouts = multi_turn(Refine, group, service, max_turns=3).run([TASK], params, 11)
    # round 2: trajectories 0 and 2, one sample each with round 1's settings; round 3: trajectory 2 only
    assert [len(prompts) for prompts, _, _ in group.calls] == [1, 2, 1]
    assert group.calls[1][1] == GenerationParams(n=1, max_new_tokens=16, temperature=0.7)
    assert len({seed for _, _, seed in group.calls}) == 3  # each round samples with its own seed
    trajectories = rollouts.groups[0]
    assert [len(t.turns) for t in trajectories] == [2, 1, 3]
    for t in trajectories:
        for before, after in zip(t.turns, t.turns[1:]):
            start = before.prompt_ids + before.token_ids
            assert after.prompt_ids[: len(start)] == start  # the context is never re-tokenized
            observation = TOKENIZER.decode(after.prompt_ids[len(start):])
            # the feedback as comment lines, then the task's prompt again, which the next turn continues
            assert observation == ("\n# What running the code above said:\n# 1 of 2 tests failed\n"
                                   "# first failing test: assert solve(17) == 18\n# AssertionError\n# Write it again, fixed.\n" + TASK.prompt)
    assert trajectories[0].outcome.passed and trajectories[0].outcome is trajectories[0].turns[-1].reward  # the last attempt's
    assert [t.reward.passed for t in trajectories[2].turns] == [False, False, False] and not trajectories[2].outcome.passed
    assert [rollouts.metrics[f"pass@1_round{r}"] for r in (1, 2, 3)] == pytest.approx([1 / 3, 2 / 3, 2 / 3])
    assert rollouts.metrics["turns_mean"] == 2.0 and rollouts.metrics["tool_calls_mean"] == 0
    assert service.calls[1][1] == ["    return 2\n"] * 2  # each attempt is scored as a completion of the task
    # the feedback of the failed ones that go on is from a run on the shown tests
    assert [(len(tasks), tasks[0].tests) for tasks, _ in service.shown_calls] == [(2, TASK.shown), (1, TASK.shown)]


def test_a_group_is_handed_on_after_the_round_its_last_trajectory_ended_in():
    """Partial rollouts take a multi-turn group as soon as its k trajectories have all ended."""
    group, service = ScriptedGroup(), ScriptedRewards([[True, True, False, True], [True]])
    other = TASK.model_copy(update={"id": "other"})
    handed = []
    rollouts = multi_turn(Refine, group, service, max_turns=3).run(
        [TASK, other], GenerationParams(n=2), 1, done=lambda i, g, _: handed.append((i, len(group.calls), g)))
    assert [(i, calls) for i, calls, _ in handed] == [(0, 1), (1, 2)]  # the first before round 2 was generated
    for i, _, g in handed:
        assert [(t.task.id, len(t.turns), t.outcome.passed) for t in g] == \
               [(t.task.id, len(t.turns), t.outcome.passed) for t in rollouts.groups[i]]


def test_an_observation_is_cut_with_a_marker_and_a_trajectory_ends_where_its_next_turn_would_not_fit():
    service = ScriptedRewards([[False], [False]])
    long_feedback = ScriptedRewards([[False]])
    long_feedback.score = lambda tasks, completions: [reward(False, "x" * 400) for _ in completions]
    rollouts = multi_turn(Refine, ScriptedGroup(), long_feedback, max_turns=2, observation_tokens=20, feedback_chars=1000).run(
        [TASK], GenerationParams(n=1, max_new_tokens=16), 0)
    turns = rollouts.groups[0][0].turns
    observation = TOKENIZER.decode(turns[1].prompt_ids[len(turns[0].prompt_ids) + len(turns[0].token_ids):])
    assert "[... " in observation and "more tokens cut]" in observation and observation.endswith(TASK.prompt)
    assert rollouts.metrics["observations_cut_mean"] == 1
    # a context limit that leaves no room for a second turn: the trajectory ends on its first, scored as final
    first_len = len(TOKENIZER(TASK.prompt)["input_ids"]) + len("    return 1\n") + 1
    rollouts = multi_turn(Refine, ScriptedGroup(context=first_len + 40), service, max_turns=3).run(
        [TASK], GenerationParams(n=1, max_new_tokens=16), 0)
    t = rollouts.groups[0][0]
    assert len(t.turns) == 1 and t.outcome is not None and rollouts.metrics["at_token_limit_fraction"] == 1.0
    assert len(service.calls) == 2  # scored, then ended as final


def test_the_interpreter_runs_a_turn_that_ends_at_the_marker_and_scores_the_answer():
    config = dict(max_turns=3, max_tool_calls=1)
    marker = InterpreterEnv().run_marker
    probe = ("    return x + 1\nprint(solve(3))\n", marker)
    group, service = ScriptedGroup([probe, probe]), ScriptedRewards([[True]], runs="4\n")
    strategy = multi_turn(Interpreter, group, service, **config)
    rollouts = strategy.run([TASK], GenerationParams(n=1, max_new_tokens=32, stop=["\ndef ", "\nprint("]), 0)
    # the marker stops a turn, and a probe may print at the start of a line
    assert group.calls[0][1].stop == [marker, "\ndef "]
    assert service.run_calls == [[TASK.prompt + "    return x + 1\nprint(solve(3))\n"]]  # the program, with no tests
    t = rollouts.groups[0][0]
    assert len(t.turns) == 2 and t.turns[0].reward is None  # a tool call is not scored
    observation = TOKENIZER.decode(t.turns[1].prompt_ids[len(t.turns[0].prompt_ids) + len(t.turns[0].token_ids):])
    assert observation == "\n# stdout:\n# 4\n# exit: exited normally\n# No runs left: write the answer.\n" + TASK.prompt
    # with no runs left, a turn at the marker is the answer: scored by the tests (the text before the marker)
    assert service.calls[0][1] == ["    return x + 1\nprint(solve(3))\n"] and t.outcome.passed
    assert rollouts.metrics["tool_calls_mean"] == 1 and "pass@1_round1" not in rollouts.metrics


def test_the_critic_chooses_which_failed_attempts_are_refined_within_the_budget_per_round():
    other = TASK.model_copy(update={"id": "other"})
    # round 1: task 0's third sample passes, the other five fail; round 2: of the two chosen, task 1's passes
    group, service = ScriptedGroup(), ScriptedRewards([[False, False, True, False, False, False], [False, True], [False]])
    asked = []

    def score(prompts, completions):
        asked.append((prompts, completions))
        return [0.1, 0.7, 0.3, 0.2, 0.9]  # task 0's samples 0 and 1, task 1's 0, 1 and 2

    config = env_config(name="refine", max_turns=3, per_round=1, choose="critic")
    rollouts = MultiTurn(group, Refine(service, config), config, TOKENIZER, score=score).run([TASK, other], GenerationParams(n=3), 3)
    assert [len(prompts) for prompts, _, _ in group.calls] == [2, 2, 1]  # one refined per task, then the one left
    assert [[len(t.turns) for t in g] for g in rollouts.groups] == [[1, 3, 1], [1, 1, 2]]
    assert [[t.outcome.passed for t in g] for g in rollouts.groups] == [[False, False, True], [False, False, True]]
    unchosen = rollouts.groups[0][0]
    assert unchosen.outcome is unchosen.turns[0].reward  # it ends on the attempt it has
    assert rollouts.metrics["unchosen_fraction"] == pytest.approx(3 / 6)
    # asked once, in round 1 (round 2 has one failed attempt, within the budget), of each failed attempt's latest turn
    assert len(asked) == 1 and len(asked[0][0]) == 5
    assert [len(tasks) for tasks, _ in service.shown_calls] == [2, 1]  # feedback runs for the chosen ones only
    first = rollouts.groups[0][1].turns[0]
    assert asked[0][0][1] == first.prompt_ids and asked[0][1][1] == first.token_ids


def test_refinement_without_a_budget_refines_every_failed_attempt_and_a_random_choice_follows_the_seed():
    def run(seed, **fields):
        config = env_config(name="refine", max_turns=2, **fields)
        service = ScriptedRewards([[False] * 4, [False] * (fields.get("per_round") or 4)])
        return MultiTurn(ScriptedGroup(), Refine(service, config), config, TOKENIZER).run([TASK], GenerationParams(n=4), seed)

    assert [len(t.turns) for t in run(0).groups[0]] == [2, 2, 2, 2] and run(0).metrics["unchosen_fraction"] == 0
    chosen = [[len(t.turns) for t in run(seed, per_round=2).groups[0]] for seed in (0, 0, 1, 2, 3)]
    assert all(sorted(turns) == [1, 1, 2, 2] for turns in chosen)
    assert chosen[0] == chosen[1] and len({tuple(c) for c in chosen}) > 1  # the seed's choice, not always the same
    config = env_config(name="refine", per_round=2, choose="critic")
    with pytest.raises(ValueError, match="env.choose critic: refinement needs the critic's scores"):
        MultiTurn(ScriptedGroup(), Refine(ScriptedRewards(), config), config, TOKENIZER)
    with pytest.raises(ConfigError, match="env.choose critic: the critic chooses which failed attempts are refined, and critic.enabled is false"):
        load_config("configs/refine.yaml", ["env.per_round=2", "env.choose=critic"])
    assert load_config("configs/refine.yaml", ["env.per_round=2", "env.choose=critic", "critic.enabled=true"]).env.choose == "critic"


def test_refinement_feedback_comes_from_the_shown_tests_and_says_only_how_the_held_ones_ended():
    cases = [IOTest(stdin=f"{i}\n", stdout=f"{i + 1}\n") for i in range(4)]
    task = Task(id="io/1", prompt="Read n, print n + 1.\n", tests=cases, public_tests=1, reference="print(int(input()) + 1)\n",
                prompt_is_code=False, entry_point=None, difficulty=1, source="test")
    bare = task.model_copy(update={"id": "io/2", "public_tests": 0})
    # round 1: both fail the held tests; the shown case fails too. Round 2: the shown case passes, the held ones not
    service = ScriptedRewards([[False, False], [False, False], [False, False]], shown=[[False], [True]])
    rollouts = multi_turn(Refine, ScriptedGroup(), service, max_turns=3).run([task, bare], GenerationParams(n=1), 0)
    assert [[t.tests for t in tasks] for tasks, _ in service.shown_calls] == [[cases[:1]], [cases[:1]]]  # never bare's
    said = []
    for g in rollouts.groups:
        turns = g[0].turns
        said.append([TOKENIZER.decode(after.prompt_ids[len(before.prompt_ids) + len(before.token_ids):])
                     for before, after in zip(turns, turns[1:])])
    assert "first failing test: assert solve(17) == 18" in said[0][0]  # the shown run's own feedback
    assert said[0][1].startswith("\n# What running the code above said:\n# Passed the shown tests (1). "
                                 "The held tests (3, not shown): some did not pass\n")
    assert said[1] == ["\n# What running the code above said:\n# The held tests (4, not shown): some did not pass\n"
                       "# Write it again, fixed.\n" + task.prompt] * 2  # a task that shows none: how the held ones ended
    assert all(len(g[0].turns) == 3 and not g[0].outcome.passed for g in rollouts.groups)


def test_refinement_that_goes_on_by_the_shown_tests_submits_the_first_attempt_that_passes_them():
    cases = [IOTest(stdin=f"{i}\n", stdout=f"{i + 1}\n") for i in range(4)]
    task = Task(id="io/1", prompt="Read n, print n + 1.\n", tests=cases, public_tests=1, reference="print(int(input()) + 1)\n",
                prompt_is_code=False, entry_point=None, difficulty=1, source="test")
    bare = task.model_copy(update={"id": "io/2", "public_tests": 0})
    # round 1: all four attempts fail the held tests; of task's two, the first passes the shown case (it is the
    # answer, wrong as it is) and the second not. Round 2: the second passes every test.
    service = ScriptedRewards([[False] * 4, [True]], shown=[[True, False]])
    rollouts = multi_turn(Refine, ScriptedGroup(), service, max_turns=3, go_on="shown").run([task, bare], GenerationParams(n=2), 0)
    assert [[t.id for t in tasks] for tasks, _ in service.shown_calls] == [["io/1", "io/1"]]  # bare shows none: not run
    (submitted, refined), alone = rollouts.groups
    assert len(submitted.turns) == 1 and not submitted.outcome.passed  # the held tests decided nothing it was told
    assert [len(t.turns) for t in alone] == [1, 1]  # a task that shows no tests gets one attempt
    assert len(refined.turns) == 2 and refined.outcome.passed
    said = TOKENIZER.decode(refined.turns[1].prompt_ids[len(refined.turns[0].prompt_ids) + len(refined.turns[0].token_ids):])
    assert "first failing test: assert solve(17) == 18" in said and "held" not in said  # the shown run's feedback alone
    assert rollouts.metrics["pass@1_round1"] == 0.0 and rollouts.metrics["pass@1_round2"] == pytest.approx(1 / 4)


def test_attempts_without_feedback_are_sampled_afresh_from_the_prompt_under_the_same_rule():
    service = ScriptedRewards([[False, False], [False], [True]], shown=[[True, False], [False]])
    group = ScriptedGroup()
    trajectories = multi_turn(Refine, group, service, max_turns=3, go_on="shown", feedback="none").run(
        [TASK], GenerationParams(n=2), 5).groups[0]
    assert [len(t.turns) for t in trajectories] == [1, 3]
    first = trajectories[1].turns[0].prompt_ids
    assert [turn.prompt_ids for turn in trajectories[1].turns] == [first] * 3  # the prompt alone, each time
    assert [p for p, _, _ in group.calls[1:]] == [[first], [first]] and len({s for _, _, s in group.calls}) == 3
    assert trajectories[1].outcome.passed
    for fresh in ("none", "note"):
        with pytest.raises(ConfigError, match=f"feedback {fresh} samples each attempt afresh.*train_as must be turns"):
            load_config("configs/default.yaml", ["env.name=refine", f"env.feedback={fresh}", "env.train_as=concat"])


def test_a_note_prompts_the_task_afresh_with_what_the_run_said_and_not_the_failed_code():
    service = ScriptedRewards([[False], [False], [True]], shown=[[False], [False]])
    group = ScriptedGroup(["    return 1\n", "    return 2\n", "    return 3\n"])
    trajectory = multi_turn(Refine, group, service, max_turns=3, go_on="shown", feedback="note").run(
        [TASK], GenerationParams(n=1), 5).groups[0][0]
    assert len(trajectory.turns) == 3 and trajectory.outcome.passed
    read = [TOKENIZER.decode(turn.prompt_ids) for turn in trajectory.turns]
    note = "# An earlier answer to this failed. What running it said:\n" + "".join(f"# {line}\n" for line in FEEDBACK.splitlines())
    assert read[1] == read[2] == note + "# Write a correct solution.\n" + TASK.prompt  # the last run's words, then the task
    assert "return 1" not in read[1] and "return 2" not in read[2]  # never the code that failed


def test_a_concatenated_trajectory_masks_its_observations():
    group, service = ScriptedGroup(), ScriptedRewards([[False], [True]])
    trajectory = multi_turn(Refine, group, service, max_turns=2).run([TASK], GenerationParams(n=1), 0).groups[0][0]
    first, second = trajectory.turns
    seq = concatenated(trajectory)
    assert seq.prompt_ids == first.prompt_ids
    assert seq.prompt_ids + seq.completion_ids == second.prompt_ids + second.token_ids
    observation = len(second.prompt_ids) - len(first.prompt_ids) - len(first.token_ids)
    assert seq.mask == [True] * len(first.token_ids) + [False] * observation + [True] * len(second.token_ids)
    assert seq.sampler_logprobs == first.sampler_logprobs + [0.0] * observation + second.sampler_logprobs
    samples = to_sequences([[trajectory]], concat=True)
    assert len(samples.flat()) == 1 and samples.turn_counts.tolist() == [[2]]
    assert len(to_sequences([[trajectory]]).flat()) == 2  # as turns: each with its whole context
    second.prompt_ids = [second.prompt_ids[0] + 1] + second.prompt_ids[1:]  # a strategy that rewrote its prompt
    with pytest.raises(ValueError, match="turn 2's context does not continue turn 1's"):
        concatenated(trajectory)


def test_the_turn_cost_is_paid_per_turn_after_the_first():
    def trajectory(turns, passed):
        turn = Turn([1], [2, 3], [-0.1, -0.1], [True, True], 0, "x")
        return Trajectory(TASK, [turn] * turns, reward(passed))

    groups = [[trajectory(1, True), trajectory(3, True), trajectory(2, False)]]
    config = LearnerConfig(advantage={"normalize": False, "filter_uninformative": False})
    free = build_batch(to_sequences(groups), config, step=1)
    paid = build_batch(to_sequences(groups), config, step=1, turn_cost=0.1)
    assert free.rewards.tolist() == [[1.0, 1.0, 0.0]]
    assert paid.rewards[0].tolist() == pytest.approx([1.0, 0.8, -0.1]) and paid.metrics["turn_cost_mean"] == pytest.approx(0.1)
    # every policy token of a trajectory carries its advantage: the dawdler's is below the direct pass's
    first, dawdler = paid.groups[0][0].advantages[0], paid.groups[0][1].advantages[0]
    assert first > dawdler and all(seq.advantages == [dawdler] * 2 for seq in paid.groups[0][1:4])


def test_pass_rates_by_turn_count_a_pass_from_its_turn_on():
    group, service = ScriptedGroup(), ScriptedRewards([[False, True]])
    trajectories = SingleAttempt(group, service).run([TASK], GenerationParams(n=2), None).groups[0]
    assert pass_rates_by_turn(trajectories, 3) == [0.5, 0.5, 0.5]
    trajectories[0].turns.append(trajectories[1].turns[0])  # a second turn that passed
    assert pass_rates_by_turn(trajectories, 2) == [0.5, 1.0]


def test_env_config_checks():
    assert load_config("configs/default.yaml", []).env.name == "single"
    with pytest.raises(ConfigError, match=r"env.name refine and dense rewards \(learner.advantage\) are not supported together"):
        load_config("configs/default.yaml", ["env.name=refine", "learner.advantage.dense={}"])
    with pytest.raises(ConfigError, match="env.refine.max_turns: Input should be greater than or equal to 2"):
        load_config("configs/default.yaml", ["env.name=refine", "env.max_turns=1"])
    with pytest.raises(ConfigError, match="max_tool_calls=3 leaves no turn for the answer in max_turns=3"):
        load_config("configs/default.yaml", ["env.name=interpreter", "env.max_tool_calls=3"])
    with pytest.raises(ConfigError, match="env.refine.feedback_chars"):
        load_config("configs/default.yaml", ["env.name=refine", "env.feedback_chars=0"])
    with pytest.raises(ConfigError, match="env.single.max_turns: Extra inputs are not permitted"):  # a field of another variant
        load_config("configs/default.yaml", ["env.max_turns=2"])
    with pytest.raises(ConfigError, match="sft.demonstrations: multi-turn demonstrations are of an environment"):
        load_config("configs/default.yaml", ["sft.demonstrations=0.5"])
    with pytest.raises(ConfigError, match="env.train_as concat with learner.overlong_buffer"):
        load_config("configs/default.yaml", ["env.name=refine", "env.train_as=concat", "learner.overlong_buffer=8"])


def test_evaluation_reports_rounds_and_single_turn_pass_at_1_of_the_same_policy():
    from coderloo.config import EvalConfig
    from coderloo.evaluation import evaluate

    heldout = synthetic_suite()["heldout"]
    tasks = [next(t for t in heldout if t.difficulty == level) for level in (1, 2)]  # two families, two levels
    breakdown = {"by_difficulty": {"1": 1.0, "2": 0.0}, "by_family": {tasks[0].family: 1.0, tasks[1].family: 0.0},
                 "by_kind": {"assert": 0.5}}
    # sampled only: two samples per task; one failed sample is rewritten and passes; single-turn: one of four passes
    group = ScriptedGroup()
    service = ScriptedRewards([[True, False, False, False], [True, False, False], [False, False], [False, True]])
    config = EvalConfig(samples_per_task=2, k=[1, 2], greedy=False)
    metrics = evaluate(multi_turn(Refine, group, service, max_turns=2), tasks, config, 16, [], seed=7, single=SingleAttempt(group, service))
    assert metrics == {"pass@1": 0.5, "pass@2": 0.5, "pass@1_round1": 0.25, "pass@1_round2": 0.5, "turns_mean": 1.75,
                       "tool_calls_mean": 0.0, "single_turn_pass@1": 0.25, **breakdown}
    assert [params.temperature for _, params, _ in group.calls] == [1.0, 1.0, 1.0]
    assert group.calls[0][2] == group.calls[2][2] == 7  # the single-turn samples are drawn with the same seed


def test_an_evaluation_without_greedy_writes_each_sampled_trajectory_with_what_each_turn_read(tmp_path):
    import json

    from coderloo.cli import write_samples
    from coderloo.config import EvalConfig
    from coderloo.evaluation import evaluate

    # two samples; the first passes, the second fails and is rewritten; then afresh, with and without a note
    for feedback in ("context", "none", "note"):
        made: list[Trajectory] = []
        service = ScriptedRewards([[True, False], [True]])
        strategy = multi_turn(Refine, ScriptedGroup(), service, max_turns=2, feedback=feedback)
        evaluate(strategy, [TASK], EvalConfig(samples_per_task=2, k=[1], greedy=False), 16, [], seed=3, out=made)
        write_samples(tmp_path / "samples.jsonl", {"set": made}, TOKENIZER)
        rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
        assert [(r["task_id"], r["passed"], "turns" in r) for r in rows] == [(TASK.id, True, False), (TASK.id, True, True)]
        first, second = rows[1]["turns"]
        assert first["read"] is None and first["text"] == "    return 1\n" and first["passed"] is False
        assert second["text"] == "    return 2\n" and second["passed"] is True
        assert ("# first failing test: assert solve(17) == 18" in second["read"]) is (feedback != "none")
        assert second["read"].endswith(TASK.prompt) and (second["read"] == TASK.prompt) is (feedback == "none")


def test_evaluation_reports_refinement_by_a_random_choice_next_to_the_critics():
    from coderloo.config import EvalConfig
    from coderloo.evaluation import evaluate

    # 4 samples, all failing round 1; the critic refines samples 2 and 3 (2 passes), the random choice two others (none passes)
    group, service = ScriptedGroup(), ScriptedRewards([[False] * 4, [False, True], [False] * 4, [False, False]])
    critic = env_config(name="refine", max_turns=2, per_round=2, choose="critic")
    chosen = MultiTurn(group, Refine(service, critic), critic, TOKENIZER, score=lambda prompts, _: [0.1, 0.2, 0.9, 0.8])
    at_random = env_config(name="refine", max_turns=2, per_round=2)
    metrics = evaluate(chosen, [TASK], EvalConfig(samples_per_task=4, k=[1], greedy=False), 16, [], seed=7,
                       random_choice=MultiTurn(group, Refine(service, at_random), at_random, TOKENIZER))
    assert metrics["pass@1"] == 0.25 and metrics["pass@1_random_choice"] == 0.0
    assert [seed for _, _, seed in group.calls][::2] == [7, 7]  # the first attempts of both drawn with the same seed


def test_the_critic_judges_a_trajectorys_last_program_as_one_attempt_at_its_task():
    """Not the trajectory's context: its length would tell the critic that earlier attempts failed."""
    import numpy as np

    from coderloo.config import EvalConfig
    from coderloo.evaluation import evaluate
    from learner.config import CriticConfig

    class RecordingCritic:
        config = CriticConfig(select_n=2)

        def log_odds(self, prompts, programs):
            self.asked = (prompts, programs)
            return np.array([2.2, -2.2])

    critic, group = RecordingCritic(), ScriptedGroup()
    metrics = evaluate(multi_turn(Refine, group, ScriptedRewards([[False, True], [True]]), max_turns=2), [TASK],
                       EvalConfig(samples_per_task=2, k=[1], greedy=False), 16, [], seed=1, critic=critic)
    prompt = TOKENIZER(TASK.prompt)["input_ids"]
    assert critic.asked == ([prompt, prompt], [TOKENIZER("    return 2\n")["input_ids"] + [EOS], TOKENIZER("    return 1\n")["input_ids"] + [EOS]])
    assert metrics["pass@1_critic"] == 1.0


def test_no_gradient_reaches_an_observation_token(tiny_model):
    """A concatenated trajectory through the tiny model and the policy loss: the logits that predict
    observation tokens get no gradient; those that predict the policy's tokens do."""
    from common.hf import load_causal_lm
    from learner.batch import pack
    from learner.losses import LossInputs, policy_loss

    group, service = ScriptedGroup(), ScriptedRewards([[False], [True]])
    trajectory = multi_turn(Refine, group, service, max_turns=2).run([TASK], GenerationParams(n=1), 0).groups[0][0]
    vocab = load_causal_lm(str(tiny_model)).config.vocab_size
    seq = concatenated(trajectory)
    seq.prompt_ids = [i % vocab for i in seq.prompt_ids]  # the character ids into the tiny model's vocabulary
    seq.completion_ids = [i % vocab for i in seq.completion_ids]
    seq.advantages = [1.0] * len(seq.completion_ids)
    batch = pack([seq], pad_id=0)
    model = load_causal_lm(str(tiny_model))
    logits = model(**batch.model_inputs()).logits[:, :-1]
    logits.retain_grad()
    logprobs = logits.log_softmax(-1).gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    loss, _ = policy_loss(LossInputs(logprobs, logprobs.detach(), batch.sampler_logprobs, batch.advantages, batch.completion_mask),
                          LearnerConfig().loss, max_new_tokens=16)
    loss.backward()
    per_position = logits.grad[0].abs().sum(-1)
    start = len(seq.prompt_ids) - 1
    mask = torch.tensor(seq.mask)
    assert per_position[start:][~mask].max() == 0 and (per_position[start:][mask] > 0).all()
    assert per_position[:start].max() == 0  # nor the prompt's


def test_a_sample_updated_in_flight_counts_its_oldest_token_and_each_tokens_version():
    """A push that came mid-sample splits it into segments: staleness_max (what max_staleness
    bounds) is of its oldest token, staleness_token_mean of each policy token."""
    from rollout_workers.types import Rollouts

    task = synthetic_suite()["train"][0]
    split = Sample([1, 2, 3, 4, 5], [-0.1] * 5, "x", "stop", 3, None, [(0, 3), (3, 5)])
    whole = Sample([1, 2], [-0.1] * 2, "y", "stop", 5)
    turns = [Turn.of([9], split, reward(True)), Turn.of([9], whole, reward(False))]
    assert turns[0].token_versions() == [3, 3, 3, 5, 5] and turns[1].token_versions() == [5, 5]
    summary = Rollouts([[Trajectory(task, [t], t.reward) for t in turns]]).summary(version=6)
    assert summary["staleness_max"] == 3 and summary["staleness_mean"] == 2
    assert summary["staleness_token_mean"] == pytest.approx((3 * 3 + 2 * 1 + 2 * 1) / 7)
    assert summary["updated_in_flight_fraction"] == 0.5
