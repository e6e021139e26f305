"""A synthetic suite of small Python function tasks that a tiny model can learn on a CPU.

Each family is one kind of function (add a constant, filter a list, ...) written from a
docstring; its members differ in their constants. The held-out split holds (family, constants)
pairs never seen in training, so passing them needs the skill (read the spec, copy the
constants into code), not memorised answers. Difficulty grows with the number of operations.
"""
from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from reward_service.tasks import Task

ENTRY_POINT = "solve"

INTS = [-7, -2, 0, 3, 5, 8, 13, 21, 34]
LISTS = [[], [3], [5, -2, 9, 0, 14], [1, 2, 3, 4, 5, 6, 7, 8], [20, 11, -4, 7, 7, 16, 2], [9, 8, 1, 12, 0, 5], [15, 3, 11, 0, 7, 14, 1, 9, 12, 5, 2, 13, 8, 10, 4, 6]]
STRINGS = ["", "a", "hello", "coderloo", "abcdefghij", "Python 3.11!"]


@dataclass(frozen=True)
class Family:
    name: str
    difficulty: int
    arg: str  # parameter name of the function: x (int), xs (list of int), s (str)
    doc: str  # docstring template
    body: str  # expression template
    params: Callable[[], Iterable[dict[str, int]]]
    inputs: list[Any]


def _one(lo: int, hi: int, key: str = "n") -> Callable[[], Iterable[dict[str, int]]]:
    return lambda: ({key: v} for v in range(lo, hi + 1))


def _two(a_range: range, b_range: Callable[[int], range]) -> Callable[[], Iterable[dict[str, int]]]:
    return lambda: ({"a": a, "b": b} for a in a_range for b in b_range(a))


NONEMPTY_LISTS = [xs for xs in LISTS if len(xs) >= 6]

FAMILIES: list[Family] = [
    # difficulty 1: one operation
    Family("add", 1, "x", "Return x plus {n}.", "x + {n}", _one(1, 19), INTS),
    Family("sub", 1, "x", "Return x minus {n}.", "x - {n}", _one(1, 19), INTS),
    Family("mul", 1, "x", "Return x times {n}.", "x * {n}", _one(2, 12), INTS),
    Family("mod", 1, "x", "Return x modulo {n}.", "x % {n}", _one(2, 9), INTS),
    Family("floordiv", 1, "x", "Return x divided by {n}, rounded down.", "x // {n}", _one(2, 9), INTS),
    Family("repeat", 1, "s", "Return s repeated {n} times.", "s * {n}", _one(2, 7), STRINGS),
    Family("prefix", 1, "s", "Return the first {n} characters of s.", "s[:{n}]", _one(1, 9), STRINGS),
    Family("drop", 1, "s", "Return s without its first {n} characters.", "s[{n}:]", _one(1, 9), STRINGS),
    Family("index", 1, "xs", "Return the item at index {n} of xs.", "xs[{n}]", _one(0, 5), NONEMPTY_LISTS),
    Family("last", 1, "xs", "Return the last {n} items of xs.", "xs[-{n}:]", _one(1, 6), LISTS),
    # difficulty 2: two operations, or a comprehension
    Family("affine", 2, "x", "Return x times {a} plus {b}.", "x * {a} + {b}", _two(range(2, 7), lambda a: range(1, 10)), INTS),
    Family("map_add", 2, "xs", "Return a list with {n} added to each item of xs.", "[v + {n} for v in xs]", _one(1, 19), LISTS),
    Family("map_mul", 2, "xs", "Return a list with each item of xs times {n}.", "[v * {n} for v in xs]", _one(2, 12), LISTS),
    Family("filter_gt", 2, "xs", "Return the items of xs greater than {n}.", "[v for v in xs if v > {n}]", _one(0, 14), LISTS),
    Family("filter_lt", 2, "xs", "Return the items of xs less than {n}.", "[v for v in xs if v < {n}]", _one(0, 14), LISTS),
    Family("count_gt", 2, "xs", "Return how many items of xs are greater than {n}.", "len([v for v in xs if v > {n}])", _one(0, 14), LISTS),
    Family("divisible", 2, "x", "Return True if x is divisible by {n}.", "x % {n} == 0", _one(2, 9), INTS + [6, 10, 12, 28, 30, 35, 36, 40, 45]),
    Family("sum_plus", 2, "xs", "Return the sum of xs plus {n}.", "sum(xs) + {n}", _one(1, 19), LISTS),
    # difficulty 3: three operations
    Family("filter_map", 3, "xs", "Return the items of xs greater than {a}, each times {b}.", "[v * {b} for v in xs if v > {a}]", _two(range(0, 10), lambda a: range(2, 6)), LISTS),
    Family("sum_filter", 3, "xs", "Return the sum of the items of xs greater than {n}.", "sum(v for v in xs if v > {n})", _one(0, 14), LISTS),
    Family("clamp", 3, "x", "Return x, but at least {a} and at most {b}.", "max({a}, min(x, {b}))", _two(range(0, 8), lambda a: range(a + 3, a + 12, 2)), INTS + [1, 2, 4, 6, 7, 9, 10, 11, 12, 14, 16, 18, 19]),
]


def _held_out(family: str, params: dict[str, int], fraction: float) -> bool:
    key = f"{family}:{sorted(params.items())}".encode()
    return int(hashlib.sha256(key).hexdigest()[:8], 16) / 0xFFFFFFFF < fraction


def _make_task(family: Family, params: dict[str, int], split: str) -> Task:
    doc = family.doc.format(**params)
    body = family.body.format(**params)
    prompt = f'def {ENTRY_POINT}({family.arg}):\n    """{doc}"""\n'
    completion = f"    return {body}\n"
    fn = eval(f"lambda {family.arg}: {body}")  # our own template, not model output
    tests = []
    for value in family.inputs:
        try:
            expected = fn(value)
        except IndexError:
            continue
        tests.append(f"assert {ENTRY_POINT}({value!r}) == {expected!r}")
    suffix = "_".join(str(v) for v in params.values())
    return Task(
        id=f"synthetic/{family.name}/{suffix}",
        prompt=prompt,
        tests=tests,
        entry_point=ENTRY_POINT,
        reference=prompt + completion,
        difficulty=family.difficulty,
        source="synthetic",
        prompt_is_code=True,
        split=split,
    )


def synthetic_suite(heldout_fraction: float = 0.2, max_difficulty: int = 3) -> dict[str, list[Task]]:
    """All synthetic tasks, split into 'train' and 'heldout' (disjoint by family and constants)."""
    splits: dict[str, list[Task]] = {"train": [], "heldout": []}
    for family in FAMILIES:
        if family.difficulty > max_difficulty:
            continue
        members = list(family.params())
        flags = [_held_out(family.name, p, heldout_fraction) for p in members]
        if not any(flags):  # every family is represented in the held-out split
            flags[0] = True
        if all(flags):
            flags[-1] = False
        for params, held in zip(members, flags):
            split = "heldout" if held else "train"
            splits[split].append(_make_task(family, params, split))
    return splits


def corpus_for_tokenizer() -> Iterable[str]:
    """Text the tiny model's tokenizer is trained on: the suite's train programs plus common Python."""
    for task in synthetic_suite()["train"]:
        yield task.reference
        yield "\n".join(task.tests)
    yield from itertools.repeat(_PYTHON_SNIPPETS, 4)


_PYTHON_SNIPPETS = '''
import math
from typing import List


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    for i in range(2, int(math.sqrt(n)) + 1):
        if n % i == 0:
            return False
    return True


class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop()


def count_words(text: str) -> dict:
    counts = {}
    for word in text.split():
        counts[word] = counts.get(word, 0) + 1
    return counts


def fib(n):
    a, b = 0, 1
    while n > 0:
        a, b = b, a + b
        n -= 1
    return a


def merge(xs: List[int], ys: List[int]) -> List[int]:
    result = []
    i = j = 0
    while i < len(xs) and j < len(ys):
        if xs[i] <= ys[j]:
            result.append(xs[i])
            i += 1
        else:
            result.append(ys[j])
            j += 1
    return result + xs[i:] + ys[j:]


print(is_prime(7), fib(10), sorted({3: "c", 1: "a"}.items()), None, [x ** 2 for x in range(5)])
try:
    raise ValueError("bad")
except (ValueError, KeyError) as e:
    assert isinstance(e, ValueError) and not False
'''
