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
_PYTHON_TAGS = {"", "python", "py", "python3"}
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


def extract(completion: str, prompt_is_code: bool, entry_point: str | None = None) -> Extraction:
    """The code of a completion and its span.

    A completion that continues the prompt's code is code up to a closing fence, if any.
    Otherwise, among fenced blocks in Python (or untagged), the one defining the entry point is
    taken, else the first; an unterminated fence runs to the end. Without fences, the code is cut
    out of the prose around it.
    """
    if prompt_is_code:
        close = _CLOSING_FENCE.search(completion)
        return _span(completion, 0, close.start() if close else len(completion))
    blocks = [m for m in _FENCE.finditer(completion) if m.group(1).lower() in _PYTHON_TAGS]
    if not blocks:
        return _unfenced_code(completion)
    defines = re.compile(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.MULTILINE) if entry_point else None
    chosen = next((m for m in blocks if defines and defines.search(m.group(2))), blocks[0])
    return _span(completion, chosen.start(2), chosen.end(2))
