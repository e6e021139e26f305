"""Whether a case's output or a call's result is the expected one. Standard library only: the
supervisor (stdin/stdout cases, compared outside the sandbox) and the tester (call cases) import it
as `matching`, the package as `sandbox_pool.matching`. Both sides of every comparison are values
built outside the program's process (its bytes, or plain values the tester rebuilt from JSON).

The rules are the ones APPS, CodeContests and LiveCodeBench grade by, made explicit per task
(`OutputMatch` in results.py):

- tokens (default): the outputs split at ASCII whitespace (space, tab, newline, CR, VT, FF, as
  the contests' checkers split; not at Unicode spaces such as U+3000, nor at the separators
  U+001C-U+001F and U+0085, where Python's str.split also splits) give the same number of
  tokens, and each pair is equal as text, or both are integers of equal value, or (with a
  tolerance) the expected one is a decimal or exponent number and the two are within
  tolerance * max(1, |expected|). An integer is never matched by tolerance: 1000001 is not
  1000000. Numbers are ASCII digits only (not what float() also reads: other scripts' digits, 1_000).
- lines: the same lines, each without trailing ASCII whitespace, trailing blank lines ignored.
- exact: the same text.

A call's result is compared as JSON types: a bool matches only a bool (Python's True == 1 does not
hold here), a tuple equals the list of its items, and numbers within the tolerance.
"""
import math
import re

SPACE = " \t\n\r\v\f"
TOKEN = re.compile(f"[^{SPACE}]+")
INTEGER = re.compile(r"[+-]?[0-9]+")


def outputs_match(got: str, expected: str, mode: str = "tokens", tolerance=1e-6) -> bool:
    if mode == "exact":
        return got == expected
    if mode == "lines":
        return _lines(got) == _lines(expected)
    if mode != "tokens":
        raise ValueError(f"unknown output match mode {mode!r}")
    ours, theirs = _tokens(got), _tokens(expected)
    return len(ours) == len(theirs) and all(_token_matches(a, b, tolerance) for a, b in zip(ours, theirs))


def _tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


def _lines(text: str) -> list[str]:
    lines = [line.rstrip(SPACE) for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _token_matches(got: str, expected: str, tolerance) -> bool:
    if got == expected:
        return True
    if INTEGER.fullmatch(expected):
        return INTEGER.fullmatch(got) is not None and int(got) == int(expected)
    # float() also reads other scripts' digits and 1_000; a number here is ASCII without underscores
    if tolerance is None or not (got.isascii() and expected.isascii()) or "_" in got or "_" in expected:
        return False
    try:
        a, b = float(got), float(expected)
    except ValueError:
        return False
    return math.isfinite(a) and math.isfinite(b) and _close(a, b, tolerance)


def _close(a: float, b: float, tolerance: float) -> bool:
    return abs(a - b) <= tolerance * max(1.0, abs(b))


def values_match(got, expected, tolerance=1e-6) -> bool:
    """A call's result against an expected JSON value: Python's ==, except that a bool matches only
    a bool, a tuple equals the list of its items (JSON has no tuples), and floats compare within the
    tolerance."""
    if isinstance(got, bool) or isinstance(expected, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(got, tuple):
        got = list(got)
    if isinstance(got, list) and isinstance(expected, list):
        return len(got) == len(expected) and all(values_match(a, b, tolerance) for a, b in zip(got, expected))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(values_match(got[k], expected[k], tolerance) for k in got)
    numbers = (int, float)
    if (tolerance is not None and type(got) in numbers and type(expected) in numbers
            and float in (type(got), type(expected))):
        return math.isfinite(got) and math.isfinite(expected) and _close(got, expected, tolerance)
    return type(got) in (type(None), bool, int, float, str, list, dict, set, frozenset, bytes, complex) and got == expected
