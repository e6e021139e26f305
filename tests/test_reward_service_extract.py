"""Code extraction from completions, case by case, with the span of the code in the completion."""
from reward_service.extract import extract


def check(completion, prompt_is_code, expected, entry_point=None):
    got = extract(completion, prompt_is_code, entry_point)
    assert got.code == expected
    assert completion[got.start:got.end] == got.code


def test_markdown_fence():
    check("```python\ndef f():\n    return 1\n```", False, "def f():\n    return 1\n")


def test_prose_around_a_fence():
    check("Here:\n```python\ndef f():\n    return 1\n```\nDone.", False, "def f():\n    return 1\n")


def test_prose_around_unfenced_code():
    text = "Sure, here is the code:\ndef f(x):\n    y = x + 1\n\n    return y\nresult = f(2)\nThis adds one.\n"
    check(text, False, "def f(x):\n    y = x + 1\n\n    return y\nresult = f(2)\n")


def test_no_code_start_takes_the_whole_text():
    check("x = 1\n", False, "x = 1\n")


def test_several_fences_prefers_the_entry_point():
    text = "```python\ndef helper():\n    pass\n```\nthen\n```py\ndef solve(a):\n    return a\n```\n"
    check(text, False, "def solve(a):\n    return a\n", entry_point="solve")
    check(text, False, "def helper():\n    pass\n", entry_point="absent")


def test_several_fences_first_python_one():
    check("```bash\npip install x\n```\n```\na = 1\n```\n```python\nb = 2\n```", False, "a = 1\n")
    check("```text\nnot code\n```\n```python\nb = 2\n```", False, "b = 2\n")


def test_truncated_code_in_an_unterminated_fence():
    check("Answer:\n```python\ndef f(:\n    trunc", False, "def f(:\n    trunc")


def test_continuation_of_a_signature():
    check("    return x + 1\n", True, "    return x + 1\n")
    # the model closes the prompt's fence and then chats: the code stops at the fence
    check("    return x + 1\n```\nThat is all.", True, "    return x + 1\n")


def test_span_offsets():
    got = extract("Here:\n```python\nb = 2\n```", False)
    assert (got.start, got.end) == (16, 22)


ANSWER = '''import math
from typing import List

@functools.cache
def helper(x):
    return x + 1

def unused():
    return 2

def f(a):
    """Doc."""
    return helper(a) * math.pi + SCALE

SCALE = 2; STEP = 3
# Test cases
assert f(1) == 3
print(f(2))
if __name__ == "__main__":
    print(f(3))
'''


def test_sanitize_keeps_the_imports_and_what_the_entry_point_reaches_each_line_in_its_place():
    from reward_service.extract import sanitize

    got = sanitize(ANSWER, "f")
    kept = [i for i, line in enumerate(got.splitlines(), start=1) if line]
    assert len(got.splitlines()) == len(ANSWER.splitlines())
    assert kept == [1, 2, 4, 5, 6, 11, 12, 13, 15, 16]  # the decorator with its function; SCALE's line holds STEP too
    assert all(got.splitlines()[i - 1] == ANSWER.splitlines()[i - 1] for i in kept)
    assert "assert" not in got and "print" not in got and "unused" not in got
    # a class that holds the entry point, or an answer without it: as it is
    method = "class Solution:\n    def f(self):\n        return 1\nassert Solution().f() == 1\n"
    assert sanitize(method, "f") == method and sanitize(ANSWER, "g") == ANSWER
    # an answer cut off by the token limit, or with a broken assert after the function: its longest prefix that parses
    cut = "def f(a):\n    return a\n\nassert f(1) == 1\nassert f([1, 2) == [1,\n"
    assert sanitize(cut, "f") == "def f(a):\n    return a\n\n\n\n"
    broken = "def f(a):\n    return a +\n"
    assert sanitize(broken, "f") == broken  # the function itself does not parse: left to fail as it is
    assert sanitize("def f():\n    return 1\n", "f") == "def f():\n    return 1\n"


def test_a_chat_answer_to_a_function_task_runs_sanitized_and_a_continuation_as_written():
    from coderloo.tasksets.synthetic import synthetic_suite
    from reward_service.scorer import analyse

    task = synthetic_suite()["train"][0]  # def solve(x), a code prompt
    completion = "    return x + 1\n\nassert solve(1) == 3\n"
    assert analyse(task, completion).program == task.prompt + completion  # a continuation: the prompt's code as written
    chat = task.model_copy(update={"prompt_is_code": False})
    answer = "Here:\n```python\ndef solve(x):\n    return x + 1\n\nassert solve(1) == 3\n```"
    assert analyse(chat, answer).program == "def solve(x):\n    return x + 1\n\n\n"
