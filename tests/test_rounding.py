"""The cross-path tolerances of tests/rounding.py: rounding passes them, a real mismatch does not
(a wrong adapter scale, a step not taken or at another rate)."""
import pytest
import torch

from common.hf import load_causal_lm
from coderloo.tasksets.synthetic import synthetic_suite
from learner import lora
from learner.config import LoraSettings
from rollout_workers import GenerationParams
from rollout_workers.hf_backend import TransformersBackend
from tests.rounding import UNIT_ROUNDOFF, adam_moves, assert_same_adam_steps, compare_greedy

PROMPTS = [t.prompt for t in synthetic_suite()["heldout"][::6]]
GREEDY = GenerationParams(n=1, max_new_tokens=16, temperature=0.0)
TARGETS = ["q_proj", "v_proj", "up_proj", "down_proj"]


def merged(path, adapter: dict, rslora: bool):
    """The model with the adapter's weights merged at rsLoRA's scale (alpha / sqrt r) or plain LoRA's (alpha / r)."""
    from peft import set_peft_model_state_dict

    peft = lora.wrap(load_causal_lm(path), LoraSettings(rank=8, alpha=16, rslora=rslora, target_modules=TARGETS))
    set_peft_model_state_dict(peft, adapter)
    model = load_causal_lm(path)
    model.load_state_dict(lora.merged_weights(peft), strict=True)
    return model.eval()


def greedy(engine: TransformersBackend, model) -> tuple[list[list[int]], list[list[int]]]:
    engine.model = model
    rollouts = [r for _, r in engine.generate_stream(PROMPTS, GREEDY, 0)]
    return [r.prompt_ids for r in rollouts], [r.samples[0].token_ids for r in rollouts]


def test_greedy_outputs_of_a_wrong_adapter_scale_part_beyond_rounding(tiny_model):
    """rsLoRA scales the update by alpha / sqrt(rank), plain LoRA by alpha / rank: an engine that read
    the scale wrong parts from the right merged weights at margins far beyond float32 rounding."""
    torch.manual_seed(0)
    peft = lora.wrap(load_causal_lm(tiny_model), LoraSettings(rank=8, alpha=16, rslora=True, target_modules=TARGETS))
    with torch.no_grad():
        for _, p in lora.trainable(peft):
            p.add_(torch.randn_like(p) * 0.15)
    adapter = lora.adapter_weights(peft)
    engine = TransformersBackend(str(tiny_model))
    right = merged(tiny_model, adapter, rslora=True)
    prompt_ids, expected = greedy(engine, right)
    _, again = greedy(engine, merged(tiny_model, adapter, rslora=True))
    _, wrong = greedy(engine, merged(tiny_model, adapter, rslora=False))
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
