"""Per-token rewards on small examples, positions checked by hand against the tiny tokenizer."""
import pytest

from common.hf import load_tokenizer
from coderloo.tasksets.synthetic import synthetic_suite
from reward_service.tasks import Task
from reward_service.attribution import token_end_offsets, token_rewards
from reward_service.lint import ruff_check
from reward_service.scorer import RewardScorer, analyse
from reward_service.weights import RewardWeights
from sandbox_pool import ExecutionResult, Limits, Status

CODE_TASK = synthetic_suite()["train"][0]  # prompt: 'def solve(x):\n    """Return x plus 1."""\n'
PROSE_TASK = CODE_TASK.model_copy(update={"id": "prose", "prompt": "Write solve(x).", "prompt_is_code": False})


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return load_tokenizer(tiny_model)


def dense(tokenizer, task: Task, completion: str, weights: RewardWeights, passed: int, of: int):
    ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    analysis = analyse(task, completion)
    diagnostics = ruff_check(analysis.program, weights.lint_rules) if analysis.syntax_error is None else []
    result = ExecutionResult(
        status=Status.passed if passed == of else Status.failed,
        tests=[{"passed": i < passed} for i in range(of)], num_tests=of, duration_s=0.0,
    )
    reward = RewardScorer(None, Limits(), weights=weights).reward(task, analysis, result, diagnostics)
    pieces = [tokenizer.decode([i]) for i in ids]
    values, penalties = token_rewards(task, completion, reward, ids, tokenizer, weights)
    # the penalties are the part of the rewards that is not the outcome spread over the code
    return pieces, values, reward, penalties


def prefix_end_offsets(token_ids, tokenizer):
    """The oracle: the end of each token by decoding every prefix (quadratic; the running maximum
    keeps ends in order where a prefix ends inside a character and decodes to a replacement)."""
    ends, last = [], 0
    for i in range(1, len(token_ids) + 1):
        last = max(last, len(tokenizer.decode(token_ids[:i], skip_special_tokens=True)))
        ends.append(last)
    return ends


def test_token_end_offsets(tokenizer):
    ids = tokenizer("x = 1\n", add_special_tokens=False)["input_ids"]
    assert token_end_offsets(ids, tokenizer)[-1] == len("x = 1\n")
    # the one-pass stream agrees with decoding every prefix, special tokens (EOS) skipped
    for text in ("    return x + 1\n", "Here:\n```python\nx = eval(s)\n```\n", CODE_TASK.reference * 3):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        assert token_end_offsets(ids, tokenizer) == prefix_end_offsets(ids, tokenizer), text
    # a character split over tokens (byte-level BPE) belongs to the token that completes it
    ids = tokenizer("é = 1", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids[:1]) == "\ufffd" and tokenizer.decode(ids[:2]) == "é"  # its two bytes
    assert token_end_offsets(ids, tokenizer) == [0, 1, 3, 4, 5]
    assert prefix_end_offsets(ids, tokenizer) == [1, 1, 3, 4, 5]  # the replacement character counts


def test_lint_penalty_on_the_tokens_of_a_continuation(tokenizer):
    weights = RewardWeights(syntax=0.1, functionality=1.0, lint=0.5, lint_saturation=2)
    pieces, values, reward, penalties = dense(tokenizer, CODE_TASK, "    import os\n    return x + 1\n", weights, 4, 4)
    assert pieces == ["   ", " import", " ", "o", "s", "\n", "   ", " return", " x", " +", " ", "1", "\n"]
    shared = 1.1 / 13  # syntax and functionality spread over every (code) token
    penalty = 0.5 * 0.5 / 2  # F401 on `os` (program row 3, columns 12-14): tokens 'o' and 's'
    assert values == pytest.approx([shared] * 3 + [shared - penalty] * 2 + [shared] * 8)
    assert sum(values) == pytest.approx(reward.total)
    assert penalties == pytest.approx([0.0] * 3 + [-penalty] * 2 + [0.0] * 8)


def test_prose_and_fences_get_zero(tokenizer):
    weights = RewardWeights(syntax=0.1, functionality=1.0, lint=0.5, lint_rules=["S"])
    pieces, values, reward, penalties = dense(tokenizer, PROSE_TASK, "Here:\n```python\nx = eval(s)\n```\n", weights, 1, 2)
    assert pieces[10:17] == ["x", " =", " e", "v", "al", "(s", ")\n"]  # the code: completion[16:28]
    shared = (0.1 + 0.5) / 7
    penalty = 0.5 * (1 / 5) / 5  # S307 covers `eval(s)` (columns 5-12): tokens ' e' to ')\n'
    assert values[:10] == [0.0] * 10 and values[17:] == [0.0] * 4
    assert values[10:17] == pytest.approx([shared] * 2 + [shared - penalty] * 5)
    assert sum(values) == pytest.approx(reward.total)
    assert penalties == pytest.approx([0.0] * 12 + [-penalty] * 5 + [0.0] * 4)


def test_syntax_error_penalty_at_its_position(tokenizer):
    weights = RewardWeights(syntax=0.1, functionality=1.0)
    pieces, values, reward, penalties = dense(tokenizer, CODE_TASK, "    return (x +\n", weights, 0, 3)
    assert reward.components.syntax == 0.0 and reward.total == 0.0
    # "'(' was never closed" at program row 3, column 12: completion character 11, the '(' token
    at = next(i for i, p in enumerate(pieces) if "(" in p)
    assert values == pytest.approx([-0.1 if i == at else 0.0 for i in range(len(pieces))])
    assert penalties == values  # nothing to spread: every part of it is the error's
