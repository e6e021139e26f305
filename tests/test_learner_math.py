"""Losses and batch packing: pure functions, checked against hand values (the advantage estimators:
tests/test_advantage_estimators.py)."""
import math

import pytest
import torch
from pydantic import TypeAdapter, ValidationError

from learner.advantages import rloo_advantages, whiten
from learner.batch import TrainSequence, pack, prefix_trees
from learner.config import PolicyLoss
from learner.packing import cost, deal_to_ranks, pack_by_tokens, rows_of, split_even
from learner.losses import LossInputs, policy_loss, sft_loss, token_logprobs, value_loss
from tests.autograd_memory import saved_bytes
from tests.rounding import UNIT_ROUNDOFF



def loss_of(logprobs, step_start, advantages, mask, clip_eps=0.2, sampler_logprobs=None, mismatch=None, ref_logprobs=None,
            kl_coef=0.0, normalizer=None, segments=None):
    """policy_loss with one advantage per sequence ([B]) or per token ([B, T])."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1).expand_as(logprobs)
    inputs = LossInputs(logprobs, step_start, step_start if sampler_logprobs is None else sampler_logprobs, advantages, mask, ref_logprobs,
                        segments)
    return policy_loss(inputs, _family(eps_low=clip_eps, eps_high=clip_eps, mismatch=mismatch), kl_coef, "k3", normalizer)

def test_whiten_scales_to_unit_std():
    adv = rloo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]]))
    out = whiten(adv)
    assert torch.allclose(out.std(unbiased=False), torch.tensor(1.0), atol=1e-4)
    assert torch.allclose(out / out[0, 0], adv / adv[0, 0])  # same direction, only scaled


def test_policy_loss_gradient_on_policy():
    # With logprobs equal to the sampler's, ratio = 1 and d loss / d logprob_t = -A * mask_t / sum(mask).
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -0.1]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    advantages = torch.tensor([2.0, -1.0])
    loss, stats = loss_of(logprobs, logprobs.detach().clone(), advantages, mask, clip_eps=0.2)
    loss.backward()
    expected = -advantages[:, None] * mask / mask.sum()
    assert torch.allclose(logprobs.grad, expected)
    assert loss.item() == pytest.approx(-(2.0 * 2 - 1.0 * 3) / 5)
    assert stats["clip_fraction"] == 0.0


def test_policy_loss_clips_the_ratio():
    # A positive advantage with a ratio above 1 + eps: clipped, so no gradient flows.
    old = torch.tensor([[-2.0, -2.0]])
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)  # ratio e^1 at t=0, 1 at t=1
    loss, stats = loss_of(logprobs, old, torch.tensor([1.0]), torch.ones(1, 2), clip_eps=0.2)
    loss.backward()
    assert logprobs.grad[0, 0].item() == 0.0
    assert logprobs.grad[0, 1].item() == pytest.approx(-0.5)
    assert stats["clip_fraction"] == 0.5
    assert loss.item() == pytest.approx(-(1.2 + 1.0) / 2)


def test_truncated_importance_sampling_weights_each_token():
    # p_old / p_sampler is e^-0.5 on token 0 (kept) and e^2 on token 1 (truncated at the cap).
    old = torch.tensor([[-1.0, -1.0]])
    sampler = torch.tensor([[-0.5, -3.0]])
    logprobs = old.clone().requires_grad_(True)
    loss, stats = loss_of(logprobs, old, torch.tensor([1.0]), torch.ones(1, 2), clip_eps=0.2,
                          sampler_logprobs=sampler, mismatch={"mode": "token_truncate", "cap": 2.0})
    loss.backward()
    w0 = torch.exp(torch.tensor(-0.5)).item()
    assert logprobs.grad[0].tolist() == pytest.approx([-w0 / 2, -2.0 / 2])
    assert stats["mismatch_weight_mean"] == pytest.approx((w0 + 2.0) / 2)
    assert stats["mismatch_truncated_fraction"] == 0.5
    # Without a correction the sampler's logprobs are ignored.
    plain, _ = loss_of(old.clone().requires_grad_(True), old, torch.tensor([1.0]), torch.ones(1, 2), 0.2,
                       sampler_logprobs=sampler, mismatch=None)
    assert plain.item() == pytest.approx(-1.0)


# Two packed rows of three sequences: row 0 holds sequences 0 (tokens 0-1) and 1 (token 2), row 1
# sequence 2 (tokens 0-1, token 2 padding). Per token log(p_step_start / p_sampler):
MISMATCH_LOG_RATIO = torch.tensor([[0.5, 0.4, -2.0], [0.1, -0.3, 0.0]])
MISMATCH_SEGMENTS = torch.tensor([[0, 0, 1], [2, 2, -1]])
MISMATCH_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def _mismatch_case(mode: str, **bounds):
    old = torch.full((2, 3), -1.0)
    logprobs = old.clone().requires_grad_(True)
    loss, stats = loss_of(logprobs, old, torch.tensor([1.0, 1.0]), MISMATCH_MASK, 0.2, sampler_logprobs=old - MISMATCH_LOG_RATIO,
                          mismatch={"mode": mode, **bounds}, segments=MISMATCH_SEGMENTS)
    loss.backward()
    # on policy (ratio 1, advantage 1, token mean over 5 tokens): each token's gradient is -weight / 5
    return (-logprobs.grad * 5 * MISMATCH_MASK), stats


@pytest.mark.parametrize("mode, bounds, weights, changed", [
    # per token: e^0.5 = 1.65, e^0.4 = 1.49, e^0.1 and e^-0.3 = 0.74 kept; e^-2 = 0.14 below 1/2, the default floor
    ("token_mask", {"cap": 2.0}, [[0.5, 0.4, None], [0.1, -0.3, None]], 1 / 5),
    # IcePop's band [0.5, 5]: the same tokens
    ("token_mask", {"cap": 5.0, "floor": 0.5}, [[0.5, 0.4, None], [0.1, -0.3, None]], 1 / 5),
    # a cap of 1.5 drops e^0.5; a floor of 0.1 keeps e^-2
    ("token_mask", {"cap": 1.5, "floor": 0.1}, [[None, 0.4, -2.0], [0.1, -0.3, None]], 1 / 5),
    # per sequence, in [1/3, 3]: sequence 0's e^0.9 = 2.46 and sequence 2's e^-0.2 kept, sequence 1's e^-2 dropped
    ("sequence_mask", {"cap": 3.0}, [[0.9, 0.9, None], [-0.2, -0.2, None]], 1 / 5),
    # in [1/2, 2]: sequence 0 dropped too
    ("sequence_mask", {"cap": 2.0}, [[None, None, None], [-0.2, -0.2, None]], 3 / 5),
    # truncated per sequence at 2 (sequence 0) and from below at 0.5 (sequence 1)
    ("sequence_truncate", {"cap": 2.0, "floor": 0.5}, [[math.log(2.0)] * 2 + [math.log(0.5)], [-0.2, -0.2, None]], 3 / 5),
])
def test_mismatch_modes_weigh_tokens_and_sequences(mode, bounds, weights, changed):
    grads, stats = _mismatch_case(mode, **bounds)
    expected = torch.tensor([[0.0 if w is None else math.exp(w) for w in row] for row in weights]) * MISMATCH_MASK
    assert torch.allclose(grads, expected, atol=1e-6)
    masked_or_truncated = stats["mismatch_masked_fraction" if mode.endswith("mask") else "mismatch_truncated_fraction"]
    assert masked_or_truncated == pytest.approx(changed)
    assert stats["mismatch_weight_mean"] == pytest.approx(expected.sum().item() / 5)


def test_mismatch_statistics_are_the_sequences_log_ratios_and_a_k3_kl():
    _, stats = _mismatch_case("token_truncate", cap=2.0)
    sequences = torch.tensor([0.9, -2.0, -0.2])
    assert stats["mismatch_sequence_log_ratio_mean"] == pytest.approx(sequences.mean().item())
    assert stats["mismatch_sequence_log_ratio_std"] == pytest.approx(sequences.std(correction=0).item())
    d = MISMATCH_LOG_RATIO[MISMATCH_MASK.bool()]
    assert stats["mismatch_kl_k3"] == pytest.approx((torch.exp(d) - 1 - d).mean().item())
    assert stats["mismatch_kl_k3"] > 0


def test_mismatch_band_and_vespo_are_validated():
    with pytest.raises(ValueError, match="floor 3.0 must be below cap 2.0"):
        _family(mismatch={"cap": 2.0, "floor": 3.0})
    with pytest.raises(ValueError, match="vespo takes token_truncate or token_mask"):
        _family("vespo", mismatch={"mode": "sequence_mask"})


def test_kl_penalty_is_zero_at_the_reference_and_positive_elsewhere():
    lp = torch.tensor([[-1.0, -1.0]])
    mask = torch.ones(1, 2)
    zero = torch.zeros(1)
    loss_same, stats_same = loss_of(lp, lp, zero, mask, 0.2, ref_logprobs=lp, kl_coef=0.5)
    assert stats_same["kl"] == 0.0 and loss_same.item() == 0.0
    loss_far, stats_far = loss_of(lp, lp, zero, mask, 0.2, ref_logprobs=lp - 1.0, kl_coef=0.5)
    kl = torch.exp(torch.tensor(-1.0)) + 1.0 - 1.0  # k3 with delta = -1
    assert stats_far["kl"] == pytest.approx(kl.item())
    assert loss_far.item() == pytest.approx(0.5 * kl.item())


def test_token_logprobs_aligns_next_tokens_and_applies_temperature():
    logits = torch.randn(1, 3, 5)
    ids = torch.tensor([[1, 4, 2]])
    lp = token_logprobs(logits, ids, temperature=2.0)
    expected = (logits[0, :2] / 2.0).log_softmax(-1)[torch.arange(2), torch.tensor([4, 2])]
    assert torch.allclose(lp[0], expected)


def test_sft_loss_is_masked_nll():
    lp = torch.tensor([[-1.0, -3.0, -5.0]])
    assert sft_loss(lp, torch.tensor([[0.0, 1.0, 1.0]])).item() == pytest.approx(4.0)


def test_pack_masks_only_completion_positions():
    seqs = [TrainSequence([5, 6, 7], [8, 9], [-0.1, -0.2], [1.0, 1.0]), TrainSequence([5], [8, 9, 10], [-1.0, -2.0, -3.0], [-1.0] * 3)]
    b = pack(seqs, pad_id=0, packed=False)
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 8, 9, 10, 0]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]  # padding continues its row's sequence
    assert b.padding_share == pytest.approx(0.1)
    # position t predicts token t+1: completion tokens of row 0 are predicted at 2 and 3
    assert b.completion_mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 0]]
    assert torch.allclose(b.sampler_logprobs, torch.tensor([[0, 0, -0.1, -0.2], [-1.0, -2.0, -3.0, 0]]))
    assert torch.equal(b.advantages, torch.tensor([[0, 0, 1.0, 1.0], [-1.0, -1.0, -1.0, 0]]))


def test_pack_puts_sequences_end_to_end_each_from_position_0():
    seqs = [TrainSequence([5, 6, 7], [8, 9], [-0.1, -0.2], [1.0, 1.0]), TrainSequence([5], [8], [-1.0], [2.0]),
            TrainSequence([4, 6], [7], [-3.0], [3.0])]
    b = pack(seqs, pad_id=0)
    # rows as wide as the longest (5): it alone, then the 3-token and the 2-token sequences
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9], [4, 6, 7, 5, 8]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]]
    assert b.placements == [(0, 2), (1, 3), (1, 1)]  # each one's row and first prediction's column
    assert b.segments.tolist() == [[-1, -1, 0, 0], [-1, 2, -1, 1]]
    assert b.completion_mask.tolist() == [[0, 0, 1, 1], [0, 1, 0, 1]]  # position 2 of row 1 predicts the next sequence's prompt
    assert b.padding_share == 0.0
    assert b.completion_rows(seqs, b.advantages) == [[1.0, 1.0], [2.0], [3.0]]
    assert sum(b.completion_rows(seqs, b.sampler_logprobs), []) == pytest.approx([-0.1, -0.2, -1.0, -3.0])
    assert "attention_mask" not in b.model_inputs()  # it would join a row's sequences


def test_packed_rows_give_each_sequence_the_logprobs_it_has_alone(tiny_model):
    """transformers keeps a row's sequences apart by their position ids (no attention mask), with
    the tiny model's attention implementation: packed equals padded."""
    from common.hf import load_causal_lm
    from learner.logits import chunked_logprobs, final_hidden_states
    from tests.rounding import logprob_bound

    model = load_causal_lm(tiny_model).eval()
    generator = torch.Generator().manual_seed(0)
    seqs = [TrainSequence(torch.randint(100, (p,), generator=generator).tolist(), torch.randint(100, (c,), generator=generator).tolist())
            for p, c in [(6, 30), (4, 10), (8, 12), (3, 5), (5, 9)]]
    out = {}
    for layout, packed, row_tokens, mask_dtype in (("packed", True, 0, None), ("one row", True, 200, None),
                                                   ("one row, additive mask", True, 200, torch.float32), ("padded", False, 0, None)):
        b = pack(seqs, pad_id=0, packed=packed, row_tokens=row_tokens)
        with torch.no_grad():
            hidden = final_hidden_states(model, model, b.model_inputs(mask_dtype=mask_dtype))
            logprobs = chunked_logprobs(hidden, model.get_output_embeddings(), b.input_ids, b.completion_positions, 1.0, 64)
        out[layout] = (b, b.completion_rows(seqs, logprobs))
    assert out["packed"][0].input_ids.shape[0] < len(seqs) and out["packed"][0].padding_share < out["padded"][0].padding_share
    assert out["one row"][0].input_ids.shape[0] == 1
    bound = logprob_bound(model, 200)  # other rows, other shapes: the same sums rounded otherwise
    for layout in ("packed", "one row", "one row, additive mask"):
        for packed_row, padded_row in zip(out[layout][1], out["padded"][1]):
            assert torch.tensor(packed_row) == pytest.approx(torch.tensor(padded_row), abs=bound)


def test_an_additive_mask_is_kept_once_for_all_layers_not_once_per_layer(tiny_model):
    """Rows of packed sequences need a mask; a boolean one (transformers' own, from the position
    ids) is converted to float by torch's attention in each layer, each copy kept for the backward.
    The additive mask (learner.actor's under sdpa) is one tensor that every layer keeps a view of."""
    from common.hf import load_causal_lm
    from learner.batch import packed_mask
    from learner.logits import final_hidden_states

    model = load_causal_lm(tiny_model)
    assert model.config._attn_implementation == "sdpa" and model.config.num_hidden_layers >= 2
    seqs = [TrainSequence(list(range(1, 40)), list(range(40, 120))) for _ in range(4)]
    b = pack(seqs, pad_id=0, packed=True, row_tokens=480)
    width = b.input_ids.shape[1]
    assert b.input_ids.shape[0] == 1 and packed_mask(b.position_ids).shape == (1, 1, width, width)
    assert packed_mask(pack(seqs[:1], pad_id=0).position_ids) is None  # one sequence a row: no mask
    kept = {kind: saved_bytes(model, lambda inputs=b.model_inputs(mask_dtype=kind): final_hidden_states(model, model, inputs))
            for kind in (None, torch.float32)}
    mask_bytes = width * width * 4
    layers = model.config.num_hidden_layers
    assert kept[None] - kept[torch.float32] >= (layers - 1) * mask_bytes


def test_pack_places_token_advantages_and_the_policy_mask_on_their_tokens():
    seqs = [TrainSequence([5, 6, 7], [8, 9], [-0.1, -0.2], [0.5, -2.0]),
            TrainSequence([5], [8, 9, 10], [-1.0, 0.0, -3.0], [-1.0, -1.0, -1.0], mask=[True, False, True])]
    b = pack(seqs, pad_id=0, packed=False)
    assert torch.equal(b.advantages, torch.tensor([[0, 0, 0.5, -2.0], [-1.0, -1.0, -1.0, 0]]))
    # the environment's token (mask False) is not trained on
    assert b.completion_mask.tolist() == [[0, 0, 1, 1], [1, 0, 1, 0]]


def test_pack_rejects_misaligned_logprobs_and_token_advantages():
    with pytest.raises(ValueError, match="2 sampler logprobs for 3 completion tokens"):
        pack([TrainSequence([1], [2, 3, 4], [0.0, 0.0])], pad_id=0)
    with pytest.raises(ValueError, match="sequence 1: 4 advantages for 3 completion tokens"):
        pack([TrainSequence([1], [2], [0.0]), TrainSequence([1], [2, 3, 4], [0.0] * 3, [0.0] * 4)], pad_id=0)
    with pytest.raises(ValueError, match="sequence 0: 1 mask values for 3 completion tokens"):
        pack([TrainSequence([1], [2, 3, 4], mask=[True])], pad_id=0)


def test_policy_loss_gradient_of_each_token_scales_with_its_own_advantage():
    # Packed per-token advantages: on-policy, d loss / d logprob_t = -A_t / (completion tokens).
    seqs = [TrainSequence([5, 6], [8, 9, 4], [-1.0, -0.5, -2.0], [3.0, -1.0, 0.0]),
            TrainSequence([5], [7, 8], [-0.2, -0.3], [-0.5, -0.5])]
    b = pack(seqs, pad_id=0, packed=False)
    logprobs = b.sampler_logprobs.clone().requires_grad_(True)
    loss, _ = loss_of(logprobs, b.sampler_logprobs, b.advantages, b.completion_mask, clip_eps=0.2)
    loss.backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[0.0, -3.0, 1.0, 0.0], [0.5, 0.5, 0.0, 0.0]]) / 5)
    assert loss.item() == pytest.approx(-(3.0 - 1.0 + 0.0 - 0.5 - 0.5) / 5)


def test_split_even_covers_everything_in_order():
    chunks = split_even(list(range(7)), 3)
    assert chunks == [[0, 1, 2], [3, 4], [5, 6]]
    with pytest.raises(ValueError):
        split_even([1], 2)


def test_pack_by_tokens_respects_the_budget_counting_padding():
    lengths = [10, 50, 20, 20, 5, 45]
    bins = pack_by_tokens(lengths, max_tokens=100, packed=False)
    assert sorted(i for b in bins for i in b) == list(range(6))
    assert all(len(b) * max(lengths[i] for i in b) <= 100 for b in bins)
    assert len(bins) == 2  # [50, 45] and [20, 20, 10, 5]
    assert pack_by_tokens([300, 1], max_tokens=100) == [[0], [1]]  # too long for the budget: alone


def test_pack_by_tokens_counts_packed_rows():
    lengths = [50, 30, 20, 25, 25]
    bins = pack_by_tokens(lengths, max_tokens=100)
    # [50 | 30 20]: two rows of 50; padded, the 20 would have made a third row
    assert bins == [[0, 1, 2], [3, 4]]
    assert [cost(lengths, b) for b in bins] == [100, 50]
    assert rows_of(lengths, [0, 1, 2]) == [[0], [1, 2]]
    assert cost(lengths, [0, 1, 2], packed=False) == 150
    # rows of 100 tokens: one row holds [50 30 20], the whole budget is one row
    assert rows_of(lengths, [0, 1, 2], row_tokens=100) == [[0, 1, 2]]
    assert pack_by_tokens(lengths, max_tokens=100, row_tokens=100) == [[0, 1, 2], [3, 4]]
    assert cost(lengths, [3, 4], row_tokens=100) == 100


def test_pack_into_rows_of_a_set_width_leaves_padding_only_at_the_end():
    seqs = [TrainSequence([5, 6], [7]), TrainSequence([4], [8, 9]), TrainSequence([3], [2])]
    b = pack(seqs, pad_id=0, row_tokens=10)
    assert b.input_ids.tolist() == [[5, 6, 7, 4, 8, 9, 3, 2, 0, 0]]
    assert b.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 0, 1, 2, 3]]
    assert b.padding_share == pytest.approx(0.2)


def test_deal_to_ranks_gives_every_rank_the_same_number_of_passes():
    lengths = [30, 30, 30, 8, 8, 8, 8]
    ranks = deal_to_ranks(lengths, max_tokens=60, world_size=2)
    assert len(ranks[0]) == len(ranks[1])
    assert sorted(i for r in ranks for m in r for i in m) == list(range(7))
    with pytest.raises(ValueError, match="3 sequences cannot be shared among 4"):
        deal_to_ranks([1, 2, 3], 100, 4)


def test_token_normalizer_makes_micro_batch_losses_add_up_to_the_whole():
    # The sum of micro-batch losses with the mini-batch's normalizer equals the loss of the whole.
    torch.manual_seed(0)
    lp = torch.randn(4, 6)
    mask = (torch.rand(4, 6) > 0.3).float()
    adv = torch.randn(4)
    whole, _ = loss_of(lp, lp, adv, mask, 0.2)
    parts = [loss_of(lp[i:i + 2], lp[i:i + 2], adv[i:i + 2], mask[i:i + 2], 0.2, normalizer=mask.sum().item())[0] for i in (0, 2)]
    assert torch.allclose(sum(parts), whole)  # 24 terms in another order: 24 u (1.4e-6), within rtol 1e-5
    per_seq, _ = loss_of(lp, lp, adv, mask, 0.2, normalizer=4.0)  # sequence mean of token sums
    assert torch.allclose(per_seq, -(adv[:, None] * mask).sum() / 4)


def _family(type: str = "clip", **fields):
    """learner.loss of `type` without a mismatch correction unless `fields` give one."""
    return TypeAdapter(PolicyLoss).validate_python({"type": type, "mismatch": None, **fields})


def _off_policy_batch(rows: int = 6, width: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    step_start = -torch.rand(rows, width, generator=g) * 3
    logprobs = (step_start + 0.5 * torch.randn(rows, width, generator=g)).requires_grad_(True)
    mask = (torch.rand(rows, width, generator=g) > 0.3).float()
    mask[0] = 0.0  # a sequence with nothing trained on (a masked truncated completion)
    advantages = torch.randn(rows, 1, generator=g).expand(rows, width).clone()
    return logprobs, step_start, advantages, mask


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("surrogate,level", [("clip", "token"), ("clip", "sequence"), ("cispo", "token"), ("sapo", "token"), ("vespo", "token")])
def test_every_aggregation_is_independent_of_the_micro_batch_split(aggregation, surrogate, level):
    from learner.losses import loss_normalizer

    logprobs, step_start, advantages, mask = _off_policy_batch()
    fields = {} if surrogate == "vespo" else {"importance_level": level}
    config = _family(surrogate, aggregation=aggregation, **fields, **({"dual_clip": 3.0} if surrogate == "clip" else {}))
    whole, _ = policy_loss(LossInputs(logprobs, step_start, step_start, advantages, mask), config, max_new_tokens=8)
    grad_whole, = torch.autograd.grad(whole, logprobs)
    normalizer = loss_normalizer(aggregation, mask.sum(dim=1).tolist(), 8)
    for split in ([2, 4], [1, 2, 3], [5, 1]):
        total, start = 0.0, 0
        for rows in split:
            part = slice(start, start + rows)
            total = total + policy_loss(LossInputs(logprobs[part], step_start[part], step_start[part], advantages[part], mask[part]), config, normalizer=normalizer)[0]
            start += rows
        grad_parts, = torch.autograd.grad(total, logprobs)
        # 48 terms summed in another split: 48 u (3e-6) of values below 1, within allclose's rtol 1e-5 and atol 1e-6
        assert torch.allclose(total, whole, atol=1e-6) and torch.allclose(grad_parts, grad_whole, atol=1e-6)
    assert grad_whole.abs().max().item() > 1e-3


def test_aggregations_hand_values():
    # On-policy (ratio 1): token losses -A; rows of 1 and 3 trained tokens with A = 1 and 2.
    logprobs = torch.zeros(2, 4, requires_grad=True)
    advantages = torch.tensor([[1.0] * 4, [2.0] * 4])
    mask = torch.tensor([[1.0, 0, 0, 0], [1.0, 1.0, 1.0, 0]])
    expected = {
        "token_mean": -(1 + 6) / 4,  # all tokens alike
        "seq_mean_token_mean": -(1 / 1 + 6 / 3) / 2,  # each sequence's mean, then their mean
        "seq_mean_token_sum": -(1 + 6) / 2,  # token sums over sequences
        "seq_mean_token_sum_norm": -(1 + 6) / (2 * 8),  # over sequences x max_new_tokens (8)
    }
    for aggregation, value in expected.items():
        loss, _ = policy_loss(LossInputs(logprobs, logprobs.detach(), logprobs.detach(), advantages, mask), _family(aggregation=aggregation), max_new_tokens=8)
        assert loss.item() == pytest.approx(value), aggregation
    with pytest.raises(ValidationError, match="seq_mean_token_sum_norm"):
        _family(aggregation="seq_sum")


def test_clip_higher_and_the_clip_fractions_of_each_side():
    # ratios e^0.25 = 1.28 (A > 0) and e^-0.3 = 0.74 (A < 0): high clip at 1.28 vs 1.2, low clip at 0.8.
    step_start = torch.zeros(1, 3)
    logprobs = torch.tensor([[0.25, -0.3, 0.1]], requires_grad=True)
    advantages = torch.tensor([[1.0, -1.0, 1.0]])
    inputs = LossInputs(logprobs, step_start, step_start, advantages, torch.ones(1, 3))
    _, symmetric = policy_loss(inputs, _family())
    assert symmetric["clip_fraction_high"] == pytest.approx(1 / 3) and symmetric["clip_fraction_low"] == pytest.approx(1 / 3)
    assert symmetric["clip_fraction"] == pytest.approx(2 / 3)
    loss, higher = policy_loss(inputs, _family(eps_high=0.3))  # DAPO's clip-higher: 1.28 is inside [0.8, 1.3]
    assert higher["clip_fraction_high"] == 0.0 and higher["clip_fraction_low"] == pytest.approx(1 / 3)
    grad, = torch.autograd.grad(loss, logprobs)
    r = torch.exp(logprobs.detach())[0]
    assert grad[0].tolist() == pytest.approx([-r[0].item() / 3, 0.0, -r[2].item() / 3])  # the low-clipped token has none


def test_dual_clip_bounds_the_loss_of_negative_advantages():
    # A < 0 with ratios 1, 2 and 5: the plain clipped loss is r, r and r (max(r, clip(r)) = r there);
    # dual clip at c = 3 caps it at 3, and the capped token gets no gradient.
    step_start = torch.zeros(1, 3)
    logprobs = torch.log(torch.tensor([[1.0, 2.0, 5.0]])).requires_grad_(True)
    advantages = -torch.ones(1, 3)
    inputs = LossInputs(logprobs, step_start, step_start, advantages, torch.ones(1, 3))
    plain, _ = policy_loss(inputs, _family())
    assert plain.item() == pytest.approx((1 + 2 + 5) / 3)
    dual, stats = policy_loss(inputs, _family(dual_clip=3.0))
    assert dual.item() == pytest.approx((1 + 2 + 3) / 3)
    assert stats["clip_fraction_dual"] == pytest.approx(1 / 3)
    grad, = torch.autograd.grad(dual, logprobs)
    assert grad[0].tolist() == pytest.approx([1 / 3, 2 / 3, 0.0])
    # positive advantages are untouched by the dual clip
    inputs.advantages = torch.ones(1, 3)
    assert policy_loss(inputs, _family(dual_clip=3.0))[0].item() == pytest.approx(policy_loss(inputs, _family())[0].item())


def test_sequence_level_ratio_is_the_geometric_mean_of_the_token_ratios():
    # token log-ratios 0.1 and 0.3 (the third is masked out): the sequence ratio is e^0.2 for both tokens.
    step_start = torch.zeros(1, 3)
    logprobs = torch.tensor([[0.1, 0.3, 2.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    inputs = LossInputs(logprobs, step_start, step_start, torch.ones(1, 3), mask)
    loss, stats = policy_loss(inputs, _family(importance_level="sequence", eps_high=0.5))
    s = torch.exp(torch.tensor(0.2)).item()
    assert stats["ratio_mean"] == pytest.approx(s) and loss.item() == pytest.approx(-s)
    grad, = torch.autograd.grad(loss, logprobs)
    assert grad[0].tolist() == pytest.approx([-s / 2, -s / 2, 0.0])  # d s / d logp_t = s / |y| for each token
    # clipped per sequence: at eps_high 0.1 the whole sequence is clipped and has no gradient
    loss, stats = policy_loss(inputs, _family(importance_level="sequence", eps_high=0.1))
    assert stats["clip_fraction_high"] == 1.0 and torch.autograd.grad(loss, logprobs)[0].abs().sum().item() == 0.0


def test_cispo_keeps_a_gradient_on_clipped_tokens_through_a_stopped_weight():
    step_start = torch.zeros(1, 2)
    logprobs = torch.tensor([[0.5, 0.05]], requires_grad=True)  # ratios e^0.5 = 1.65 (capped at 1.2) and 1.05
    inputs = LossInputs(logprobs, step_start, step_start, torch.ones(1, 2), torch.ones(1, 2))
    loss, stats = policy_loss(inputs, _family("cispo"))
    w = [1.2, torch.exp(torch.tensor(0.05)).item()]
    assert loss.item() == pytest.approx(-(w[0] * 0.5 + w[1] * 0.05) / 2)
    grad, = torch.autograd.grad(loss, logprobs)
    assert grad[0].tolist() == pytest.approx([-w[0] / 2, -w[1] / 2])  # PPO's clip would give the first token 0
    assert stats["clip_fraction_high"] == 0.5


def test_sapo_and_vespo_hand_values():
    step_start = torch.zeros(1, 2)
    logprobs = torch.tensor([[0.2, -0.1]], requires_grad=True)
    advantages = torch.tensor([[1.0, -1.0]])
    inputs = LossInputs(logprobs, step_start, step_start, advantages, torch.ones(1, 2))
    loss, _ = policy_loss(inputs, _family("sapo", tau_pos=1.0, tau_neg=2.0))
    r = torch.exp(logprobs.detach())[0]
    gate = [torch.sigmoid(1.0 * (r[0] - 1)) * 4 / 1.0, torch.sigmoid(2.0 * (r[1] - 1)) * 4 / 2.0]
    assert loss.item() == pytest.approx((-gate[0] * 1.0 + gate[1] * 1.0).item() / 2)
    # VESPO: w = the product of the token ratios = e^0.1; phi = e^lam w^k e^-lam w by the sign of A
    loss, _ = policy_loss(inputs, _family("vespo", k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0))
    w = torch.exp(torch.tensor(0.1))
    phi_pos, phi_neg = torch.exp(3.0 + 2.0 * 0.1 - 3.0 * w), torch.exp(2.0 + 3.0 * 0.1 - 2.0 * w)
    assert loss.item() == pytest.approx((-phi_pos * 0.2 + phi_neg * -0.1).item() / 2)
    grad, = torch.autograd.grad(loss, logprobs)
    assert grad[0].tolist() == pytest.approx([-phi_pos.item() / 2, phi_neg.item() / 2])  # the weight has no gradient


def test_two_sided_clip_caps_the_unclipped_ratio():
    step_start = torch.zeros(1, 1)
    logprobs = torch.log(torch.tensor([[4.0]])).requires_grad_(True)
    inputs = LossInputs(logprobs, step_start, step_start, -torch.ones(1, 1), torch.ones(1, 1))
    assert policy_loss(inputs, _family())[0].item() == pytest.approx(4.0)
    assert policy_loss(inputs, _family(delta=2.5))[0].item() == pytest.approx(2.5)


def test_token_entropy():
    from learner.losses import token_entropy

    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [10.0, -10.0, -10.0, -10.0], [0.0] * 4]])
    h = token_entropy(logits)
    assert h.shape == (1, 2)
    assert h[0, 0].item() == pytest.approx(math.log(4)) and h[0, 1].item() == pytest.approx(0.0, abs=1e-6)
    # at a higher temperature the peaked distribution spreads out
    assert token_entropy(logits, temperature=10.0)[0, 1].item() > 0.5


def test_kl_estimators():
    from learner.losses import kl_penalty

    lp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    assert torch.allclose(kl_penalty(lp, ref, "k1"), lp - ref)
    d = ref - lp
    assert torch.allclose(kl_penalty(lp, ref, "k3"), torch.exp(d) - d - 1)
    with pytest.raises(ValueError, match="unknown KL estimator 'k2'"):
        kl_penalty(lp, ref, "k2")


def test_clipped_value_loss_by_hand():
    values = torch.tensor([[1.0, 0.0, 0.6, 5.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.5, 0.5, 0.0]])
    returns = torch.tensor([[2.0, 0.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last token is not trained on
    loss, stats = value_loss(values, old, returns, mask, clip=0.2)
    # token 0: max((1 - 2)^2, (0.7 - 2)^2) = 1.69; token 1: max(0, 0.3^2) = 0.09; token 2: within the clip, 0.16
    assert loss.item() == pytest.approx(0.5 * (1.69 + 0.09 + 0.16) / 3)
    assert stats["value_clip_fraction"] == pytest.approx(2 / 3) and stats["value_mean"] == pytest.approx(1.6 / 3)
    loss.backward()
    # a clipped term is flat in the value: no gradient moves it further than the clip allows
    assert values.grad[0].tolist() == pytest.approx([0.0, 0.0, (0.6 - 1.0) / 3, 0.0])
    plain, _ = value_loss(values, old, returns, mask, clip=None, normalizer=6.0)
    assert plain.item() == pytest.approx(0.5 * (1.0 + 0.0 + 0.16) / 6)


def openrlhf_value_loss(values, old_values, returns, action_mask, clip_eps):
    """The peer: OpenRLHF's ValueLoss (openrlhf/models/loss.py), written out here (not installed)."""
    values_clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
    surr1 = (values_clipped - returns) ** 2
    surr2 = (values - returns) ** 2
    loss = torch.max(surr1, surr2)
    return 0.5 * (loss * action_mask).sum() / action_mask.sum()


def test_value_loss_matches_openrlhf():
    torch.manual_seed(0)
    values = torch.randn(3, 9, requires_grad=True)
    old, returns = values.detach() + 0.3 * torch.randn(3, 9), torch.randn(3, 9)
    mask = (torch.arange(9) < torch.tensor([[9], [4], [1]])).float()
    ours, _ = value_loss(values, old, returns, mask, clip=0.2)
    (our_grad,) = torch.autograd.grad(ours, values)
    theirs = openrlhf_value_loss(values, old, returns, mask, 0.2)
    (their_grad,) = torch.autograd.grad(theirs, values)
    # 27 squared errors (of one sign) summed in another order: 27 u (1.6e-6) relative, within allclose's rtol
    # 1e-5; each gradient is its own term's (no sum)
    assert torch.allclose(ours, theirs, atol=1e-7) and torch.allclose(our_grad, their_grad, atol=1e-7)


def test_prefix_trees_compute_a_groups_prompt_and_a_turns_earlier_turns_once():
    prompt, other = [1, 2, 3, 4], [9, 8, 7]
    group = [TrainSequence(prompt, [5, 6]), TrainSequence(prompt, [5, 7, 7]), TrainSequence(prompt, [5, 6])]
    turns = [TrainSequence(other, [10, 11]), TrainSequence(other + [10, 11, 12, 13], [14])]  # turn 2's context repeats turn 1
    trees = prefix_trees(turns[::-1] + group)  # the later turn first: turns are placed shortest context first
    assert [t.members for t in trees] == [[0, 1], [2, 3, 4]]
    chain, fan = trees
    # the prompt but its last token once; per sample its own last prompt token and completion (the
    # two equal samples too: each trains on its own tokens)
    assert fan.tokens == [1, 2, 3] + [4, 5, 6] + [4, 5, 7, 7] + [4, 5, 6]
    assert fan.parents == [-1, 0, 1] + [2, 3, 4] + [2, 6, 7, 8] + [2, 10, 11]
    assert fan.depths == [0, 1, 2] + [3, 4, 5] + [3, 4, 5, 6] + [3, 4, 5]
    assert sorted(fan.starts) == [(2, 3), (3, 6), (4, 10)]
    # turn 2 reads turn 1's columns as its context and adds its observation, last context token and completion
    assert chain.tokens == [9, 8] + [7, 10, 11] + [12] + [13, 14]
    assert chain.parents == [-1, 0, 1, 2, 3, 4, 5, 6]
    assert sorted(chain.starts) == [(0, 6), (1, 2)]
    seen = fan.visibility()
    assert seen[8].tolist() == [True] * 3 + [False] * 3 + [True] * 3 + [False] * 4  # sample 2's 3rd completion token
    assert sum(len(t.tokens) for t in trees) == 21 < sum(len(s.prompt_ids) + len(s.completion_ids) for s in turns + group) == 32
    # a tree within max_tokens columns: the third sample would make it 13 wide, so it starts another
    assert [(t.members, len(t.tokens)) for t in prefix_trees(group, max_tokens=10)] == [([0, 1], 10), ([2], 6)]


def test_a_shared_prefix_batch_places_each_sequences_values_at_its_own_columns():
    seqs = [TrainSequence([1, 2, 3], [4, 5], [-0.1, -0.2], [1.0, 1.0]), TrainSequence([1, 2, 3], [6], [-0.3], [2.0]),
            TrainSequence([7, 8], [9], [-0.4], [3.0])]
    b = pack(seqs, pad_id=0, share_prefixes=True)
    assert b.input_ids.tolist() == [[1, 2, 3, 4, 5, 3, 6], [7, 8, 9, 0, 0, 0, 0]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4, 2, 3], [0, 1, 2, 3, 4, 5, 6]]
    assert b.placements == [(0, 2), (0, 5), (1, 1)]
    assert b.segments.tolist() == [[-1, -1, 0, 0, -1, 1], [-1, 2, -1, -1, -1, -1]]
    assert b.completion_rows(seqs, b.advantages) == [[1.0, 1.0], [2.0], [3.0]]
    assert (b.computed_tokens, b.sequence_tokens) == (10, 12)
    mask = b.attention_mask[0, 0]
    assert mask[5].tolist() == [True, True, False, False, False, True, False]  # the second copy of 3 sees 1, 2 and itself
    assert b.attention_mask[1, 0, 4].tolist() == [False] * 4 + [True, False, False]  # padding sees itself only


@pytest.mark.parametrize("fields", [{"aggregation": "seq_mean_token_mean"}, {"importance_level": "sequence", "aggregation": "seq_mean_token_mean"},
                                    {"type": "vespo"}])
def test_per_sequence_terms_follow_the_sequences_of_a_packed_row(fields):
    """A packed row holds several sequences: each sequence's mean, GSPO's sequence ratio and VESPO's
    weight are those of the sequence (as with one sequence a row), not of the row."""
    g = torch.Generator().manual_seed(1)
    lengths = [(3, 6), (2, 2), (4, 1), (1, 3), (2, 5)]
    seqs = [TrainSequence(list(range(1, p + 1)), list(range(1, c + 1)), (-torch.rand(c, generator=g)).tolist(),
                          torch.randn(c, generator=g).tolist(), values=(-torch.rand(c, generator=g)).tolist()) for p, c in lengths]
    config = _family(**fields)
    losses, grads = [], []
    for packed in (True, False):
        b = pack(seqs, pad_id=0, packed=packed)
        logprobs = b.sampler_logprobs.clone().requires_grad_(True)  # values of each sequence's own, wherever placed
        # old_values carry made-up step-start logprobs
        inputs = LossInputs(logprobs, b.old_values, b.old_values, b.advantages, b.completion_mask, segments=b.segments if packed else None)
        loss, _ = policy_loss(inputs, config, max_new_tokens=8)
        loss.backward()
        losses.append(loss.item())
        grads.append(b.completion_rows(seqs, logprobs.grad))
        if packed:
            assert b.input_ids.shape[0] < len(seqs)  # some row holds several
            rowwise = policy_loss(LossInputs(logprobs, b.old_values, b.old_values, b.advantages, b.completion_mask), config, max_new_tokens=8)[0]
    # the same 17 per-token terms summed in other orders: 17 u of their sizes' sum, each at most
    # e (the ratio of logprobs in (-1, 0)) times its advantage; a token's gradient sums at most its
    # sequence's 6 terms: 6 u relative, within rel 1e-6 (17 u)
    tokens = sum(c for _, c in lengths)
    scale = math.e * sum(abs(a) for s in seqs for a in s.advantages)
    assert losses[0] == pytest.approx(losses[1], abs=tokens * UNIT_ROUNDOFF * scale)
    assert sum(grads[0], []) == pytest.approx(sum(grads[1], []), rel=1e-6, abs=1e-9)
    assert rowwise.item() != pytest.approx(losses[1], rel=1e-3)  # what a row taken for one sequence gives
