"""The tiny model builder, the tokenizer round trip, the synthetic suite and pass@k."""
import json
import math

import pytest
from pydantic import ValidationError
from tokenizers import Tokenizer

from coderloo.evaluation import pass_at_k
from common.hf import load_causal_lm, load_tokenizer
from coderloo.tasksets.synthetic import FAMILIES, synthetic_suite
from reward_service.tasks import Task, TaskFileError, load_jsonl

TEXTS = [
    'def solve(xs):\n    """Return the items of xs greater than 12."""\n    return [v for v in xs if v > 12]\n',
    "x = 1234567890 + 0.5e-3  # héllo wörld ✓\n\tif x:\r\n        pass\n\n",
    "print('<|endoftext|> is special')",
]


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_ids_survive_save_and_reload(tiny_model, tmp_path, text):
    raw = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))  # the ids as trained
    tok = load_tokenizer(tiny_model)
    tok.save_pretrained(tmp_path)
    json.loads((tmp_path / "tokenizer_config.json").read_text())
    again = load_tokenizer(tmp_path)
    expected = raw.encode(text).ids
    assert tok(text)["input_ids"] == expected
    assert again(text)["input_ids"] == expected
    assert again.decode(expected) == text


def test_digits_are_single_tokens(tiny_model):
    tok = load_tokenizer(tiny_model)
    ids = tok("x + 1234")["input_ids"]
    assert [tok.decode([i]) for i in ids][-4:] == ["1", "2", "3", "4"]


def test_tiny_model_loads_as_a_causal_lm(tiny_model):
    model = load_causal_lm(tiny_model)
    assert model.config.model_type == "qwen2"
    assert model.config.tie_word_embeddings
    assert model.config.vocab_size == len(load_tokenizer(tiny_model))


def test_synthetic_splits_are_disjoint_and_cover_every_family():
    suite = synthetic_suite()
    train, heldout = suite["train"], suite["heldout"]
    assert not {t.id for t in train} & {t.id for t in heldout}
    assert not {t.prompt for t in train} & {t.prompt for t in heldout}
    families = {f"synthetic/{family.name}" for family in FAMILIES}
    assert {t.family for t in heldout} == {t.family for t in train} == families
    assert {t.difficulty for t in heldout} == {1, 2, 3}
    assert train[0].model_copy(update={"id": "mbpp/11", "source": "mbpp"}).family == "mbpp"  # a benchmark's: its source


def test_synthetic_references_pass_and_tests_tell_family_members_apart():
    suite = synthetic_suite()
    tasks = suite["train"] + suite["heldout"]
    by_family: dict[str, list] = {}
    for task in tasks:
        scope: dict = {}
        exec(task.reference, scope)  # our own generated code
        for test in task.tests:
            exec(test, scope)
        by_family.setdefault(task.id.split("/")[1], []).append(task)
    # Each member's reference fails some test of every other member of its family: the tests
    # check the constants, so a model cannot pass by writing the right shape with wrong numbers.
    for members in by_family.values():
        for a in members:
            scope: dict = {}
            exec(a.reference, scope)
            for b in members:
                if a is b:
                    continue
                failed = 0
                for test in b.tests:  # the tests that decide the reward
                    try:
                        exec(test, dict(scope))
                    except AssertionError:
                        failed += 1
                assert failed, f"{a.id} passes every test of {b.id}"


def test_malformed_task_file_names_file_line_and_reason(tmp_path):
    good = synthetic_suite()["train"][0].model_dump_json()
    path = tmp_path / "tasks.jsonl"
    path.write_text(good + "\n" + '{"id": "x", "prompt": "p"}\n')
    with pytest.raises(TaskFileError, match=r"tasks.jsonl:2: invalid task: tests: Field required"):
        load_jsonl(path)
    path.write_text(good + "\n\n" + "{not json\n")
    with pytest.raises(TaskFileError, match=r"tasks.jsonl:3: invalid JSON"):
        load_jsonl(path)


@pytest.mark.parametrize("fields, reason", [
    ({"tests": [{"stdin": "1", "stdout": "1"}], "test_setup": "import os"}, "test_setup goes with statement tests only"),
    ({"tests": [{"args": [1], "accepted": [1]}], "entry_point": "f", "language": "cpp"}, "cpp requests take"),
    ({"tests": [{"args": [1], "accepted": [1]}]}, "call cases need the entry_point"),
    ({"tests": ["assert True"], "language": "javascript"}, "statements are Python"),
    ({"tests": ["assert True"], "public_tests": 2}, "public_tests is 2 but the task has 1 tests"),
])
def test_a_task_the_sandbox_would_refuse_is_refused_naming_why(fields, reason):
    """A task is held to the sandbox's own rules when it is read (the reward service answers 422, not
    a 500 when scoring it: schemathesis found a test_setup on stdin/stdout cases)."""
    base = {"id": "t/1", "prompt": "p", "reference": "", "difficulty": 1, "source": "t", "prompt_is_code": False}
    with pytest.raises(ValidationError, match=reason):
        Task(**base, **fields)
    assert Task(**base, tests=["assert True"], test_setup="import os").test_kind == "assert"


def test_pass_at_k_unbiased_estimator():
    assert pass_at_k(10, 0, 1) == 0.0
    assert pass_at_k(10, 10, 5) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(5, 2))
    assert pass_at_k(4, 1, 4) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
