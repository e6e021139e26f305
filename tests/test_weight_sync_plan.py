"""Bucket plans and the checks of a weight push: pure logic, no peers."""
import pytest
import torch

from common.weight_sync import (
    PROBE_NAMES,
    WeightSyncError,
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
    trailer = [1.0, 2.0, 3.0, 1.0, 3.0]  # three bucket sums, then the two probes
    verify(plan, [1.0, 2.0, 3.0], trailer, {"model.embed_tokens.weight": 1.0, "model.norm.weight": 3.0})
    with pytest.raises(WeightSyncError, match=r"bucket 1 \(from w\)"):
        verify(plan, [1.0, 2.5, 3.0], trailer, {"model.embed_tokens.weight": 1.0, "model.norm.weight": 3.0})
    with pytest.raises(WeightSyncError, match="model.norm.weight in the engine sums to 0.0"):
        verify(plan, [1.0, 2.0, 3.0], trailer, {"model.embed_tokens.weight": 1.0, "model.norm.weight": 0.0})
    with pytest.raises(WeightSyncError, match="sums to None"):
        verify(plan, [1.0, 2.0, 3.0], trailer, {"model.embed_tokens.weight": 1.0})
