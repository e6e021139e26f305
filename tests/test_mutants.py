"""Mutants of a reference (rollout_workers/mutants.py): one small edit each, only after the prompt,
never in strings or comments, the rest of the text byte-identical."""
import pytest

from coderloo.tasksets.synthetic import KINDS, synthetic_suite
from rollout_workers.mutants import mutants


def _changed_lines(program: str, mutant: str) -> list[tuple[str, str]]:
    before, after = program.split("\n"), mutant.split("\n")
    assert len(before) == len(after)
    return [(b, a) for b, a in zip(before, after) if b != a]


@pytest.mark.parametrize(("program", "expected"), [
    ("y = x + 5\n", ["y = x - 5\n", "y = x + 6\n", "y = x + 4\n"]),
    ("y = x - 1\n", ["y = x + 1\n", "y = x - 2\n", "y = x - 0\n"]),
    ("y = x * 0\n", ["y = x + 0\n", "y = x * 1\n", "y = x * -1\n"]),
    ("y = a // b\n", ["y = a % b\n"]),
    ("y = a % b\n", ["y = a // b\n"]),
    ("x += a\n", ["x -= a\n"]),
    ("x -= a\n", ["x += a\n"]),
    ("y = a < b\n", ["y = a <= b\n"]),
    ("y = a <= b\n", ["y = a < b\n"]),
    ("y = a > b\n", ["y = a >= b\n"]),
    ("y = a >= b\n", ["y = a > b\n"]),
    ("y = a == b\n", ["y = a != b\n"]),
    ("y = a != b\n", ["y = a == b\n"]),
    ("y = a and b\n", ["y = a or b\n"]),
    ("y = a or b\n", ["y = a and b\n"]),
    ("y = True\n", ["y = False\n"]),
    ("y = False\n", ["y = True\n"]),
    ("y = min(a, b)\n", ["y = max(a, b)\n"]),
    ("y = max(a, b)\n", ["y = min(a, b)\n"]),
    ("for i in range(a, 10):\n    pass\n", ["for i in range(a, 11):\n    pass\n", "for i in range(a, 9):\n    pass\n"]),
])
def test_each_rule(program, expected):
    assert mutants(program) == expected


def test_sites_in_source_order_then_rule_order():
    assert mutants("y = a + 2 < b\n") == ["y = a - 2 < b\n", "y = a + 3 < b\n", "y = a + 1 < b\n", "y = a + 2 <= b\n"]


def test_unpacking_star_and_floats_are_not_mutated():
    assert mutants("from os import *\nprint(*xs)\ndef f(*, k):\n    pass\ny = 2.5\n") == []


def test_mutants_that_do_not_compile_are_dropped():
    # min -> max and max -> min repeat a keyword argument, a SyntaxError
    assert mutants("f(min=1, max=2)\n") == ["f(min=2, max=2)\n", "f(min=0, max=2)\n", "f(min=1, max=3)\n", "f(min=1, max=1)\n"]


def test_prompt_is_never_changed():
    prompt = 'def solve(x):\n    """Return x plus 1, if x > 0."""\n    assert x >= 0\n'
    program = prompt + "    return x + 1 if x > 0 else x\n"
    found = mutants(program, start=len(prompt))
    assert found
    assert all(m.startswith(prompt) for m in found)
    assert len(mutants(program)) > len(found)  # the prompt's own `>=` and `0` are sites when start is 0


def test_strings_and_comments_are_untouched():
    program = 'def f(x):\n    """Return x + 1 when x < 3."""\n    s = "a < b and 2 == 2"  # x < 1 or True\n    t = f"{x + 1}"\n    return x\n'
    assert mutants(program) == []


def test_formatting_is_preserved():
    program = "def f( x ):\n\n    return  x*2   # double\n\n\n"
    found = mutants(program)
    assert found == ["def f( x ):\n\n    return  x+2   # double\n\n\n",
                     "def f( x ):\n\n    return  x*3   # double\n\n\n",
                     "def f( x ):\n\n    return  x*1   # double\n\n\n"]
    for m in found:
        assert len(_changed_lines(program, m)) == 1


def test_limit_and_determinism():
    program = "def f(xs):\n    return [v * 3 for v in xs if v > 2 and v != 7]\n"
    everything = mutants(program)
    assert len(everything) == len(set(everything)) > 3
    assert program not in everything
    assert mutants(program, limit=3) == everything[:3]
    assert mutants(program, limit=0) == []
    assert mutants(program) == everything


@pytest.mark.parametrize("program", ["def f(:\n    return 1 + 2\n", "x = (1 +\n", "  y = 1\n", "x = 1\0 + 2\n"])
def test_invalid_source_gives_none(program):
    assert mutants(program) == []


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_almost_every_synthetic_task_has_a_mutant(kind):
    tasks = [t for t in synthetic_suite(kinds=(kind,))["train"] if t.reference.strip()]
    assert tasks
    without = [t.id for t in tasks if not mutants(t.reference, len(t.prompt) if t.prompt_is_code else 0)]
    share = 1 - len(without) / len(tasks)
    print(f"{kind}: {share:.1%} of {len(tasks)} train tasks have a mutant; none for {without[:10]}")
    assert share >= 0.95, without


def test_a_references_own_warnings_are_not_repeated_per_mutant(recwarn):
    assert len(mutants('import re\nm = re.match("\\d+", s) or 0\n')) == 3
    assert not recwarn.list
