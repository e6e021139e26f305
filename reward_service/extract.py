"""Getting the program out of a completion, and where in the completion it lies.

The span matters as much as the text: per-token rewards map diagnostics in the program back to
the completion tokens that wrote them, and tokens outside the span (prose, fences) get none.
"""
from __future__ import annotations

import ast
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


def sanitize(code: str, entry_point: str) -> str:
    """A whole-program answer to a function task as EvalPlus's sanitizer keeps it for the verdict
    (evalplus.sanitize, which its codegen applies to every answer, and Qwen2.5-Coder's report with
    it): the top-level imports, and the definitions (functions, classes, assignments) that the
    entry point reaches by name; the rest (a model's own asserts and prints, a __main__ block, an
    unused helper) is blanked out line by line, so that each kept line keeps its place and its
    diagnostics their position in the completion. Code that does not parse, or does not define the
    entry point at the top level (a method of a class), is left as it is.

    Code that does not parse (an answer cut off by the token limit, a broken assert after the
    function) is cut to its longest prefix that does, as EvalPlus cuts it to its longest block that
    does. Where EvalPlus's tree-sitter rules differ, Python's are kept: a function without a return
    statement is kept (EvalPlus drops it), and the last of two definitions of a name is the one
    that counts (EvalPlus keeps the first)."""
    lines = code.splitlines(keepends=True)
    tree, end = _parsed_prefix(lines)
    if tree is None:
        return code
    defined: dict[str, list[ast.stmt]] = {}
    imports, others = [], []
    for node in tree.body:
        name = _defined_name(node)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(node)
        elif name is not None:
            defined.setdefault(name, []).append(node)
        else:
            others.append(node)
    if entry_point not in defined:
        return code
    reached, queue = {entry_point}, [entry_point]
    while queue:
        for node in defined.get(queue.pop(), []):
            for used in _names_used(node) - reached:
                if used in defined:
                    reached.add(used)
                    queue.append(used)
    kept = imports + [node for name in reached for node in defined[name]]
    dropped = others + [node for name, nodes in defined.items() if name not in reached for node in nodes]
    keep = {line for node in kept for line in _lines(node)}
    blank = ({line for node in dropped for line in _lines(node)} | set(range(end + 1, len(lines) + 1))) - keep
    if not blank:
        return code
    return "".join("\n" if i in blank else line for i, line in enumerate(lines, start=1))


def _parsed_prefix(lines: list[str]) -> tuple[ast.Module | None, int]:
    """The syntax tree of the longest prefix of `lines` that parses, and its number of lines."""
    end = len(lines)
    while end > 0:
        try:
            return ast.parse("".join(lines[:end])), end
        except SyntaxError as e:  # the statement at the error, or one that began before it, is cut
            end = min(end - 1, (e.lineno or end) - 1) if e.lineno and e.lineno <= end else end - 1
        except ValueError:  # null bytes: nothing of it runs
            break
    return None, 0


def _defined_name(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return targets[0].id if len(targets) == 1 and isinstance(targets[0], ast.Name) else None


def _names_used(node: ast.stmt) -> set[str]:
    """Every identifier in `node`, as EvalPlus gathers a definition's dependencies."""
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))}


def _lines(node: ast.stmt) -> range:
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return range(first, node.end_lineno + 1)
