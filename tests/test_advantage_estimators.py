"""Advantage estimators and the informative-group filter: hand values and invariances."""
import math

import pytest
import torch

from learner.advantages import (
    ESTIMATORS,
    compute_advantages,
    grpo_advantages,
    informative_groups,
    reinforce_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)

BASELINE_ESTIMATORS = ["rloo", "grpo", "reinforce_pp"]


def test_registry_names_every_estimator():
    assert ESTIMATORS == {
        "rloo": rloo_advantages,
        "grpo": grpo_advantages,
        "reinforce_pp": reinforce_pp_advantages,
        "reinforce": reinforce_advantages,
    }


def test_rloo_hand_values():
    adv = compute_advantages("rloo", torch.tensor([[3.0, 0.0, 0.0], [0.0, 1.0, 2.0]]))
    assert torch.allclose(adv, torch.tensor([[3.0, -1.5, -1.5], [-1.5, 0.0, 1.5]]))


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
