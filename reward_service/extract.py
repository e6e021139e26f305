"""Getting the program out of a completion, and where in the completion it lies.

The span matters as much as the text: per-token rewards map diagnostics in the program back to
the completion tokens that wrote them, and tokens outside the span (prose, fences) get none.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# A fence line with an optional language tag; its body runs to the closing fence or, for a
# completion cut off by the token limit, to the end of the text.
_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:^[ \t]*```|\Z)", re.DOTALL | re.MULTILINE)
# The fence tags taken as the task's language (Task.language); an untagged fence is taken too.
LANGUAGE_TAGS = {
    "python": {"", "python", "py", "python3"},
    "javascript": {"", "javascript", "js", "node", "nodejs"},
    "cpp": {"", "cpp", "c++", "cc", "cxx"},
}
# A reasoning model thinks first: its answer is what follows the last closing tag.
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# A closing fence where a continuation of the prompt's code ends (the model closing the prompt's fence).
_CLOSING_FENCE = re.compile(r"^[ \t]*```", re.MULTILINE)
# Lines that start a program written between sentences of prose.
_CODE_START = re.compile(r"^(?:def |async def |class |import |from \S+ import |@)")
# Top-level lines that continue a program once it started (prose lines do not look like these).
_CODE_LINE = re.compile(
    r"^(?:def |async def |class |import |from \S+ import |@|if |elif |else:|for |while |try:|except|finally:"
    r"|with |return\b|raise\b|assert |[A-Za-z_][\w.]*(?:\[.*\])?\s*(?:[-+*/%|&^]?=|\())"
)


@dataclass(frozen=True)
class Extraction:
    code: str
    start: int  # completion[start:end] == code
    end: int


def _span(completion: str, start: int, end: int) -> Extraction:
    return Extraction(completion[start:end], start, end)


def _unfenced_code(completion: str) -> Extraction:
    """Code between prose: from the first line that starts a program to the last line that still
    looks like code (indented, blank, or a top-level statement). No such line: the whole text."""
    lines = completion.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    first = next((i for i, line in enumerate(lines) if _CODE_START.match(line)), None)
    if first is None:
        return _span(completion, 0, len(completion))
    last = first
    for i in range(first + 1, len(lines)):
        line = lines[i]
        if not line.strip():
            continue
        if line[0] in " \t" or _CODE_LINE.match(line):
            last = i
        else:
            break
    return _span(completion, offsets[first], offsets[last + 1])


def never_answered(completion: str) -> bool:
    """A completion that opened a <think> and never closed it: it has no answer at all."""
    return _answer_start(completion) is None


def _answer_start(completion: str) -> int | None:
    """Where the answer of a completion begins: after the last </think>, or at 0 when it does not
    think; None when it opened a <think> that never closed (it has no answer)."""
    close = completion.rfind(THINK_CLOSE)
    if close >= 0:
        return close + len(THINK_CLOSE)
    return None if THINK_OPEN in completion else 0


def extract(completion: str, prompt_is_code: bool, entry_point: str | None = None, language: str = "python") -> Extraction:
    """The code of a completion and its span (offsets into `completion` itself).

    Only the answer is searched: what follows a closed <think> block (code while thinking is a
    draft, not the answer); a thinking that never closed has no code (an empty extraction at the
    end). A completion that continues the prompt's code is code up to a closing fence, if any.
    Otherwise, among fenced blocks tagged with the task's `language` (or untagged), the one
    defining (in Python) or naming the entry point is taken, else the first; an unterminated fence
    runs to the end. Without fences, Python code is cut out of the prose around it; another
    language's answer is taken whole.
    """
    if language not in LANGUAGE_TAGS:
        raise ValueError(f"no fence tags for language {language!r}: expected one of {sorted(LANGUAGE_TAGS)}")
    start = _answer_start(completion)
    if start is None:
        return _span(completion, len(completion), len(completion))
    found = _extract_answer(completion[start:], prompt_is_code, entry_point, language)
    return _span(completion, found.start + start, found.end + start)


def _extract_answer(answer: str, prompt_is_code: bool, entry_point: str | None, language: str) -> Extraction:
    if prompt_is_code:
        close = _CLOSING_FENCE.search(answer)
        return _span(answer, 0, close.start() if close else len(answer))
    tags = LANGUAGE_TAGS[language]
    blocks = [m for m in _FENCE.finditer(answer) if m.group(1).lower() in tags]
    if not blocks:
        return _unfenced_code(answer) if language == "python" else _span(answer, 0, len(answer))
    defines = None
    if entry_point:
        name = re.escape(entry_point)
        defines = re.compile(rf"^\s*(?:async\s+)?def\s+{name}\s*\(" if language == "python" else rf"\b{name}\b", re.MULTILINE)
    chosen = next((m for m in blocks if defines and defines.search(m.group(2))), blocks[0])
    return _span(answer, chosen.start(2), chosen.end(2))
