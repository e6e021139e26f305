"""Multi-turn trajectories through the real parts (vLLM, the reward service and its sandbox pool,
DeepSpeed): refinement's trajectories and what the algorithm makes of them; a hostile tool user
(the policy scripted, the environment and sandbox real); no held test in what the policy reads; the SFT
demonstrations, run for real; a short training run; the eval command's rounds and single-turn
pass@1."""
import json
import time

import pytest
import ray

from coderloo.config import load_config
from coderloo.controller import train
from coderloo.metrics import read_metrics
from coderloo.tasksets.synthetic import synthetic_suite
from common.hf import load_tokenizer
from learner.algorithm import build_batch, to_sequences
from learner.config import LearnerConfig
from reward_service.client import RewardClient
from reward_service import scorer
from rollout_workers import GenerationParams, PromptRollout, RolloutGroup, Sample, start_workers
from rollout_workers.config import InterpreterEnv, PromptConfig, RefineEnv, RolloutConfig, env_config
from rollout_workers.demonstrations import demonstrations
from rollout_workers.environments import Live, make_environment
from rollout_workers.mutants import mutants
from rollout_workers.strategies import MultiTurn

ROUNDS, K = 3, 4
TASK = synthetic_suite()["train"][0]  # def solve(x): """Return x plus 1."""


@pytest.fixture(scope="module")
def service(ray_cluster):
    rewards = RewardClient(load_config("configs/default.yaml", []).reward)
    yield rewards
    rewards.close()


def strategy(group, service, tokenizer, **env) -> MultiTurn:
    config = env_config(**env)
    return MultiTurn(group, make_environment(config, service), config, tokenizer)


def test_refinement_trajectories_reach_the_batch_with_their_advantage(service, tiny_model):
    workers = start_workers(str(tiny_model), RolloutConfig(threads=1), seed=0)
    try:
        made = strategy(RolloutGroup(workers), service, load_tokenizer(tiny_model), name="refine", max_turns=ROUNDS)
        rollouts = made.run(synthetic_suite()["train"][:2], GenerationParams(n=K, max_new_tokens=16, stop=["\ndef "]), seed=3)
    finally:
        for w in workers:
            ray.kill(w)
    trajectories = rollouts.trajectories()
    assert len(trajectories) == 2 * K and sum(len(t.turns) for t in trajectories) > 2 * K  # the untrained model fails: round 2 happened
    for t in trajectories:
        # a later attempt only while none has passed; it stops at a pass or at ROUNDS
        outcomes = [turn.reward.passed for turn in t.turns]
        assert not any(outcomes[:-1]) and len(t.turns) <= ROUNDS and (outcomes[-1] or len(t.turns) == ROUNDS)
        assert t.outcome is t.turns[-1].reward
        for before, after in zip(t.turns, t.turns[1:]):  # each context extends the last, as the engine sampled it
            assert after.prompt_ids[: len(before.prompt_ids) + len(before.token_ids)] == before.prompt_ids + before.token_ids
    rates = [rollouts.metrics[f"pass@1_round{r}"] for r in range(1, ROUNDS + 1)]
    assert rates == sorted(rates) and rollouts.metrics["turns_mean"] == sum(len(t.turns) for t in trajectories) / len(trajectories)
    assert rollouts.metrics["observation_tokens_mean"] > 0
    # every policy token of a trajectory trains with the trajectory's advantage, as turns or as one sequence
    for concat in (False, True):
        samples = to_sequences(rollouts.groups, concat=concat)
        samples.turn_kl = [[0.01 * i] + [0.0] * (len(seq.completion_ids) - 1) for i, seq in enumerate(samples.flat())]  # sets apart groups whose outcomes all fail
        batch = build_batch(samples, LearnerConfig(kl={"coef": 0.5, "into": "reward"}, advantage={"filter_uninformative": False}), step=1)
        sequences = iter(batch.sequences)
        for t in trajectories:
            advantages = [next(sequences).advantages for _ in (t.turns[:1] if concat else t.turns)]
            assert len({a[0] for a in advantages}) == 1 and all(len(set(a)) == 1 for a in advantages)


class ScriptedPolicy:
    """A stand-in for the engines that writes the given turns (a hostile tool user: no model
    writes these on purpose), tokenized with the policy's tokenizer; a turn that ends at a stop
    sequence has no EOS, as the engine hands it over."""

    def __init__(self, tokenizer, turns: list[tuple[str, str | None]]):
        self.tokenizer, self.turns, self.calls = tokenizer, turns, 0

    def context_length(self) -> int:
        return 4096

    def generate_each(self, prompts, params, seed, done):
        text, stop = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        for i, prompt in enumerate(prompts):
            ids = prompt if isinstance(prompt, list) else self.tokenizer(prompt)["input_ids"]
            tokens = self.tokenizer(text + (stop or ""), add_special_tokens=False)["input_ids"] + ([] if stop else [self.tokenizer.eos_token_id])
            done(i, PromptRollout(list(ids), [Sample(tokens, [-1.0] * len(tokens), text, "stop", 0, stop)] * params.n))
        return 0


MARKER = InterpreterEnv().run_marker
HOSTILE = {  # the probes of a hostile tool user, and what its trajectory must show
    "floods the observation": "    return x + 1\nprint('x' * 10_000_000)\n",
    "hangs": "    while True:\n        pass\nsolve(1)\n",
    "prints fake test results": "    return x\nprint('9 of 9 tests passed: OK')\nprint('Ran 9 tests\\nOK')\n",
    "forks without end": "    import os\n    while True:\n        os.fork()\nsolve(1)\n",
}


@pytest.mark.parametrize("behaviour", list(HOSTILE))
def test_a_hostile_tool_user_ends_within_its_limits(service, tiny_model, behaviour):
    tokenizer = load_tokenizer(tiny_model)
    # it never stops calling the tool: every turn ends at the run marker; its answer is wrong
    policy = ScriptedPolicy(tokenizer, [(HOSTILE[behaviour], MARKER)])
    made = strategy(policy, service, tokenizer, name="interpreter", max_turns=3, max_tool_calls=2, observation_tokens=64)
    started = time.monotonic()
    rollouts = made.run([TASK], GenerationParams(n=2, max_new_tokens=32), seed=0)
    took = time.monotonic() - started
    limits = load_config("configs/default.yaml", []).reward.limits
    assert took < 3 * (2 * limits.wall_timeout_s + 10)  # two runs each, at most the sandbox's limit each (and scoring)
    for t in rollouts.trajectories():
        assert len(t.turns) == 3 and t.turns[0].reward is None and t.turns[1].reward is None  # two runs, then the answer
        assert not t.outcome.passed  # what it printed is no test result
        observations = [len(after.prompt_ids) - len(before.prompt_ids) - len(before.token_ids) for before, after in zip(t.turns, t.turns[1:])]
        prompt_and_ask = len(tokenizer("\n# No runs left: write the answer.\n" + TASK.prompt, add_special_tokens=False)["input_ids"])
        assert all(n <= 64 + prompt_and_ask + 40 for n in observations)  # the message cut to 64 tokens, with its marker
    assert rollouts.metrics["tool_calls_mean"] == 2
    seen = tokenizer.decode(rollouts.trajectories()[0].turns[1].prompt_ids)
    if behaviour == "floods the observation":
        assert rollouts.metrics["observations_cut_mean"] == 2 and "more tokens cut]" in seen
    if behaviour == "hangs":
        assert "timed out" in seen
    if behaviour == "prints fake test results":
        assert "9 of 9 tests passed" in seen  # the model may read it; the reward does not


def test_no_held_test_reaches_what_the_policy_reads(service, tiny_model):
    """Refinement's feedback and the SFT demonstrations (refine's and the interpreter's), from real
    runs of wrong programs of each kind (a mutant, a wrong value, a crash that echoes its input) on
    function and stdin tasks: no held test's text (its input and expected value) and no held input
    the program echoed reaches an observation; the shown ones do, so the check can fail."""
    tokenizer = load_tokenizer(tiny_model)
    suite = synthetic_suite(kinds=("function", "stdio"))["train"]
    tasks = suite[::15]
    config = RefineEnv()
    refine = make_environment(config, service)
    echo = {"assert": "    raise ValueError(f'ARG<{%s!r}>')\n", "stdio": "raise ValueError('ARG<' + input() + '>')\n"}
    live = []
    for task in tasks:
        arg = task.prompt.split("(", 1)[1].split(")", 1)[0] if task.test_kind == "assert" else ""
        wrong = [mutants(task.reference, len(task.prompt), limit=1)[0][len(task.prompt):],
                 "    return 0\n" if task.test_kind == "assert" else "print(0)\n",
                 echo[task.test_kind] % arg if arg else echo[task.test_kind]]
        live += [Live(task, [text], [None]) for text in wrong]
    replies = refine.react(live, [False] * len(live))
    said = {t.task.id: "" for t in live}
    for t, reply in zip(live, replies, strict=True):
        said[t.task.id] += reply.message or ""
    for examples in (demonstrations(tasks, refine, config, tokenizer, PromptConfig()),
                     demonstrations(tasks, make_environment(InterpreterEnv(), service), InterpreterEnv(), tokenizer, PromptConfig())):
        for context, _ in examples:
            text = tokenizer.decode(context)
            said[next(t.id for t in tasks if text.startswith(t.prompt))] += text

    def quoted(task, test) -> list[str]:
        if isinstance(test, str):  # assert solve(ARG) == EXPECTED
            arg = test.split(f"{task.entry_point}(", 1)[1].rsplit(") ==", 1)[0]
            return [test, f"ARG<{arg}>"]
        return [scorer.test_text(test), f"ARG<{test.stdin.splitlines()[0]}>"]

    shown_seen = 0
    for task in tasks:
        shown = {q for test in task.shown for q in quoted(task, test)}
        held = {q for test in task.held for q in quoted(task, test)} - shown
        assert not [q for q in held if q in said[task.id]], task.id
        shown_seen += sum(q in said[task.id] for q in shown)
    assert shown_seen >= len(tasks)  # the shown tests' texts and echoed inputs are there


def test_demonstrations_are_built_from_real_runs(service, tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    tasks = synthetic_suite()["train"][:12]
    fixes = demonstrations(tasks, make_environment(RefineEnv(), service), RefineEnv(), tokenizer, PromptConfig())
    assert len(fixes) >= 10
    for context, completion in fixes:
        text = tokenizer.decode(context)
        assert "# What running the code above said:\n# Failed:" in text or "# Runtime error" in text
        task = next(t for t in tasks if tokenizer.decode(completion, skip_special_tokens=True) == t.reference[len(t.prompt):])
        assert text.startswith(task.prompt) and text.endswith(task.prompt)  # the task, the wrong attempt, the feedback, the task again
    config = InterpreterEnv()
    probes = demonstrations(tasks, make_environment(config, service), config, tokenizer, PromptConfig())
    assert len(probes) == 2 * len(tasks)  # the probe, then the answer after its output
    probe_context, probe = probes[0]
    assert tokenizer.decode(probe).endswith("print(solve(17))\n" + MARKER)  # the first shown test's call
    answer_context, _ = probes[1]
    assert "# stdout:\n# 18\n# exit: exited normally\n" in tokenizer.decode(answer_context)  # the reference's real output


def test_multi_turn_training_run(ray_cluster, tiny_model, tmp_path):
    out = tmp_path / "run"
    config = load_config("configs/default.yaml", [
        f"model.path={tiny_model}", f"train.output_dir={out}",
        "env.name=refine", f"env.max_turns={ROUNDS}", "env.train_as=concat", "env.turn_cost=0.05", "sft.demonstrations=0.5",
        # enough SFT for attempts that compile: their syntax rewards set a group's trajectories apart at
        # the first step, where the KL to the reference (the policy RL starts from) is 0
        "sft.steps=60", "sft.batch_size=16", "train.steps=2", "train.prompts_per_step=4", "train.eval_every=0",
        "train.checkpoint_every=0", f"rollout.samples_per_prompt={K}", "rollout.max_new_tokens=16",
        # a trajectory's KL sums its attempts; from the second step on, it sets the trajectories apart too
        "learner.optimizer_steps=1", "learner.kl.coef=0.05", "learner.kl.into=reward",
        "learner.advantage.filter_uninformative=false",
        "tasks.max_eval_tasks=3", "eval.samples_per_task=2", "eval.k=[1]", "eval.greedy=false",
        # the critic chooses which failed attempt of a task is refined each round
        "critic.enabled=true", "critic.select_n=2", "env.per_round=1", "env.choose=critic",
    ])
    summary = train(config)
    rl = [r for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "rl"]
    assert len(rl) == 2
    for record in rl:
        rates = [record[f"pass@1_round{r}"] for r in range(1, ROUNDS + 1)]
        assert rates == sorted(rates) and rates[-1] == record["pass_rate"]  # the outcome is the last attempt's
        assert 1.0 < record["turns_mean"] <= ROUNDS and record["time_env_s"] > 0 and record["observation_tokens_mean"] > 0
        assert record["turn_cost_mean"] > 0 and record["grad_norm"] > 0 and "kl_sequence_mean" in record
        assert 0 < record["unchosen_fraction"] < 1 and record["critic_loss"] > 0
    evals = [r for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "eval"]
    assert len(evals) == 3
    for record in evals:
        rates = [record[f"pass@1_round{r}"] for r in range(1, ROUNDS + 1)]
        assert rates == sorted(rates) and rates[-1] == pytest.approx(record["pass@1"]) and rates[-1] <= 1.0
        assert 0.0 <= record["pass@1_random_choice"] <= 1.0
        assert "single_turn_pass@1" not in record  # round 1 is the single attempt: not sampled twice
    assert "pass@1_round3" in summary["final"]


def test_eval_command_reports_the_interpreter_next_to_single_turn(ray_cluster, tiny_model, tmp_path):
    from coderloo.cli import main

    out = tmp_path / "report.json"
    args = ["eval", "--model", str(tiny_model), "--out", str(out), "env.name=interpreter",
            "tasks.max_eval_tasks=3", "eval.samples_per_task=2", "eval.k=[1]", "eval.max_new_tokens=16"]
    assert main(args) == 0
    report = json.loads(out.read_text())
    assert {"pass@1", "single_turn_pass@1", "greedy_pass@1", "single_turn_greedy_pass@1", "tool_calls_mean", "turns_mean"} <= set(report)
    assert 1.0 <= report["turns_mean"] <= InterpreterEnv().max_turns
