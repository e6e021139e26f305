"""How a task becomes the text an engine is prompted with (the one renderer: generation,
evaluation and the SFT examples all go through `render`; a multi-turn trajectory's observations
through `follow_up`).

A base model continues the task's prompt as it is. A model whose tokenizer has a chat template
is given the template's conversation: the configured system message, then a user message with the
instruction for the task's kind of tests and the task's text, ending where the assistant's turn
starts. Such a model answers with the whole program in a fenced block (after its thinking, for a
reasoning model), which is how the reward service is then asked to score it (`answered_task`).
"""
from __future__ import annotations

from dataclasses import replace

from reward_service.tasks import Task
from rollout_workers.config import PromptConfig
from rollout_workers.types import GenerationParams

LANGUAGE_NAMES = {"python": "Python", "cpp": "C++", "javascript": "JavaScript"}


def uses_chat_template(tokenizer, settings: PromptConfig) -> bool:
    """Whether prompts go through the tokenizer's chat template (`tokenizer` None: a model without one)."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if settings.chat_template == "on" and not has_template:
        raise ValueError("prompt.chat_template is 'on' but the model's tokenizer has no chat template "
                         "(set it to auto or off for a base model)")
    return has_template if settings.chat_template == "auto" else settings.chat_template == "on"


def _conversation(task: Task, settings: PromptConfig, text: str) -> list[dict[str, str]]:
    instruction = settings.instructions[task.test_kind].format(language=LANGUAGE_NAMES[task.language], tag=task.language)
    system = [{"role": "system", "content": settings.system}] if settings.system else []
    return system + [{"role": "user", "content": f"{instruction}\n\n{text}"}]


def render(task: Task, tokenizer, settings: PromptConfig, text: str | None = None) -> str:
    """The prompt for `task` as the engine is given it. `text` is what the prompt says of the task
    (default: its own prompt; refinement: the previous attempt, its feedback and the prompt). Without
    a chat template it is the prompt, unchanged."""
    text = task.prompt if text is None else text
    if not uses_chat_template(tokenizer, settings):
        return text
    return tokenizer.apply_chat_template(_conversation(task, settings, text), add_generation_prompt=True, tokenize=False)


def answered_task(task: Task, tokenizer, settings: PromptConfig) -> Task:
    """The task as the reward service is to score the answer to its rendered prompt. A chat model
    answers with the whole program, also for a prompt that is code: such a task is scored as one
    with a prose prompt (its reference is the whole program either way)."""
    if task.prompt_is_code and uses_chat_template(tokenizer, settings):
        return task.model_copy(update={"prompt_is_code": False})
    return task


def generation_params(params: GenerationParams, tokenizer, settings: PromptConfig) -> GenerationParams:
    """The sampling settings for rendered prompts: a chat model ends its turn itself, and the stop
    sequences that end a continuation of a code prompt ("\\ndef ") would cut its whole program."""
    return replace(params, stop=[]) if uses_chat_template(tokenizer, settings) else params


def chat_answer(task: Task, tokenizer, settings: PromptConfig) -> str:
    """The reference solution as a chat model is to answer `render(task)`: the whole program in a
    fenced block of the task's language, then what the template ends an assistant turn with
    (ChatML's <|im_end|>), for supervised examples."""
    answer = f"```{task.language}\n{task.reference.rstrip()}\n```"
    prompt = render(task, tokenizer, settings)
    conversation = _conversation(task, settings, task.prompt) + [{"role": "assistant", "content": answer}]
    whole = tokenizer.apply_chat_template(conversation, tokenize=False)
    if not whole.startswith(prompt + answer):
        raise ValueError("the model's chat template does not write an assistant turn as its generation prompt and the "
                         "answer (a reasoning template that rewrites the turn?): no supervised examples from it "
                         "(set sft.steps to 0)")
    return answer + whole[len(prompt) + len(answer):].rstrip()


ANSWER_SENTINEL = "\x00answer\x00"


def follow_up(task: Task, tokenizer, settings: PromptConfig, message: str, ask: str, turn_ended: bool = True) -> str:
    """The text a multi-turn trajectory's context goes on with after a policy turn: what the
    environment says (`message`: execution feedback, a tool's output), what it asks (`ask`), then
    where the policy's next turn starts. Without a chat template: on a new line, `message` and
    `ask` as comment lines, then the task's prompt again, which the next turn continues (so a turn
    is always a completion of the task's prompt). Through the template: a user turn with both, then the
    assistant's header; `turn_ended` False (the turn was cut at max_new_tokens) closes the cut
    turn first."""
    if not uses_chat_template(tokenizer, settings):
        return "\n" + _comments(message, ask) + task.prompt
    conversation = _conversation(task, settings, task.prompt) + [
        {"role": "assistant", "content": ANSWER_SENTINEL}, {"role": "user", "content": f"{message}\n\n{ask}".strip()}]
    whole = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    end = whole.rfind(ANSWER_SENTINEL) + len(ANSWER_SENTINEL)
    eos = tokenizer.eos_token or ""
    if not eos or not whole.startswith(eos, end):
        raise ValueError("the model's chat template does not end an assistant turn with its EOS token "
                         f"({eos!r}): multi-turn prompts cannot follow its turns")
    return whole[end + (len(eos) if turn_ended else 0):]


def retry(task: Task, tokenizer, settings: PromptConfig, message: str, ask: str) -> str:
    """The prompt of a later attempt that reads what the attempt before it was told, not its code
    (env.feedback note): the task's prompt, then `message` and `ask`. Without a chat template, the two
    as comment lines before the task's prompt, which the turn continues."""
    if not uses_chat_template(tokenizer, settings):
        return _comments(message, ask) + task.prompt
    return render(task, tokenizer, settings, f"{task.prompt}\n\n{message}\n\n{ask}".rstrip())


def _comments(*texts: str) -> str:
    return "".join(f"# {line}".rstrip() + "\n" for text in texts for line in text.splitlines())
