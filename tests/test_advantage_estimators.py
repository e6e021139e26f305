"""Advantage estimators and the informative-group filter: hand values and invariances."""
import math

import pytest
import torch

from learner.advantages import (
    ESTIMATORS,
    compute_advantages,
    dense_advantages,
    dr_grpo_advantages,
    explained_variance,
    gae,
    grpo_advantages,
    informative_groups,
    overlong_penalty,
    reinforce_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    whiten,
)
from tests.rounding import UNIT_ROUNDOFF

BASELINE_ESTIMATORS = ["rloo", "grpo", "dr_grpo", "reinforce_pp"]


def test_rloo_hand_values():
    adv = compute_advantages("rloo", torch.tensor([[3.0, 0.0, 0.0], [0.0, 1.0, 2.0]]))
    assert torch.allclose(adv, torch.tensor([[3.0, -1.5, -1.5], [-1.5, 0.0, 1.5]]))
    adv = compute_advantages("rloo", torch.tensor([[1.0, 0.0, 0.0, 1.0]]))  # DESIGN.md's example
    assert torch.allclose(adv, torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3]]))


def test_grpo_hand_values_use_the_unbiased_group_std():
    # [1, 0, 0, 1]: mean 0.5, unbiased var = 4 * 0.25 / 3, std = 1 / sqrt(3); the biased std (0.5)
    # would give +-1 instead of +-sqrt(3) / 2.
    # [3, 0, 0]: mean 1, deviations (2, -1, -1), unbiased var = 6 / 2 = 3.
    adv = compute_advantages("grpo", torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    h = math.sqrt(3) / 2
    assert torch.allclose(adv, torch.tensor([[h, -h, -h, h]]), atol=1e-5)
    adv = grpo_advantages(torch.tensor([[3.0, 0.0, 0.0]]))
    s = math.sqrt(3)
    assert torch.allclose(adv, torch.tensor([[2 / s, -1 / s, -1 / s]]), atol=1e-5)


def test_grpo_eps_bounds_a_tiny_std():
    adv = grpo_advantages(torch.tensor([[1.0, 0.0]]), eps=1.0)
    # std of (1, 0) unbiased = sqrt(0.5); A = 0.5 / (sqrt(0.5) + 1)
    expected = 0.5 / (math.sqrt(0.5) + 1.0)
    assert torch.allclose(adv, torch.tensor([[expected, -expected]]))


def test_reinforce_pp_hand_values_use_the_batch_std():
    # Centred: [[2, -1, -1], [-1, 0, 1]]; batch (biased) var = (6 + 2) / 6 = 4 / 3.
    adv = compute_advantages("reinforce_pp", torch.tensor([[3.0, 0.0, 0.0], [0.0, 1.0, 2.0]]))
    s = math.sqrt(4 / 3)
    expected = torch.tensor([[2 / s, -1 / s, -1 / s], [-1 / s, 0.0, 1 / s]])
    assert torch.allclose(adv, expected, atol=1e-5)
    # A group of equal rewards contributes zeros, and still counts in the batch std:
    # centred [[.5, -.5, -.5, .5], [0, 0, 0, 0]]: var = 1 / 8, so +-0.5 / sqrt(1/8) = +-sqrt(2).
    adv = reinforce_pp_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]]))
    r2 = math.sqrt(2)
    assert torch.allclose(adv, torch.tensor([[r2, -r2, -r2, r2], [0.0, 0.0, 0.0, 0.0]]), atol=1e-5)


def test_dr_grpo_hand_values_subtract_the_group_mean_and_do_not_scale():
    rewards = torch.tensor([[3.0, 0.0, 0.0], [0.0, 1.0, 2.0], [0.5, 0.5, 0.5]])
    adv = compute_advantages("dr_grpo", rewards)
    assert torch.allclose(adv, torch.tensor([[2.0, -1.0, -1.0], [-1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]))
    # GRPO divides each group by its std: a nearly unanimous group's advantages are blown up, Dr. GRPO's are not.
    close = torch.tensor([[1.0, 1.0, 1.0, 0.9]])
    assert dr_grpo_advantages(close).abs().max().item() == pytest.approx(0.075, abs=1e-6)
    assert grpo_advantages(close).abs().max().item() > 1.0


def test_overlong_penalty_hand_values_match_dapo():
    # max 10 tokens, buffer 4: no penalty up to 6, then -1/4 per token, -1 at 10 and beyond.
    lengths = torch.tensor([0, 6, 7, 8, 10, 12])
    assert overlong_penalty(lengths, 10, 4, 1.0).tolist() == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    assert overlong_penalty(lengths, 10, 4, 0.5).tolist() == [0.0, 0.0, -0.125, -0.25, -0.5, -0.5]
    with pytest.raises(ValueError, match="overlong buffer must be in 1..max_new_tokens"):
        overlong_penalty(lengths, 10, 11, 1.0)


def test_overlong_penalty_matches_trl():
    from trl.rewards import get_soft_overlong_punishment

    theirs = get_soft_overlong_punishment(max_completion_len=48, soft_punish_cache=16)
    lengths = list(range(0, 60, 3))
    ours = overlong_penalty(torch.tensor(lengths), 48, 16, 1.0)
    assert ours.tolist() == pytest.approx(theirs([[1] * n for n in lengths]), abs=1e-7)
    assert ours.min().item() == -1.0 and ours.max().item() == 0.0  # both regimes are in the comparison


def test_reinforce_is_the_reward_itself():
    rewards = torch.tensor([[3.0, 0.0, 0.0], [0.0, 1.0, 2.0]])
    adv = compute_advantages("reinforce", rewards)
    assert torch.equal(adv, rewards)
    adv[0, 0] = 7.0
    assert rewards[0, 0].item() == 3.0  # a copy, not a view the caller could corrupt


def test_unknown_estimator_names_it_and_the_valid_ones():
    with pytest.raises(ValueError) as err:
        compute_advantages("ppo", torch.zeros(2, 3))
    message = str(err.value)
    assert "'ppo'" in message
    for name in ESTIMATORS:
        assert name in message


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
@pytest.mark.parametrize("shape", [(4,), (1, 1, 4)])
def test_estimators_reject_bad_shapes(name, shape):
    with pytest.raises(ValueError):
        compute_advantages(name, torch.zeros(shape))


@pytest.mark.parametrize("name", ["rloo", "grpo"])
def test_group_estimators_need_two_samples(name):
    with pytest.raises(ValueError, match="k=1"):
        compute_advantages(name, torch.zeros(3, 1))


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_output_shape_matches_input(name):
    rewards = torch.rand(5, 4)
    assert compute_advantages(name, rewards).shape == (5, 4)


@pytest.mark.parametrize("name", BASELINE_ESTIMATORS)
def test_baseline_estimators_sum_to_zero_per_group(name):
    rewards = torch.rand(6, 5, generator=torch.Generator().manual_seed(0))
    adv = compute_advantages(name, rewards)
    assert torch.allclose(adv.sum(dim=1), torch.zeros(6), atol=1e-5)
    assert adv.abs().sum() > 0.1  # and they are not trivially zero


@pytest.mark.parametrize("name", BASELINE_ESTIMATORS)
def test_equal_groups_get_zero_advantages(name):
    rewards = torch.tensor([[0.5, 0.5, 0.5], [1.0, 0.0, 1.0]])
    adv = compute_advantages(name, rewards)
    assert torch.equal(adv[0], torch.zeros(3))
    assert torch.isfinite(adv).all()


@pytest.mark.parametrize("name", BASELINE_ESTIMATORS)
def test_baseline_estimators_ignore_a_constant_added_to_a_group(name):
    gen = torch.Generator().manual_seed(1)
    rewards = torch.rand(4, 6, generator=gen)
    shift = torch.tensor([[5.0], [-3.0], [0.0], [100.0]])  # a different constant per group
    assert torch.allclose(compute_advantages(name, rewards + shift), compute_advantages(name, rewards), atol=1e-4)


def test_reinforce_moves_with_a_constant_added_to_a_group():
    rewards = torch.rand(4, 6, generator=torch.Generator().manual_seed(2))
    shift = torch.tensor([[5.0], [-3.0], [0.0], [100.0]])
    assert torch.allclose(reinforce_advantages(rewards + shift), reinforce_advantages(rewards) + shift)


def test_scaling_rewards():
    # RLOO scales with the rewards; the std-normalised estimators do not (up to eps).
    rewards = torch.rand(4, 6, generator=torch.Generator().manual_seed(3))
    assert torch.allclose(rloo_advantages(3.0 * rewards), 3.0 * rloo_advantages(rewards), atol=1e-6)
    assert torch.allclose(dr_grpo_advantages(3.0 * rewards), 3.0 * dr_grpo_advantages(rewards), atol=1e-6)
    assert torch.allclose(grpo_advantages(3.0 * rewards), grpo_advantages(rewards), atol=1e-4)
    assert torch.allclose(reinforce_pp_advantages(3.0 * rewards), reinforce_pp_advantages(rewards), atol=1e-4)
    out = reinforce_pp_advantages(rewards)
    assert out.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-4)


def test_informative_groups_hand_values():
    rewards = torch.tensor([
        [1.0, 1.0, 1.0],
        [1.0, 0.0, 1.0],
        [0.0, 0.0, 0.0],
        [0.25, 0.25, 0.75],
        [0.0, 0.0, 1e-3],
    ])
    assert informative_groups(rewards).tolist() == [False, True, False, True, True]
    assert informative_groups(rewards).dtype == torch.bool


def test_informative_groups_are_exactly_those_with_nonzero_rloo_advantages():
    rewards = torch.randint(0, 2, (64, 4), generator=torch.Generator().manual_seed(4)).float()
    keep = informative_groups(rewards)
    assert 0 < keep.sum() < 64  # the seed gives both kinds
    assert torch.equal(keep, rloo_advantages(rewards).abs().sum(dim=1) > 0)


# --- dense (per-token) advantages ---

def full_mask(rewards: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(rewards, dtype=torch.bool)


def test_dense_hand_values_with_padding_and_discount():
    # Two samples; sample 1 has 2 tokens (the third is padding). gamma 0.5:
    # to-go 0: [1 + 0.5 * (0 + 0.5 * 2), 0 + 0.5 * 2, 2] = [1.5, 1, 2]; to-go 1: [0.5 * 4, 4, 0] = [2, 4, 0].
    # With k = 2 each sample's baseline is the other's to-go.
    rewards = torch.tensor([[[1.0, 0.0, 2.0], [0.0, 4.0, 9.0]]])
    mask = torch.tensor([[[True, True, True], [True, True, False]]])
    seq = torch.tensor([[0.25, -0.25]])
    out = dense_advantages(seq, rewards, mask, coef=2.0, gamma=0.5)
    expected = torch.tensor([[[0.25 + 2 * (1.5 - 2), 0.25 + 2 * (1 - 4), 0.25 + 2 * (2 - 0)],
                              [-0.25 + 2 * (2 - 1.5), -0.25 + 2 * (4 - 1), 0.0]]])
    assert torch.allclose(out, expected)
    assert out.shape == (1, 2, 3)


def test_dense_rejects_mismatched_shapes():
    seq = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"must be \[G, k, T\]"):
        dense_advantages(seq, torch.zeros(2, 4, 5), torch.ones(2, 4, 5, dtype=torch.bool), 1.0)
    with pytest.raises(ValueError, match=r"must be \[G, k, T\]"):
        dense_advantages(seq, torch.zeros(2, 3, 5), torch.ones(2, 3, 4, dtype=torch.bool), 1.0)
    with pytest.raises(ValueError, match="k=1"):
        dense_advantages(torch.zeros(2, 1), torch.zeros(2, 1, 5), torch.ones(2, 1, 5, dtype=torch.bool), 1.0)


def test_a_lint_penalised_token_gets_a_lower_advantage_than_its_neighbours():
    # Four samples with the same share per code token; sample 0 has a lint penalty on token 3.
    rewards = torch.full((1, 4, 7), 0.1)
    rewards[0, 0, 3] -= 0.3
    seq = rloo_advantages(rewards.sum(dim=-1))
    discounted = dense_advantages(seq, rewards, full_mask(rewards), coef=1.0, gamma=0.5)[0, 0]
    # to-go of sample 0 from token 2 on: 0.04375, -0.1125, 0.175; the others': 0.19375, 0.1875, 0.175
    assert (discounted[2:5] - seq[0, 0]).tolist() == pytest.approx([-0.15, -0.3, 0.0], abs=1e-6)
    # Undiscounted, the tokens before the penalty (which led to it) share it; those after do not.
    plain = dense_advantages(seq, rewards, full_mask(rewards), coef=1.0, gamma=1.0)[0, 0]
    assert torch.allclose(plain[:4], plain[3].expand(4))
    assert (plain[3] < plain[4:]).all()
    # The other samples' tokens up to the penalty gain (they avoided it), and only those.
    others = dense_advantages(seq, rewards, full_mask(rewards), coef=1.0)[0, 1:] - seq[0, 1:, None]
    assert (others[:, :4] > 0).all() and torch.equal(others[:, 4:], torch.zeros(3, 3))


def test_dense_with_rewards_shared_by_every_sample_is_the_sequence_advantage():
    # Token rewards that are the same in all k samples carry no signal: every token gets its
    # sequence advantage (up to rounding; exactly when there are no token rewards at all).
    seq = rloo_advantages(torch.rand(3, 4, generator=torch.Generator().manual_seed(5)))
    expected = seq.unsqueeze(-1).expand(3, 4, 6)
    shared = torch.rand(3, 1, 6, generator=torch.Generator().manual_seed(6)).expand(3, 4, 6)
    assert torch.allclose(dense_advantages(seq, shared, full_mask(shared), coef=0.7, gamma=0.9), expected, atol=1e-6)
    zeros = torch.zeros(3, 4, 6)
    assert torch.equal(dense_advantages(seq, zeros, full_mask(zeros), coef=0.7, gamma=0.9), expected)


def test_dense_term_sums_to_zero_over_the_group_at_each_position():
    # A token position does not get pushed up (or down) in all k samples at once.
    rewards = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(7))
    seq = torch.randn(2, 5, generator=torch.Generator().manual_seed(8))
    term = dense_advantages(seq, rewards, full_mask(rewards), coef=1.0, gamma=0.8) - seq.unsqueeze(-1)
    assert torch.allclose(term.sum(dim=1), torch.zeros(2, 8), atol=1e-5)
    assert term.abs().sum() > 1.0


def test_dense_baseline_of_a_sample_does_not_depend_on_its_own_rewards():
    # The leave-one-out baseline is what keeps the term unbiased: changing sample 0's rewards changes
    # its term by exactly coef x the change of its own reward-to-go, nothing else.
    gen = torch.Generator().manual_seed(9)
    rewards = torch.rand(1, 3, 5, generator=gen)
    changed = rewards.clone()
    changed[0, 0] += torch.rand(5, generator=gen)
    seq, mask = torch.zeros(1, 3), full_mask(rewards)
    delta = dense_advantages(seq, changed, mask, coef=2.0)[0, 0] - dense_advantages(seq, rewards, mask, coef=2.0)[0, 0]
    own_to_go = (changed - rewards)[0, 0].flip(0).cumsum(0).flip(0)
    assert torch.allclose(delta, 2.0 * own_to_go, atol=1e-5)


def test_dense_term_at_the_first_token_is_rloo_of_the_summed_token_rewards():
    rewards = torch.rand(2, 4, 6, generator=torch.Generator().manual_seed(10))
    mask = full_mask(rewards)
    mask[0, 1, 4:] = False  # a shorter sample: its padding is ignored
    term = dense_advantages(torch.zeros(2, 4), rewards, mask, coef=1.0)
    assert torch.allclose(term[..., 0], rloo_advantages((rewards * mask).sum(dim=-1)), atol=1e-6)
    assert torch.equal(term[0, 1, 4:], torch.zeros(2))


def test_whitening_dense_advantages_without_signal_matches_the_sequence_path():
    # The controller whitens the kept tokens' advantages as one set; with equal lengths and no
    # per-token signal that is the sequence advantages' whitening, token for token.
    seq = rloo_advantages(torch.rand(3, 4, generator=torch.Generator().manual_seed(11)))
    mask = torch.ones(3, 4, 5, dtype=torch.bool)
    tokens = dense_advantages(seq, torch.zeros(3, 4, 5), mask, coef=1.0)
    # (a mean and a std of 60 values against those of 12: 60 u of the largest whitened value)
    expected = whiten(seq)
    assert torch.allclose(whiten(tokens[mask]).view(3, 4, 5), expected.unsqueeze(-1).expand(3, 4, 5),
                          atol=60 * UNIT_ROUNDOFF * float(expected.abs().max()), rtol=0)
    # With per-token signal the scale covers both terms: unit std over the tokens.
    tokens = dense_advantages(seq, torch.rand(3, 4, 5, generator=torch.Generator().manual_seed(12)), mask, coef=1.0)
    assert whiten(tokens[mask]).std(unbiased=False).item() == pytest.approx(1.0, abs=1e-4)


# --- PPO: GAE and the explained variance ---


def openrlhf_gae(values, rewards, action_mask, gamma, lambd):
    """The peer: OpenRLHF's `get_advantages_and_returns` (openrlhf/trainer/ppo_utils/experience_maker.py),
    written out here (it is not installed); TRL's PPOTrainer ran the same loop."""
    lastgaelam = 0
    advantages_reversed = []
    response_length = rewards.size(1)
    values = action_mask * values
    rewards = action_mask * rewards
    for t in reversed(range(response_length)):
        nextvalues = values[:, t + 1] if t < response_length - 1 else 0.0
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * lambd * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    return advantages, advantages + values


def test_gae_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [1.0, 7.0, 7.0]])
    values = torch.tensor([[0.5, 0.6, 0.8], [0.5, 9.0, 9.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])  # row 1: one step, then padding
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # delta_2 = 1 - 0.8 = 0.2; delta_1 = 0.9 * 0.8 - 0.6 = 0.12; delta_0 = 0.9 * 0.6 - 0.5 = 0.04; gamma lam = 0.72
    assert advantages[0].tolist() == pytest.approx([0.04 + 0.72 * (0.12 + 0.72 * 0.2), 0.12 + 0.72 * 0.2, 0.2])
    assert returns[0].tolist() == pytest.approx([0.5 + 0.23008, 0.6 + 0.264, 1.0])
    assert advantages[1].tolist() == pytest.approx([0.5, 0.0, 0.0]) and returns[1].tolist() == pytest.approx([1.0, 0.0, 0.0])
    # lam = 1: the return minus the value (Monte Carlo); lam = 0: the one-step TD error
    mc, mc_returns = gae(rewards[:1], values[:1], mask[:1], gamma=0.9, lam=1.0)
    assert mc_returns[0].tolist() == pytest.approx([0.81, 0.9, 1.0]) and mc[0].tolist() == pytest.approx([0.31, 0.3, 0.2])
    td, _ = gae(rewards[:1], values[:1], mask[:1], gamma=0.9, lam=0.0)
    assert td[0].tolist() == pytest.approx([0.04, 0.12, 0.2])


@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.99, 1.0), (0.9, 0.5)])
def test_gae_matches_openrlhf(gamma, lam):
    torch.manual_seed(0)
    lengths = torch.tensor([7, 3, 1, 5])
    mask = torch.arange(7) < lengths.unsqueeze(1)
    rewards, values = torch.randn(4, 7), torch.randn(4, 7)
    ours, ours_returns = gae(rewards, values, mask, gamma, lam)
    theirs, their_returns = openrlhf_gae(values, rewards, mask.float(), gamma, lam)
    # the same recurrence over at most 7 steps, each a multiply and two adds: about 21 u (1.3e-6)
    # relative to the terms (randn, below 4), within allclose's atol 1e-6 plus rtol 1e-5
    assert torch.allclose(ours, theirs, atol=1e-6) and torch.allclose(ours_returns, their_returns, atol=1e-6)


def test_gae_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"must all be \[B, T\]"):
        gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), 1.0, 1.0)


def test_explained_variance_and_whitening_with_the_mean():
    returns = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(returns, returns) == 1.0
    assert explained_variance(torch.full((4,), 2.5), returns) == pytest.approx(0.0)
    assert explained_variance(-returns, returns) < 0
    assert math.isnan(explained_variance(returns, torch.ones(4)))
    white = whiten(returns, shift_mean=True)
    assert white.mean().item() == pytest.approx(0.0, abs=1e-6) and white.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)
    assert whiten(returns).mean().item() > 0  # RLOO's: the scale only
