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
