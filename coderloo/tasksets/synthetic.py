"""A synthetic suite of small Python tasks that a tiny model can learn on a CPU, of two kinds:
functions checked by asserts (`function`), and programs that read stdin and print the answer,
checked by stdin/stdout cases (`stdio`, the form of competitive programming tasks).

Each family is one kind of function or program (add a constant, filter a list, ...) written
from a docstring; its members differ in their constants. The held-out split holds (family,
constants) pairs never seen in training, so passing them needs the skill (read the spec, copy
the constants into code), not memorised answers. Difficulty grows with the number of operations.
"""
from __future__ import annotations

import functools
import hashlib
import io
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from reward_service.tasks import Task
from sandbox_pool import IOTest

ENTRY_POINT = "solve"

INTS = [-7, -2, 0, 3, 5, 8, 13, 21, 34]
LISTS = [[], [3], [5, -2, 9, 0, 14], [1, 2, 3, 4, 5, 6, 7, 8], [20, 11, -4, 7, 7, 16, 2], [9, 8, 1, 12, 0, 5], [15, 3, 11, 0, 7, 14, 1, 9, 12, 5, 2, 13, 8, 10, 4, 6]]
STRINGS = ["", "a", "hello", "coderloo", "abcdefghij", "Python 3.11!"]


@dataclass(frozen=True)
class Family:
    name: str
    difficulty: int
    arg: str  # parameter name of the function: x (int), xs (list of int), s (str); a program's: what it reads (READS)
    doc: str  # docstring template
    body: str  # expression template; a program's: the statements after it read its input
    params: Callable[[], Iterable[dict[str, int]]]
    inputs: list[Any]


def _one(lo: int, hi: int, key: str = "n") -> Callable[[], Iterable[dict[str, int]]]:
    return lambda: ({key: v} for v in range(lo, hi + 1))


def _two(a_range: range, b_range: Callable[[int], range]) -> Callable[[], Iterable[dict[str, int]]]:
    return lambda: ({"a": a, "b": b} for a in a_range for b in b_range(a))


NONEMPTY_LISTS = [xs for xs in LISTS if len(xs) >= 6]

# Each task's shown tests: two inputs of its kind that no family's held tests use, which feedback
# may quote (Task.public_tests). Its held tests are the family's inputs above, which no feedback
# quotes; both decide the reward and the evaluation.
SHOWN = {int: [17, -5], list: [[6, -1, 10, 2, 9, 3, 12], [7, 1, 18, 4, -3, 11]], str: ["ab", "shown text"],
         tuple: [(2, 9), (-4, 3)]}


def _shown(inputs: list[Any]) -> list[Any]:
    return SHOWN[type(inputs[-1])]


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


# stdio: the prompt is a module docstring and the model writes the whole program after it
# (prompt_is_code), the form of a function task's docstring: what SFT teaches on one kind (read
# the spec, copy its constants) carries to the other, and the completion is code from its first
# token (no prose to cut out, no fence). Programs read with input() and write with print(), the
# shortest forms: the default run's completions end at 48 tokens (the longest reference has 30).
# What a program reads, as its docstring says it and as its first lines read it. A list comes as
# competitive programming tasks give one: its length on a line, its items on the next.
READS = {
    "x": ("Read an integer x.", "x = int(input())\n"),
    "s": ("Read a line s.", "s = input()\n"),
    "x, y": ("Read two integers x and y on one line.", "x, y = map(int, input().split())\n"),
    "xs": ("Read n, then n integers xs on one line.", "input()\nxs = list(map(int, input().split()))\n"),
}
STDIO_INTS = [-7, 0, 3, 8, 13, 34]
PAIRS = [(3, 4), (-2, 7), (0, 5), (10, -3), (6, 6), (12, 1)]
# Most lists have items above most thresholds, so a program that prints nothing fails most cases.
STDIO_LISTS = [[], [4], [5, -2, 9, 0, 14], [17, 1, 8, 3], [20, 11, -4, 7, 7, 16, 2], [12, 0, 6, 15, 10, 19], [15, 3, 11, 0, 7, 14, 1, 9, 12, 5, 2, 13, 8, 10, 4, 6]]

# doc: the statement's second sentence (the first, what it reads, is in READS)
STDIO_FAMILIES: list[Family] = [
    # difficulty 1: one value, one operation
    Family("add", 1, "x", "Print x plus {k}.", "print(x + {k})", _one(1, 19, "k"), STDIO_INTS),
    Family("sub", 1, "x", "Print x minus {k}.", "print(x - {k})", _one(1, 19, "k"), STDIO_INTS),
    Family("mul", 1, "x", "Print x times {k}.", "print(x * {k})", _one(2, 12, "k"), STDIO_INTS),
    Family("repeat", 1, "s", "Print s repeated {k} times.", "print(s * {k})", _one(2, 7, "k"), STRINGS),
    Family("prefix", 1, "s", "Print the first {k} characters of s.", "print(s[:{k}])", _one(1, 9, "k"), STRINGS),
    Family("drop", 1, "s", "Print s without its first {k} characters.", "print(s[{k}:])", _one(1, 9, "k"), STRINGS),
    # difficulty 2: two operations, two values on a line, a loop, or a list
    Family("affine", 2, "x", "Print x times {a} plus {b}.", "print(x * {a} + {b})", _two(range(2, 7), lambda a: range(1, 10)), STDIO_INTS),
    Family("pair_add", 2, "x, y", "Print x plus y plus {k}.", "print(x + y + {k})", _one(1, 19, "k"), PAIRS),
    Family("pair_mul", 2, "x, y", "Print x times y plus {k}.", "print(x * y + {k})", _one(1, 19, "k"), PAIRS),
    Family("lines", 2, "s", "Print s {k} times, one per line.", "for _ in range({k}):\n    print(s)", _one(2, 7, "k"), STRINGS),
    Family("sum_plus", 2, "xs", "Print the sum of xs plus {k}.", "print(sum(xs) + {k})", _one(1, 19, "k"), STDIO_LISTS),
    Family("max_plus", 2, "xs", "Print the largest item of xs plus {k}.", "print(max(xs) + {k})", _one(1, 19, "k"), STDIO_LISTS),
    # difficulty 3: a list filtered, then counted, summed or printed
    Family("count_gt", 3, "xs", "Print how many items of xs are greater than {k}.", "print(len([v for v in xs if v > {k}]))", _one(0, 14, "k"), STDIO_LISTS),
    Family("sum_gt", 3, "xs", "Print the sum of the items of xs greater than {k}.", "print(sum(v for v in xs if v > {k}))", _one(0, 14, "k"), STDIO_LISTS),
    Family("filter_gt", 3, "xs", "Print the items of xs greater than {k}, one per line.", "for v in xs:\n    if v > {k}:\n        print(v)", _one(0, 14, "k"), STDIO_LISTS),
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

    def asserts(inputs: list[Any]) -> list[str]:
        tests = []
        for value in inputs:
            try:
                expected = fn(value)
            except IndexError:
                continue
            tests.append(f"assert {ENTRY_POINT}({value!r}) == {expected!r}")
        return tests

    shown = asserts(_shown(family.inputs))
    suffix = "_".join(str(v) for v in params.values())
    return Task(
        id=f"synthetic/{family.name}/{suffix}",
        prompt=prompt,
        tests=shown + asserts(family.inputs),
        entry_point=ENTRY_POINT,
        reference=prompt + completion,
        difficulty=family.difficulty,
        source="synthetic",
        prompt_is_code=True,
        split=split,
        public_tests=len(shown),
    )


def _stdin(arg: str, value: Any) -> str:
    if arg == "x, y":
        return f"{value[0]} {value[1]}\n"
    if arg == "xs":
        return f"{len(value)}\n{' '.join(map(str, value))}\n"
    return f"{value}\n"


def _printed(program: str, stdin: str) -> str:
    """What one of our own template programs prints for `stdin`, its input() and print() bound
    to the text here (as a function task's expected values come from eval of its template)."""
    lines = iter(stdin.splitlines())
    out = io.StringIO()
    exec(program, {"input": lambda: next(lines), "print": functools.partial(print, file=out)})
    return out.getvalue()


def _make_stdio_task(family: Family, params: dict[str, int], split: str) -> Task:
    says, reads = READS[family.arg]
    prompt = f'"""{says} {family.doc.format(**params)}"""\n'
    completion = reads + family.body.format(**params) + "\n"

    def cases(inputs: list[Any]) -> list[IOTest]:
        tests = []
        for value in inputs:
            stdin = _stdin(family.arg, value)
            try:
                tests.append(IOTest(stdin=stdin, stdout=_printed(prompt + completion, stdin)))
            except ValueError:  # max() of an empty list
                continue
        return tests

    shown = cases(_shown(family.inputs))
    suffix = "_".join(str(v) for v in params.values())
    return Task(
        id=f"synthetic-stdio/{family.name}/{suffix}",
        prompt=prompt,
        tests=shown + cases(family.inputs),
        reference=prompt + completion,
        difficulty=family.difficulty,
        source="synthetic",
        prompt_is_code=True,
        split=split,
        public_tests=len(shown),
    )


# kind: (its families, the task maker, the prefix of their names in the held-out draw)
KINDS = {"function": (FAMILIES, _make_task, ""), "stdio": (STDIO_FAMILIES, _make_stdio_task, "stdio/")}


def synthetic_suite(
    heldout_fraction: float = 0.2, max_difficulty: int = 3, kinds: Iterable[str] = ("function",)
) -> dict[str, list[Task]]:
    """The synthetic tasks of `kinds` (KINDS), split into 'train' and 'heldout' (disjoint by
    family and constants)."""
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown synthetic task kinds {unknown}; the kinds are {sorted(KINDS)}")
    splits: dict[str, list[Task]] = {"train": [], "heldout": []}
    for kind in kinds:
        families, make_task, prefix = KINDS[kind]
        for family in families:
            if family.difficulty > max_difficulty:
                continue
            members = list(family.params())
            flags = [_held_out(prefix + family.name, p, heldout_fraction) for p in members]
            if not any(flags):  # every family is represented in the held-out split
                flags[0] = True
            if all(flags):
                flags[-1] = False
            for params, held in zip(members, flags):
                split = "heldout" if held else "train"
                splits[split].append(make_task(family, params, split))
    return splits


def corpus_for_tokenizer(kinds: Iterable[str] = ("function",)) -> Iterable[str]:
    """Text the tiny model's tokenizer is trained on: the train programs of the suite's `kinds`
    (and the function tasks' asserts) plus common Python."""
    for task in synthetic_suite(kinds=kinds)["train"]:
        yield task.reference
        if task.test_kind == "assert":
            yield "\n".join(task.held)
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
