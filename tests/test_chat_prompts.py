"""Instruct and reasoning models: prompts through the chat template (rollout_workers/prompts.py),
answers after a <think> block and in other languages' fences (reward_service/extract.py), an
answer without code, SFT examples of a chat model, and a tiny ChatML model generating from a
rendered prompt with the transformers backend."""

import pytest

from coderloo.config import ConfigError, load_config
from coderloo.controller import sft_examples
from coderloo.models import IM_END, IM_START, TinyModelSpec, build_tiny_model
from coderloo.tasksets.synthetic import corpus_for_tokenizer, synthetic_suite
from common.hf import load_tokenizer
from learner.batch import TrainSequence, pack
from reward_service.attribution import token_rewards
from reward_service.extract import extract
from reward_service.schemas import Components, ItemReward
from reward_service.scorer import NO_CODE, RewardScorer, analyse
from reward_service.tasks import Task
from reward_service.weights import RewardWeights
from rollout_workers import GenerationParams, PromptRollout, Sample
from rollout_workers.config import DEFAULT_INSTRUCTIONS, PromptConfig
from rollout_workers.hf_backend import TransformersBackend
from rollout_workers.prompts import answered_task, render
from rollout_workers.strategies import SingleAttempt
from sandbox_pool import Limits, Status
from sandbox_pool.results import CallTest, IOTest

CODE_TASK = synthetic_suite()["train"][0]  # prompt_is_code: def solve(x): + docstring
STDIO_TASK = Task(id="cp/1", prompt="Read n and print n + 1.", tests=[IOTest(stdin="1\n", stdout="2\n")], reference="#include <cstdio>\n",
                  difficulty=1, source="test", prompt_is_code=False, language="cpp")
CALL_TASK = Task(id="lc/1", prompt="class Solution:\n    def twoSum(self, nums, target):\n", tests=[CallTest(args=[[1, 2], 3], accepted=[[0, 1]])],
                 entry_point="twoSum", reference="var twoSum = function(nums, target) { return [0, 1]; };\n", difficulty=1, source="test",
                 prompt_is_code=False, language="javascript")
SETTINGS = PromptConfig(system="You write code.")


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny Qwen2 model whose tokenizer has the ChatML template."""
    spec = TinyModelSpec(chat=True, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1)
    return build_tiny_model(tmp_path_factory.mktemp("tiny-chat"), corpus_for_tokenizer(), spec)


@pytest.fixture(scope="module")
def chat_tokenizer(chat_model):
    return load_tokenizer(chat_model)


# --- the renderer ---

def test_without_a_template_the_prompt_is_the_tasks_own(tiny_model, chat_tokenizer):
    base = load_tokenizer(tiny_model)
    assert not base.chat_template
    for task in (CODE_TASK, STDIO_TASK, CALL_TASK):
        assert render(task, base, SETTINGS) == task.prompt
        assert render(task, None, SETTINGS) == task.prompt
        assert render(task, chat_tokenizer, PromptConfig(chat_template="off")) == task.prompt
        assert answered_task(task, base, SETTINGS) is task
    assert render(CODE_TASK, base, SETTINGS, text="# feedback\n" + CODE_TASK.prompt) == "# feedback\n" + CODE_TASK.prompt
    with pytest.raises(ValueError, match="prompt.chat_template is 'on' but the model's tokenizer has no chat template"):
        render(CODE_TASK, base, PromptConfig(chat_template="on"))


def test_through_the_template_system_instruction_and_task_then_the_assistants_turn(chat_tokenizer):
    for task, kind, language in ((CODE_TASK, "assert", "Python"), (STDIO_TASK, "stdio", "C++"), (CALL_TASK, "call", "JavaScript")):
        prompt = render(task, chat_tokenizer, SETTINGS)
        instruction = DEFAULT_INSTRUCTIONS[kind].format(language=language, tag=task.language)
        assert prompt == (f"{IM_START}system\nYou write code.{IM_END}\n{IM_START}user\n{instruction}\n\n{task.prompt}{IM_END}\n"
                          f"{IM_START}assistant\n")
    assert "```cpp code block" in render(STDIO_TASK, chat_tokenizer, SETTINGS)
    # no system message when none is set; refinement's text in place of the task's prompt
    prompt = render(CODE_TASK, chat_tokenizer, PromptConfig(instructions={"assert": "Fix it."}), text="# it failed\n" + CODE_TASK.prompt)
    assert prompt == f"{IM_START}user\nFix it.\n\n# it failed\n{CODE_TASK.prompt}{IM_END}\n{IM_START}assistant\n"
    # the special tokens are single tokens of the prompt's ids
    ids = chat_tokenizer(prompt)["input_ids"]
    assert ids.count(chat_tokenizer.convert_tokens_to_ids(IM_START)) == 2 and chat_tokenizer.decode(ids) == prompt


def test_a_chat_model_writes_the_whole_program_so_a_code_prompt_is_scored_as_prose(chat_tokenizer):
    scored = answered_task(CODE_TASK, chat_tokenizer, SETTINGS)
    assert (CODE_TASK.prompt_is_code, scored.prompt_is_code) == (True, False)
    assert scored.program(CODE_TASK.reference) == CODE_TASK.reference  # the reference is the whole program either way
    assert answered_task(STDIO_TASK, chat_tokenizer, SETTINGS) is STDIO_TASK


def test_prompt_settings_in_the_config():
    config = load_config(None, ["prompt.chat_template=on", "prompt.instructions.stdio=Solve it in {language}."])
    assert config.prompt.chat_template == "on"  # YAML's boolean on, read as the setting
    assert config.prompt.instructions == {**DEFAULT_INSTRUCTIONS, "stdio": "Solve it in {language}."}
    assert load_config(None, ["prompt.chat_template=off"]).prompt.chat_template == "off"
    with pytest.raises(ConfigError, match=r"prompt.instructions: .*instructions.call: 'Use \{entry\}' is not a template"):
        load_config(None, ["prompt.instructions.call=Use {entry}"])
    with pytest.raises(ConfigError, match="prompt.chat_template"):
        load_config(None, ["prompt.chat_template=sometimes"])


class RecordingGroup:
    def __init__(self, text):
        self.text, self.calls = text, []

    def generate_each(self, prompts, params, seed, done):
        self.calls.append((prompts, params))
        for i in range(len(prompts)):
            done(i, PromptRollout([1, 2], [Sample([5], [-0.1], self.text, "stop", 0)] * params.n))
        return 0


class RecordingRewards:
    per_token = False

    def __init__(self):
        self.tasks = []

    def submit(self, tasks, completions, token_ids=None):
        self.tasks += tasks
        components = Components(syntax=1.0, functionality=1.0, lint=None, performance=None)
        return [ItemReward(components=components, total=1.0, passed=True, status=Status.passed, diagnostics=[], token_rewards=None)
                for _ in completions]

    def collect(self, rewards):
        return rewards


def test_a_strategy_sends_rendered_prompts_without_continuation_stops_and_scores_whole_programs(chat_tokenizer):
    group, rewards = RecordingGroup("```python\ndef solve(x):\n    return x\n```"), RecordingRewards()
    params = GenerationParams(n=2, stop=["\ndef "])
    out = SingleAttempt(group, rewards, chat_tokenizer, SETTINGS).run([CODE_TASK], params, seed=0)
    prompts, sent = group.calls[0]
    assert prompts == [render(CODE_TASK, chat_tokenizer, SETTINGS)] and sent.stop == [] and sent.n == 2
    assert [t.prompt_is_code for t in rewards.tasks] == [False, False]
    assert out.groups[0][0].task.prompt_is_code is False
    # a base model: the raw prompt and the stop sequences, as before
    group, rewards = RecordingGroup("    return x\n"), RecordingRewards()
    SingleAttempt(group, rewards).run([CODE_TASK], params, seed=0)
    assert group.calls[0][0] == [CODE_TASK.prompt] and group.calls[0][1] is params and rewards.tasks[0] is CODE_TASK


# --- extraction ---

def check(completion, expected, prompt_is_code=False, entry_point=None, language="python"):
    got = extract(completion, prompt_is_code, entry_point, language)
    assert got.code == expected
    assert completion[got.start:got.end] == got.code  # offsets into the completion as the model wrote it
    return got


def test_the_answer_after_the_thinking():
    thinking = "<think>\nThe task wants x + 1. Maybe:\n```python\ndef solve(x):\n    return x - 1\n```\nNo, plus.\n</think>\n"
    answer = "Here it is:\n```python\ndef solve(x):\n    return x + 1\n```\n"
    got = check(thinking + answer, "def solve(x):\n    return x + 1\n", entry_point="solve")
    assert got.start == len(thinking) + len("Here it is:\n```python\n")
    # the decoy block inside the thinking is the only one that defines the entry point: still not taken
    check(thinking + "```python\ndef helper():\n    pass\n```\n", "def helper():\n    pass\n", entry_point="solve")
    # several thinking blocks: after the last; a template that opened <think> in the prompt: after </think>
    check("<think>a</think>b\n<think>```python\nx = 1\n```</think>\n```python\ny = 2\n```", "y = 2\n")
    check("Let me think.\n</think>\n\ndef f():\n    return 1\n", "def f():\n    return 1\n")
    # without thinking, as before
    check("```python\ndef f():\n    return 1\n```", "def f():\n    return 1\n")


def test_thinking_that_never_closes_has_no_code():
    completion = "<think>\nFirst, ```python\ndef solve(x):\n    return x\n```\nhmm, and then"
    got = check(completion, "")
    assert (got.start, got.end) == (len(completion), len(completion))
    assert check("<think>" + CODE_TASK.reference, "", prompt_is_code=True).start == len("<think>" + CODE_TASK.reference)


def test_fence_tags_of_the_tasks_language():
    text = "```python\nprint(1)\n```\n```js\nconsole.log(1);\n```\n```c++\nint main() {}\n```\n"
    check(text, "print(1)\n")
    check(text, "console.log(1);\n", language="javascript")
    check(text, "int main() {}\n", language="cpp")
    check("```cpp\nint a;\n```\n```\nint b;\n```", "int a;\n", language="cpp")
    check("```node\nlet a;\n```", "let a;\n", language="javascript")
    # the block naming the entry point, in any language; without fences, the whole answer
    check("```js\nfunction helper() {}\n```\n```js\nvar twoSum = function(nums) {};\n```", "var twoSum = function(nums) {};\n",
          entry_point="twoSum", language="javascript")
    check("<think>hm</think>#include <cstdio>\nint main() { return 0; }\n", "#include <cstdio>\nint main() { return 0; }\n", language="cpp")
    with pytest.raises(ValueError, match="no fence tags for language 'rust'"):
        extract("x", False, None, "rust")


def test_an_answer_without_code_does_not_compile_and_never_reaches_the_sandbox(ray_cluster):
    class NoPool:
        def submit(self, requests):
            assert not requests, "a program without code was sent to the sandbox"
            return []

    scorer = RewardScorer(NoPool(), Limits(), RewardWeights())
    prose = CODE_TASK.model_copy(update={"prompt_is_code": False})
    unclosed = "<think>\nlet me see, ```python\ndef solve(x):\n    return x + 1\n```"
    # an empty continuation of a code prompt leaves the prompt's stub, a program like any other
    assert analyse(CODE_TASK, "").syntax_error is None
    for task, completion in [(CODE_TASK, unclosed), (prose, unclosed), (prose, ""), (prose, "\n  \n")]:
        assert analyse(task, completion).syntax_error == NO_CODE
        [reward] = scorer.score([task], [completion])
        assert (reward.components.syntax, reward.components.functionality, reward.total, reward.passed) == (0.0, 0.0, 0.0, False)
        assert reward.status == Status.syntax_error
        assert reward.feedback == "Does not compile: SyntaxError: no code in the answer (line 1, column 1)"


def test_per_token_rewards_fall_on_the_answers_code_only(chat_tokenizer):
    task = answered_task(CODE_TASK, chat_tokenizer, SETTINGS)
    completion = "<think>\n```python\ndef solve(x):\n    return 0\n```\n</think>\n```python\n" + CODE_TASK.reference + "```\n"
    ids = chat_tokenizer(completion, add_special_tokens=False)["input_ids"]
    components = Components(syntax=1.0, functionality=1.0, lint=None, performance=None)
    reward = ItemReward(components=components, total=1.1, passed=True, status=Status.passed, diagnostics=[], token_rewards=None)
    values, _ = token_rewards(task, completion, reward, ids, chat_tokenizer, RewardWeights())
    ends = [len(chat_tokenizer.decode(ids[:i + 1])) for i in range(len(ids))]
    code_start = completion.index("</think>\n```python\n") + len("</think>\n```python\n")
    assert sum(values) == pytest.approx(1.1)
    assert all(v == 0 for v, end in zip(values, ends) if end <= code_start)  # the thinking's decoy earns nothing


# --- a chat model's SFT examples and generation ---

def test_sft_examples_of_a_chat_model_train_on_the_fenced_answer_and_the_end_of_turn(tiny_model, chat_tokenizer):
    tasks = [CODE_TASK, synthetic_suite()["train"][1]]
    for task, (prompt_ids, completion_ids) in zip(tasks, sft_examples(tasks, chat_tokenizer, SETTINGS)):
        assert prompt_ids == chat_tokenizer(render(task, chat_tokenizer, SETTINGS))["input_ids"]
        # the whole program, the signature from the prompt included, then <|im_end|> (and nothing after it)
        assert chat_tokenizer.decode(completion_ids) == f"```python\n{task.reference.rstrip()}\n```{IM_END}"
        assert completion_ids[-1] == chat_tokenizer.convert_tokens_to_ids(IM_END) == chat_tokenizer.eos_token_id
        batch = pack([TrainSequence(prompt_ids, completion_ids)], pad_id=chat_tokenizer.pad_token_id)
        trained = batch.input_ids[0, 1:][batch.completion_mask[0].bool()].tolist()  # the tokens the loss predicts
        assert trained == completion_ids
    # a base model's examples are as before: the prompt, then the reference's continuation and EOS
    base = load_tokenizer(tiny_model)
    [(prompt_ids, completion_ids)] = sft_examples([CODE_TASK], base)
    assert prompt_ids == base(CODE_TASK.prompt)["input_ids"]
    assert completion_ids == base(CODE_TASK.reference[len(CODE_TASK.prompt):])["input_ids"] + [base.eos_token_id]


def test_the_tiny_chat_model_generates_from_a_rendered_prompt(chat_model, chat_tokenizer):
    prompt = render(STDIO_TASK, chat_tokenizer, SETTINGS)
    backend = TransformersBackend(str(chat_model), seed=0)
    assert backend.tokenizer.eos_token == IM_END  # generation ends with the assistant's turn
    params = GenerationParams(n=2, max_new_tokens=6, temperature=1.0)
    [(index, rollout)] = list(backend.generate_stream([prompt], params, version=0))
    assert index == 0 and rollout.prompt_ids == chat_tokenizer(prompt)["input_ids"]
    assert chat_tokenizer.decode(rollout.prompt_ids) == prompt
    assert len(rollout.samples) == 2
    for sample in rollout.samples:
        assert 1 <= len(sample.token_ids) <= 6 and len(sample.sampler_logprobs) == len(sample.token_ids)
        assert sample.text == chat_tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        assert all(lp <= 0 for lp in sample.sampler_logprobs)


# --- multi-turn through the template ---

def test_a_chat_models_observation_is_a_user_turn_after_its_own_end_of_turn(chat_tokenizer):
    from rollout_workers.prompts import follow_up

    said = follow_up(CODE_TASK, chat_tokenizer, SETTINGS, "Failed: 1 of 9 tests did not pass", "Write it again, fixed.")
    # the assistant's turn ended with <|im_end|> (its EOS, sampled): the user's turn and the assistant's header follow
    assert said == f"\n{IM_START}user\nFailed: 1 of 9 tests did not pass\n\nWrite it again, fixed.{IM_END}\n{IM_START}assistant\n"
    # a turn cut at max_new_tokens, or stopped at the run marker, has no end of turn: the observation closes it
    assert follow_up(CODE_TASK, chat_tokenizer, SETTINGS, "stdout:\n4", "", turn_ended=False).startswith(f"{IM_END}\n{IM_START}user\nstdout:\n4")
    # the whole conversation is what the template makes of it, the system message once
    first = render(CODE_TASK, chat_tokenizer, SETTINGS)
    answer = "```python\ndef solve(x):\n    return x\n```"
    whole = chat_tokenizer.apply_chat_template(
        [{"role": "system", "content": SETTINGS.system},
         {"role": "user", "content": first.split(f"{IM_START}user\n", 1)[1].split(IM_END, 1)[0]},
         {"role": "assistant", "content": answer},
         {"role": "user", "content": "Failed: 1 of 9 tests did not pass\n\nWrite it again, fixed."}], add_generation_prompt=True, tokenize=False)
    assert whole == first + answer + IM_END + said


def test_a_note_is_the_tasks_user_turn_with_what_the_run_said_after_the_task(chat_tokenizer):
    from rollout_workers.prompts import retry

    note = retry(CODE_TASK, chat_tokenizer, SETTINGS, "An earlier answer failed:\n1 of 9 tests did not pass", "Write a correct solution.")
    first = render(CODE_TASK, chat_tokenizer, SETTINGS)
    # the task's own prompt, its one user turn going on after the task's text with the note
    task_turn = first.split(IM_END, 2)[1]
    assert note == first.replace(task_turn, task_turn + "\n\nAn earlier answer failed:\n1 of 9 tests did not pass\n\nWrite a correct solution.")
