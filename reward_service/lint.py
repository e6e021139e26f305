"""Ruff diagnostics of a program, and the position of a syntax error, both as program positions."""
from __future__ import annotations

import json
import subprocess
import warnings

from ruff.__main__ import find_ruff_bin

from reward_service.schemas import Diagnostic

RUFF = find_ruff_bin()


def ruff_check(program: str, rules: list[str]) -> list[Diagnostic]:
    """Ruff's diagnostics of `program` for the selected rules. Syntax errors are left out: the
    syntax component already counts them, and a program that does not parse gets no lint rules."""
    out = subprocess.run(
        [RUFF, "check", "--isolated", "--no-cache", "--exit-zero", "--output-format", "json",
         "--select", ",".join(rules), "--stdin-filename", "program.py", "-"],
        # a lone surrogate (possible in JSON input) must not stop the check of the rest
        input=program.encode("utf-8", "replace"),
        capture_output=True,
        timeout=30,
        check=True,
    ).stdout
    return [
        Diagnostic(code=d["code"], message=d["message"], row=d["location"]["row"], column=d["location"]["column"],
                   end_row=d["end_location"]["row"], end_column=d["end_location"]["column"])
        for d in json.loads(out)
        if d["code"] and d["code"] != "invalid-syntax"
    ]


def syntax_error(program: str) -> Diagnostic | None:
    """Where the program fails to parse or compile; None when it compiles."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a model's odd literals are not the trainer's warnings
            compile(program, "<completion>", "exec")  # parses and compiles; executes nothing
        return None
    except SyntaxError as e:
        row, column = e.lineno or 1, e.offset or 1
        end_row, end_column = e.end_lineno or row, e.end_offset or column
        end_column = max(end_column, column + 1) if end_row == row else end_column
        return Diagnostic(code="syntax", message=e.msg, row=row, column=column, end_row=end_row, end_column=end_column)
    except (ValueError, RecursionError, MemoryError) as e:  # null bytes, too deep nesting: no position
        return Diagnostic(code="syntax", message=str(e) or type(e).__name__, row=1, column=1, end_row=1, end_column=1)
