"""Wrong programs for checking a grader: one small edit of a right program each (a mutant), the
kind of slip a model makes. Each edit is one of: a comparison turned into its neighbour (< and
<=, > and >=, == and !=), + and -, * and //, / and //, `and` and `or`, an integer constant one
more or one less, True and False, min and max. Deterministic: the same program gives the same
mutants, in the order of the edits' places in its source.
"""
from __future__ import annotations

import ast
import warnings

SWAPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
         ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.Div: ast.FloorDiv, ast.FloorDiv: ast.Div,
         ast.And: ast.Or, ast.Or: ast.And}
NAMES = {"min": "max", "max": "min"}


def _edits(node: ast.AST) -> list[tuple[str, object]]:
    """The edits one node admits: (field, new value)."""
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in SWAPS:
        return [("ops", [SWAPS[type(node.ops[0])]()])]
    if isinstance(node, (ast.BinOp, ast.BoolOp)) and type(node.op) in SWAPS:
        return [("op", SWAPS[type(node.op)]())]
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return [("value", node.value + 1), ("value", node.value - 1)]
    if isinstance(node, ast.Constant) and type(node.value) is bool:
        return [("value", not node.value)]
    if isinstance(node, ast.Name) and node.id in NAMES:
        return [("id", NAMES[node.id])]
    return []


def _places(tree: ast.AST) -> list[tuple[int, str, object]]:
    """(index of the node in ast.walk order, field, new value) for every edit, skipping docstrings."""
    docstrings = {id(body[0].value) for node in ast.walk(tree) if isinstance(node, (ast.Module, ast.FunctionDef,
                  ast.AsyncFunctionDef, ast.ClassDef)) and (body := node.body) and isinstance(body[0], ast.Expr)}
    return [(i, field, value) for i, node in enumerate(ast.walk(tree)) if id(node) not in docstrings
            for field, value in _edits(node)]


def mutants(program: str, limit: int) -> list[str]:
    """At most `limit` mutants of `program`, spread evenly over its edit places, each differing from
    the program in one place and from each other; none when it does not parse."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            places = _places(ast.parse(program))
    except SyntaxError:
        return []
    chosen = places if len(places) <= limit else [places[round(j * (len(places) - 1) / max(1, limit - 1))] for j in range(limit)]
    original = ast.unparse(ast.parse(program))
    out: list[str] = []
    for index, field, value in chosen:
        tree = ast.parse(program)
        node = next(n for i, n in enumerate(ast.walk(tree)) if i == index)
        setattr(node, field, value)
        text = ast.unparse(tree) + "\n"
        if text.rstrip("\n") != original and text not in out:
            out.append(text)
    return out
