"""An example reward component (reward_service/components.py): the data-flow match of CodeBLEU
(Ren et al., 2020), through the `codebleu` package, between the program and the task's reference
solution. The dense-reward PPO design adds this signal next to syntax, lint and tests.

The score is CodeBLEU's data-flow match: the share of the reference's data-flow edges (a variable
and the variables its value comes from, names normalised), from codebleu's graph, that the program
has too. Two differences: the normalisation is deterministic (`_edges`), and comments and
docstrings stay in (they add no flow, and the blamed positions are then the program's). The
blamed spans are the program's own edges that the reference does not have, at the variable that
receives the value: a value computed from the wrong variables. A task without a reference in
Python, or whose reference has no data flow (CodeBLEU's score would degenerate to 0 there), gets
no score.

    reward:
      components:
        - {name: dataflow, path: "reward_service.dataflow:dataflow_match", weight: 0.2}
"""
from __future__ import annotations

from collections import Counter
from functools import lru_cache

from reward_service.components import Score, Scored
from reward_service.schemas import Diagnostic


@lru_cache(maxsize=1)
def _parser():
    from codebleu.dataflow_match import dfg_function
    from codebleu.utils import get_tree_sitter_language
    from tree_sitter import Parser

    parser = Parser()
    parser.language = get_tree_sitter_language("python")
    return [parser, dfg_function["python"]]


def _edges(code: str) -> tuple[list, list]:
    """CodeBLEU's data-flow graph of `code` (each edge: variable, token index, relation, parents'
    names, parents' indices), in the order of the code, and each edge normalised for comparison:
    variables numbered in order of first definition (a name never defined here, such as a builtin,
    kept), parents as a sorted tuple. codebleu's own normalisation takes the parents in the order of
    a set of strings, which changes with the process's hash seed: its score of one pair of programs
    varied from process to process."""
    from codebleu.dataflow_match import get_data_flow

    graph = sorted(get_data_flow(code, _parser()), key=lambda edge: edge[1])
    ids: dict[str, str] = {}
    for edge in graph:
        ids.setdefault(edge[0], f"var_{len(ids)}")
    return graph, [(ids[e[0]], e[2], tuple(sorted(ids.get(p, p) for p in e[3]))) for e in graph]


def _token_points(code: str) -> list:
    from codebleu.parser import tree_to_token_index

    return tree_to_token_index(_parser()[0].parse(bytes(code, "utf8")).root_node)


def _characters(lines: list[str], row: int, column: int) -> int:
    """Tree-sitter's column (bytes of UTF-8) as characters, as a Diagnostic counts them."""
    return len(lines[row].encode()[:column].decode(errors="ignore")) if row < len(lines) else column


def dataflow_match(item: Scored) -> Score | None:
    task = item.task
    if task.language != "python" or not task.reference.strip():
        return None
    reference = Counter(_edges(task.reference)[1])
    if not reference:
        return None  # nothing to match: CodeBLEU's score would be 0 whatever the program
    graph, normalized = _edges(item.program)
    unmatched = Counter(reference)
    blamed = []
    for edge, key in zip(graph, normalized):
        if unmatched[key] > 0:
            unmatched[key] -= 1
        else:
            blamed.append(edge)
    score = 1.0 - sum(unmatched.values()) / sum(reference.values())
    points, lines = _token_points(item.program), item.program.split("\n")
    blame = []
    for edge in blamed if score < 1.0 else []:
        (row, column), (end_row, end_column) = points[edge[1]]
        blame.append(Diagnostic(code="dataflow", message=f"{edge[0].strip()} {edge[2]} {', '.join(sorted(edge[3]))}".strip(),
                                row=row + 1, column=_characters(lines, row, column) + 1,
                                end_row=end_row + 1, end_column=_characters(lines, end_row, end_column) + 1))
    return Score(score, blame)
