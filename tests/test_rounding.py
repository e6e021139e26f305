"""The cross-path tolerances of tests/rounding.py: rounding passes them, a real mismatch does not
(a wrong adapter scale, a step not taken or at another rate)."""
import pytest
import torch

from common.hf import load_causal_lm, load_tokenizer
from coderloo.tasksets.synthetic import synthetic_suite
from learner import lora
from learner.config import LoraSettings
from tests.rounding import UNIT_ROUNDOFF, adam_moves, assert_same_adam_steps, compare_greedy

PROMPTS = [t.prompt for t in synthetic_suite()["heldout"][::6]]


def greedy(model, prompt_ids: list[list[int]], eos: int) -> list[list[int]]:
    out = []
    for ids in prompt_ids:
        seq = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=16, eos_token_id=eos, pad_token_id=eos)[0, len(ids):].tolist()
        out.append(seq[: seq.index(eos) + 1] if eos in seq else seq)
    return out


def merged_model(path, adapter: dict, scale: float):
    """The model with W + scale * B A in every adapted layer."""
    model = load_causal_lm(path)
    state = model.state_dict()
    with torch.no_grad():
        for name in state:
            a = adapter.get(f"base_model.model.{name.removesuffix('.weight')}.lora_A.weight")
            if a is not None:
                state[name] += scale * adapter[f"base_model.model.{name.removesuffix('.weight')}.lora_B.weight"] @ a
    model.load_state_dict(state)
    return model.eval()


def test_greedy_outputs_of_a_wrong_adapter_scale_part_beyond_rounding(tiny_model):
    """rsLoRA scales the update by alpha / sqrt(rank), plain LoRA by alpha / rank: an engine that read
    the scale wrong parts from the right merged weights at margins far beyond float32 rounding."""
    torch.manual_seed(0)
    peft = lora.wrap(load_causal_lm(tiny_model), LoraSettings(rank=8, alpha=16, rslora=True, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"]))
    with torch.no_grad():
        for _, p in lora.trainable(peft):
            p.add_(torch.randn_like(p) * 0.15)
    adapter = lora.adapter_weights(peft)
    tokenizer = load_tokenizer(tiny_model)
    prompt_ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    right = merged_model(tiny_model, adapter, 16 / 8**0.5)
    with torch.no_grad():
        expected = greedy(right, prompt_ids, tokenizer.eos_token_id)
        again = greedy(merged_model(tiny_model, adapter, 16 / 8**0.5), prompt_ids, tokenizer.eos_token_id)
        wrong = greedy(merged_model(tiny_model, adapter, 16 / 8), prompt_ids, tokenizer.eos_token_id)
    assert len({tuple(ids) for ids in expected}) >= 4
    same = compare_greedy(right, prompt_ids, expected, again, lora_rank=8)
    assert same.near_ties == [] and same.compared == sum(map(len, expected))
    with pytest.raises(AssertionError, match="beyond float32 rounding"):
        compare_greedy(right, prompt_ids, expected, wrong, lora_rank=8)


def adam(weights: dict, grads: list[dict], lr: float) -> dict:
    params = {n: torch.nn.Parameter(t.clone()) for n, t in weights.items()}
    optimizer = torch.optim.AdamW(params.values(), lr=lr, weight_decay=0.0)
    for g in grads:
        for n, p in params.items():
            p.grad = g[n].clone()
        optimizer.step()
    return {n: p.detach() for n, p in params.items()}


def test_adam_steps_agree_to_rounding_flips_and_not_beyond():
    """Two paths' gradients that differ by rounding (a relative u per element, and one element
    within rounding of zero whose sign differs) pass; the same steps at 1.1 times the rate, one step
    fewer, or a gradient of another direction do not."""
    g = torch.Generator().manual_seed(0)
    weights = {"w": torch.randn(200, 100, generator=g), "b": torch.randn(100, generator=g)}
    grads = [{n: torch.randn(t.shape, generator=g) * 1e-3 for n, t in weights.items()} for _ in range(2)]
    for step in grads:
        step["w"][0, 0] = 1e-7  # within rounding of zero (terms of 1e-3): the other path's sign may be either
    rounded = [{n: t * (1 + UNIT_ROUNDOFF * torch.randn(t.shape, generator=g)) for n, t in step.items()} for step in grads]
    for step in rounded:
        step["w"][0, 0] = -1e-7
    tokens, lr = 100, 1e-3
    want = adam(weights, grads, lr)
    assert assert_same_adam_steps(adam(weights, rounded, lr), want, weights, lr, 2, tokens) == 1
    for got in (adam(weights, grads, 1.1 * lr), adam(weights, grads[:1], lr),
                adam(weights, [{n: torch.randn(t.shape, generator=g) * 1e-3 for n, t in weights.items()} for _ in range(2)], lr)):
        with pytest.raises(AssertionError):
            assert_same_adam_steps(got, want, weights, lr, 2, tokens)


def test_adams_reach_is_its_largest_step():
    """A gradient that points one way at every step moves a weight by lr a step (no more): the
    bound holds with equality at the first step and stays within it after."""
    assert adam_moves(1) == 1.0
    w = {"w": torch.zeros(1)}
    for steps in (1, 2, 5, 10):
        moved = float(adam(w, [{"w": torch.tensor([1.0 if t % 2 == 0 else 1e-3])} for t in range(steps)], 1.0)["w"].abs())
        assert moved <= adam_moves(steps) + 1e-6
