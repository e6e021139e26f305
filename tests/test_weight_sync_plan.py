"""Bucket plans and the checks of a weight push: pure logic, no peers."""
import pytest
import torch

from common.weight_sync import (
    PROBE_NAMES,
    WeightSyncError,
    float64_sum,
    float64_sums,
    plan_buckets,
    verify,
)


def named(*sizes, dtype=torch.float32):
    return [(f"p{i}", torch.zeros(n, dtype=dtype)) for i, n in enumerate(sizes)]


def test_buckets_fill_in_order_up_to_the_limit():
    plan = plan_buckets(named(10, 10, 10, 30, 5), bucket_bytes=80)  # 4 bytes each: 40, 40, 40, 120, 20
    assert [[s.name for s in b] for b in plan.buckets] == [["p0", "p1"], ["p2"], ["p3"], ["p4"]]
    assert plan.nbytes == 4 * 65


def test_a_dtype_change_starts_a_bucket_and_probes_are_found():
    items = [("model.embed_tokens.weight", torch.zeros(4)), ("x", torch.zeros(4, dtype=torch.bfloat16)),
             ("model.norm.weight", torch.zeros(2))]
    plan = plan_buckets(items, bucket_bytes=1 << 20)
    assert [[s.dtype for s in b] for b in plan.buckets] == [["float32"], ["bfloat16"], ["float32"]]
    assert plan.probes == PROBE_NAMES


def test_bad_plans_are_refused():
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets(named(1), 0)
    with pytest.raises(ValueError, match="unique"):
        plan_buckets([("a", torch.zeros(1)), ("a", torch.zeros(1))], 100)


def test_verify_names_the_bucket_or_probe_that_differs():
    items = [("model.embed_tokens.weight", torch.zeros(4)), ("w", torch.zeros(4)), ("model.norm.weight", torch.zeros(2))]
    plan = plan_buckets(items, bucket_bytes=16)
    assert len(plan.buckets) == 3
    sent = [1, 2, 3]
    expected = {"model.embed_tokens.weight": [1.0, 1.0, 4], "model.norm.weight": [3.0, 3.0, 2]}  # sum, magnitudes, n
    verify(plan, [1, 2, 3], sent, expected, {"model.embed_tokens.weight": 1.0, "model.norm.weight": 3.0})
    with pytest.raises(WeightSyncError, match=r"bucket 1 \(from w\)"):
        verify(plan, [1, 5, 3], sent, expected, {"model.embed_tokens.weight": 1.0, "model.norm.weight": 3.0})
    with pytest.raises(WeightSyncError, match="model.norm.weight in the engine sums to 0.0"):
        verify(plan, [1, 2, 3], sent, expected, {"model.embed_tokens.weight": 1.0, "model.norm.weight": 0.0})
    with pytest.raises(WeightSyncError, match="sums to None"):
        verify(plan, [1, 2, 3], sent, expected, {"model.embed_tokens.weight": 1.0})
    with pytest.raises(WeightSyncError, match="never took model.norm.weight"):
        verify(plan, [1, 2, 3], sent, {"model.embed_tokens.weight": [1.0, 1.0, 4]}, {"model.embed_tokens.weight": 1.0})


def test_a_probe_is_what_an_engine_of_its_dtype_holds():
    # A float32 learner's values in a bf16 engine: the engine's sum is of the rounded values, which the
    # receiver's expected sum follows; the unrounded sum is what a bf16 engine must not be held to.
    torch.manual_seed(0)
    sent = torch.randn(151_936 // 64, 896) * 0.02 + 1e-3
    plan = plan_buckets([("model.embed_tokens.weight", sent)], bucket_bytes=1 << 30)
    bf16_engine = {"model.embed_tokens.weight": float64_sum(sent.to(torch.bfloat16))}
    rounded = {"model.embed_tokens.weight": [*float64_sums(sent, rounded_to=torch.bfloat16), sent.numel()]}
    verify(plan, [0], [0], rounded, bf16_engine)
    unrounded = {"model.embed_tokens.weight": [*float64_sums(sent, rounded_to=torch.float32), sent.numel()]}
    with pytest.raises(WeightSyncError, match="rounded to its dtype"):
        verify(plan, [0], [0], unrounded, bf16_engine)
    verify(plan, [0], [0], unrounded, {"model.embed_tokens.weight": float64_sum(sent)})  # a float32 engine
