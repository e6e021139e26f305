"""Advantage estimators, losses and batch packing: pure functions, checked against hand values."""
import pytest
import torch

from learner.advantages import rloo_advantages, whiten
from learner.batch import TrainSequence, pack
from learner.packing import deal_to_ranks, pack_by_tokens, split_even
from learner.losses import LossConfig, LossInputs, policy_loss, sft_loss, token_logprobs



def loss_of(logprobs, step_start, advantages, mask, clip_eps=0.2, sampler_logprobs=None, tis_cap=None, ref_logprobs=None,
            kl_coef=0.0, normalizer=None):
    """policy_loss with one advantage per sequence ([B]) or per token ([B, T])."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1).expand_as(logprobs)
    inputs = LossInputs(logprobs, step_start, step_start if sampler_logprobs is None else sampler_logprobs, advantages, mask, ref_logprobs)
    config = LossConfig(clip_eps=clip_eps, tis_cap=tis_cap, kl_coef=kl_coef, kl_estimator="k3", aggregation="token_mean", temperature=1.0)
    return policy_loss(inputs, config, normalizer)

def test_rloo_example_from_the_issue():
    adv = rloo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    assert torch.allclose(adv, torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3]]))


def test_rloo_groups_are_independent_and_sum_to_zero():
    rewards = torch.tensor([[0.5, 0.5, 0.5], [3.0, 0.0, 0.0], [0.0, 1.0, 2.0]])
    adv = rloo_advantages(rewards)
    assert torch.allclose(adv[0], torch.zeros(3))  # equal rewards: no signal
    assert torch.allclose(adv[1], torch.tensor([3.0, -1.5, -1.5]))
    assert torch.allclose(adv[2], torch.tensor([-1.5, 0.0, 1.5]))
    assert torch.allclose(adv.sum(dim=1), torch.zeros(3))


@pytest.mark.parametrize("shape", [(4,), (2, 1), (1, 1, 4)])
def test_rloo_rejects_bad_shapes(shape):
    with pytest.raises(ValueError):
        rloo_advantages(torch.zeros(shape))


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
                              sampler_logprobs=sampler, tis_cap=2.0)
    loss.backward()
    w0 = torch.exp(torch.tensor(-0.5)).item()
    assert logprobs.grad[0].tolist() == pytest.approx([-w0 / 2, -2.0 / 2])
    assert stats["tis_weight_mean"] == pytest.approx((w0 + 2.0) / 2)
    assert stats["tis_truncated_fraction"] == 0.5
    # Without the cap the sampler's logprobs are ignored.
    plain, _ = loss_of(old.clone().requires_grad_(True), old, torch.tensor([1.0]), torch.ones(1, 2), 0.2,
                           sampler_logprobs=sampler, tis_cap=None)
    assert plain.item() == pytest.approx(-1.0)


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
    b = pack(seqs, pad_id=0)
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 8, 9, 10, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # position t predicts token t+1: completion tokens of row 0 are predicted at 2 and 3
    assert b.completion_mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 0]]
    assert torch.allclose(b.sampler_logprobs, torch.tensor([[0, 0, -0.1, -0.2], [-1.0, -2.0, -3.0, 0]]))
    assert torch.equal(b.advantages, torch.tensor([[0, 0, 1.0, 1.0], [-1.0, -1.0, -1.0, 0]]))


def test_pack_places_token_advantages_and_the_policy_mask_on_their_tokens():
    seqs = [TrainSequence([5, 6, 7], [8, 9], [-0.1, -0.2], [0.5, -2.0]),
            TrainSequence([5], [8, 9, 10], [-1.0, 0.0, -3.0], [-1.0, -1.0, -1.0], mask=[True, False, True])]
    b = pack(seqs, pad_id=0)
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
    b = pack(seqs, pad_id=0)
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
    bins = pack_by_tokens(lengths, max_tokens=100)
    assert sorted(i for b in bins for i in b) == list(range(6))
    assert all(len(b) * max(lengths[i] for i in b) <= 100 for b in bins)
    assert len(bins) == 2  # [50, 45] and [20, 20, 10, 5]
    assert pack_by_tokens([300, 1], max_tokens=100) == [[0], [1]]  # too long for the budget: alone


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
    assert torch.allclose(sum(parts), whole)
    per_seq, _ = loss_of(lp, lp, adv, mask, 0.2, normalizer=4.0)  # sequence mean of token sums
    assert torch.allclose(per_seq, -(adv[:, None] * mask).sum() / 4)


def test_kl_estimators():
    from learner.losses import kl_penalty

    lp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    assert torch.allclose(kl_penalty(lp, ref, "k1"), lp - ref)
    d = ref - lp
    assert torch.allclose(kl_penalty(lp, ref, "k3"), torch.exp(d) - d - 1)
    with pytest.raises(ValueError, match="unknown KL estimator 'k2'"):
        kl_penalty(lp, ref, "k2")
