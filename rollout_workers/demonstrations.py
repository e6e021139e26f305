"""Multi-turn demonstrations for the SFT warm-up, built from the project's own tasks and run for
real, so that a model has seen the format of its environment before RL asks it to use it.

- Fixing from feedback (env refine): a wrong first attempt (a mutant of the
  reference: an off-by-one, a swapped operator; rollout_workers/mutants.py), the environment's
  real reply to it (the sandbox's feedback on the shown tests), then the reference. Only the fix is trained on: the
  wrong attempt and the feedback are context.
- Tool use (env interpreter): a probe (the reference, then a print of a call that the task's
  first shown test makes), the run marker, the run's real output, then the reference as the answer.
  The probe and the answer are trained on, the output is context.

Each is a list of (context ids, completion ids) examples, as the SFT step takes them; contexts
are built as the multi-turn strategy builds them (rollout_workers.strategies.observation_ids), so
a demonstration reads like a trajectory.
"""
from __future__ import annotations

import ast

from reward_service.tasks import Task
from rollout_workers.config import EnvConfig, PromptConfig
from rollout_workers.environments import Environment, Live
from rollout_workers.mutants import mutants
from rollout_workers.prompts import answered_task, chat_answer, render, uses_chat_template
from rollout_workers.strategies import observation_ids

Example = tuple[list[int], list[int]]


def demonstrations(tasks: list[Task], env: Environment, config: EnvConfig, tokenizer, prompt: PromptConfig,
                   tries: int = 3) -> list[Example]:
    """The demonstrations of `env` for those of `tasks` that give one (a reference, and a mutant
    that fails in `tries`, or a probe to make)."""
    tasks = [answered_task(t, tokenizer, prompt) for t in tasks if t.reference.strip()]
    if config.name == "interpreter":
        return _tool_use(tasks, env, config, tokenizer, prompt)
    return _fixes(tasks, env, config, tokenizer, prompt, tries)


def _turn(task: Task, program: str, tokenizer, prompt: PromptConfig, after: str = "") -> tuple[str, list[int]]:
    """A policy turn that answers `task` with `program` (then `after`, before the end of the turn):
    its text as the environment reads it, and its token ids with the end of turn."""
    if uses_chat_template(tokenizer, prompt):
        answer = chat_answer(task.model_copy(update={"reference": program}), tokenizer, prompt)
        fence_end = answer.rindex("```") + 3
        text = answer[:fence_end] + after
        return text, tokenizer(text + answer[fence_end:], add_special_tokens=False)["input_ids"]
    text = (program[len(task.prompt):] if task.prompt_is_code else program) + after
    return text, tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def _fixes(tasks: list[Task], env: Environment, config: EnvConfig, tokenizer, prompt: PromptConfig, tries: int) -> list[Example]:
    # each task's first `tries` mutants, all scored at once; the first that fails makes the demonstration
    attempts = [(task, _turn(task, m, tokenizer, prompt)) for task in tasks
                for m in mutants(task.reference, len(task.prompt) if task.prompt_is_code else 0, limit=tries)]
    if not attempts:
        return []
    replies = env.react([Live(task, [text], [None]) for task, (text, _) in attempts], [False] * len(attempts))
    examples, done = [], set()
    for (task, (_, ids)), reply in zip(attempts, replies, strict=True):
        if reply.message is None or task.id in done:
            continue  # the mutant passed (or the task has its demonstration)
        done.add(task.id)
        context = tokenizer(render(task, tokenizer, prompt))["input_ids"] + ids
        context += observation_ids(tokenizer, prompt, config, task, reply, ids)[0]
        examples.append((context, _turn(task, task.reference, tokenizer, prompt)[1]))
    return examples


def probe_call(task: Task) -> str | None:
    """The call that the task's first shown test checks (`assert f(3) == 4` -> `f(3)`), None if it
    has no such test (a held test's call is never put in a prompt)."""
    if not task.shown or not isinstance(task.shown[0], str):
        return None
    try:
        test = ast.parse(task.shown[0]).body[0]
    except SyntaxError:
        return None
    if isinstance(test, ast.Assert) and isinstance(test.test, ast.Compare) and isinstance(test.test.left, ast.Call):
        return ast.unparse(test.test.left)
    return None


def _tool_use(tasks: list[Task], env: Environment, config: EnvConfig, tokenizer, prompt: PromptConfig) -> list[Example]:
    probes = []
    for task in tasks:
        call = probe_call(task)
        if call is not None:
            program = task.reference.rstrip("\n") + f"\nprint({call})\n"
            probes.append((task, _turn(task, program, tokenizer, prompt, after=config.run_marker)))
    if not probes:
        return []
    # the environment reads the text before the marker, as the engine hands it over (the stop sequence cut off)
    live = [Live(task, [text[: -len(config.run_marker)]], [config.run_marker]) for task, (text, _) in probes]
    replies = env.react(live, [False] * len(live))
    examples = []
    for (task, (text, _)), reply in zip(probes, replies, strict=True):
        if not reply.tool_call:
            continue
        # the engine stops at the marker: the probe's tokens end there, with no end of turn
        probe_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        prompt_ids = tokenizer(render(task, tokenizer, prompt))["input_ids"]
        context = prompt_ids + probe_ids + observation_ids(tokenizer, prompt, config, task, reply, probe_ids)[0]
        examples += [(prompt_ids, probe_ids), (context, _turn(task, task.reference, tokenizer, prompt)[1])]
    return examples
