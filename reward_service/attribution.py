"""Per-token (dense) rewards: each part of a reward goes to the completion tokens that earned it.

The outcome of the tests (and the syntax, performance, coverage and plugged-in components' terms)
is spread evenly over the tokens of the code; a lint diagnostic's penalty, a syntax error's and the
shortfall of coverage (on the lines no test ran) or of a plugged-in component that blamed spans fall
on the tokens that wrote the offending characters.
Tokens outside the code (prose, fences) get zero. Apart from a syntax error (whose -syntax weight
the scalar total expresses as a missing +syntax weight), the values sum to the total.
"""
from __future__ import annotations

from tokenizers.decoders import DecodeStream

from reward_service.components import ComponentSpec
from reward_service.extract import extract
from reward_service.schemas import Diagnostic, ItemReward
from reward_service.tasks import Task
from reward_service.weights import RewardWeights


def token_end_offsets(token_ids: list[int], tokenizer) -> list[int]:
    """The end of each token in the decoded completion, in characters.

    From the decoded text of the sampler's ids, not from re-tokenizing the text with offsets: the
    sampler's ids need not be the ids the tokenizer would give the text. The fast tokenizer decodes
    them as a stream, in one pass; a token that ends inside a multi-byte character adds nothing,
    and the token that completes it adds the character.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"per-token rewards need a fast tokenizer; {type(tokenizer).__name__} is not one")
    stream, ends, length = DecodeStream(skip_special_tokens=True), [], 0
    for token in token_ids:
        length += len(stream.step(backend, token) or "")
        ends.append(length)
    return ends


def _completion_span(diag: Diagnostic, program: str, code_offset: int, code_start: int) -> tuple[int, int]:
    """The characters of the completion a program diagnostic covers (at least one character)."""
    line_starts = [0]
    for line in program.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))

    def offset(row: int, column: int) -> int:
        return line_starts[min(row, len(line_starts)) - 1] + column - 1 - code_offset + code_start

    start, end = offset(diag.row, diag.column), offset(diag.end_row, diag.end_column)
    return start, max(end, start + 1)


def token_rewards(
    task: Task, completion: str, reward: ItemReward, token_ids: list[int], tokenizer, weights: RewardWeights,
    components: list[ComponentSpec] = (),
) -> tuple[list[float], list[float]]:
    """Per completion token, aligned with `token_ids`: its reward, and the part of it that is a
    penalty of the tokens that caused it (the rest is the outcome spread over the code). A
    plugged-in component's weighted score is spread over the code too; where it blamed spans, its
    whole weight is spread and the score's shortfall, weight x (1 - score), falls on the tokens that
    wrote them."""
    ends = token_end_offsets(token_ids, tokenizer)
    spans = list(zip([0] + ends[:-1], ends))
    ex = extract(completion, task.prompt_is_code, task.entry_point, task.language)
    code_tokens = [i for i, (s, e) in enumerate(spans) if e > s and s < ex.end and e > ex.start]
    out = [0.0] * len(token_ids)
    penalized = [0.0] * len(token_ids)
    if not code_tokens:
        return out, penalized
    c = reward.components
    # (name, weight, score) of coverage and each plugged-in component: spread, and a blamed shortfall
    weight_of = {"coverage": weights.coverage, **{s.name: s.weight for s in components}}
    scored = [(name, weight_of.get(name, 0.0), score) for name, score in c.shaping().items() if score is not None and weight_of.get(name)]
    domain = sum(weight * (1.0 if reward.blame.get(name) else score) for name, weight, score in scored)
    shared = (
        weights.syntax * c.syntax + weights.functionality * c.functionality + weights.performance * (c.performance or 0.0)
        + domain
    ) / len(code_tokens)
    for i in code_tokens:
        out[i] = shared

    program = task.program(ex.code)
    code_offset = len(task.prompt) if task.prompt_is_code else 0
    lint = [d for d in reward.diagnostics if d.code != "syntax"]
    penalties = [(d, weights.syntax) for d in reward.diagnostics if d.code == "syntax"]
    if lint:
        each = weights.lint * (c.lint or 0.0) / len(lint)
        penalties += [(d, each) for d in lint]
    for name, weight, score in scored:
        blame = reward.blame.get(name) or []
        penalties += [(d, weight * (1.0 - score) / len(blame)) for d in blame]
    for diag, penalty in penalties:
        start, end = _completion_span(diag, program, code_offset, ex.start)
        if end <= ex.start:
            continue  # in the prompt: not the completion's doing
        hit = [i for i in code_tokens if spans[i][0] < end and spans[i][1] > start] or [code_tokens[-1]]  # past the end: EOF
        for i in hit:
            out[i] -= penalty / len(hit)
            penalized[i] -= penalty / len(hit)
    return out, penalized
