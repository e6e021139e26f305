"""Mutants of a reference solution: the same program with one small bug (an off-by-one, a swapped
operator). The SFT warm-up shows a mutant as a wrong first attempt, the sandbox's real feedback on
it, then the reference as the fix (rollout_workers/demonstrations.py).

Sites are found with `tokenize`, so strings and comments are never touched, and each edit replaces
one token's exact characters, so the rest of the program is byte-identical (formatting included).
"""
from __future__ import annotations

import ast
import io
import keyword
import tokenize
import warnings

# token text -> its replacements, in rule order
_OPERATORS = {
    "<": ("<=",), "<=": ("<",), ">": (">=",), ">=": (">",), "==": ("!=",), "!=": ("==",),
    "+": ("-",), "-": ("+",), "*": ("+",), "//": ("%",), "%": ("//",), "+=": ("-=",), "-=": ("+=",),
}
_NAMES = {"and": ("or",), "or": ("and",), "True": ("False",), "False": ("True",), "min": ("max",), "max": ("min",)}
# Python 3.12+ tokenizes an f-string into parts; their expressions are left alone as the whole
# f-string is on 3.10-3.11 (one STRING token), so that a program has the same mutants on each.
_FSTRING_START = getattr(tokenize, "FSTRING_START", None)
_FSTRING_END = getattr(tokenize, "FSTRING_END", None)
_SKIPPED = {tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT}


def mutants(program: str, start: int = 0, limit: int | None = None) -> list[str]:
    """Programs that differ from `program` (Python source) by one small edit inside program[start:]
    (the part after a task's prompt: the prompt itself is never changed), each of which still compiles;
    distinct, deterministic order (by site, then by rule), at most `limit`. [] if `program` does not compile."""
    if not _compiles(program):
        return []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(program).readline))
    except (SyntaxError, tokenize.TokenError):
        return []
    line_starts = [0]
    for line in program.split("\n"):
        line_starts.append(line_starts[-1] + len(line) + 1)
    found: list[str] = []
    seen = {program}
    for begin, end, replacement in _edits(tokens, line_starts):
        if limit is not None and len(found) >= limit:
            break
        if begin < start:
            continue
        candidate = program[:begin] + replacement + program[end:]
        if candidate not in seen and _compiles(candidate):
            seen.add(candidate)
            found.append(candidate)
    return found


def _edits(tokens: list[tokenize.TokenInfo], line_starts: list[int]):
    """(begin, end, replacement) character spans of each token to change, in source order."""
    fstring_depth = 0
    previous: tokenize.TokenInfo | None = None  # the last token that is code, for telling binary * from unpacking
    for token in tokens:
        if token.type == _FSTRING_START:
            fstring_depth += 1
        elif token.type == _FSTRING_END:
            fstring_depth -= 1
        elif fstring_depth == 0:
            begin = line_starts[token.start[0] - 1] + token.start[1]
            end = line_starts[token.end[0] - 1] + token.end[1]
            for replacement in _replacements(token, previous):
                yield begin, end, replacement
        if token.type not in _SKIPPED:
            previous = token


def _replacements(token: tokenize.TokenInfo, previous: tokenize.TokenInfo | None) -> tuple[str, ...]:
    if token.type == tokenize.NUMBER:
        value = ast.literal_eval(token.string)
        return (str(value + 1), str(value - 1)) if type(value) is int else ()
    if token.type == tokenize.NAME:
        return _NAMES.get(token.string, ())
    if token.type == tokenize.OP:
        if token.string == "*" and not _ends_operand(previous):
            return ()  # f(*args), import *, def f(*, k): unpacking, not multiplication
        return _OPERATORS.get(token.string, ())
    return ()


def _ends_operand(token: tokenize.TokenInfo | None) -> bool:
    if token is None:
        return False
    if token.type == tokenize.NAME:
        return not keyword.iskeyword(token.string) or token.string in ("True", "False", "None")
    return token.type in (tokenize.NUMBER, tokenize.STRING, _FSTRING_END) or token.string in (")", "]", "}")


def _compiles(source: str) -> bool:
    # quietly: a reference's own warnings (an invalid escape like "\d") would repeat once per mutant
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            compile(source, "<mutant>", "exec")
        except (SyntaxError, ValueError):
            return False
    return True
