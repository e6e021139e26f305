"""The algorithm seam on hand-built trajectories: rewards [G, k], turns of several attempts,
per-token rewards, KL in the reward, the critic's term -> per-token advantages, kept groups, metrics."""
import pytest
import torch

from coderloo.tasksets.synthetic import synthetic_suite
from learner.advantages import dense_advantages, explained_variance, gae, rloo_advantages, whiten
from learner.algorithm import build_batch, to_sequences
from learner.config import LearnerConfig
from reward_service.schemas import Components, ItemReward
from rollout_workers.types import Trajectory, Turn
from sandbox_pool import Status

TASKS = synthetic_suite()["train"][:3]


def reward(total: float, token_rewards=None, token_penalties=None) -> ItemReward:
    passed = total >= 1.0
    return ItemReward(components=Components(syntax=1.0, functionality=total, lint=None, performance=None), total=total,
                      passed=passed, status=Status.passed if passed else Status.failed, diagnostics=[], token_rewards=token_rewards,
                      token_penalties=token_penalties)


def turn(tokens: int, r: ItemReward, start: int = 0, mask=None) -> Turn:
    ids = list(range(start, start + tokens))
    return Turn([99, start], ids, [-0.5] * tokens, mask or [True] * tokens, 0, "x", r)


def trajectory(task, *turns: Turn) -> Trajectory:
    return Trajectory(task, list(turns), turns[-1].reward)


def groups_of(rewards: list[list[float]], tokens: int = 2):
    return [[trajectory(TASKS[g], turn(tokens, reward(r), start=10 * g + j)) for j, r in enumerate(row)] for g, row in enumerate(rewards)]


def test_rloo_advantages_whitened_over_the_kept_groups_and_uniform_groups_dropped():
    rewards = [[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.5, 0.0, 0.0]]
    batch = build_batch(to_sequences(groups_of(rewards)), LearnerConfig(), step=1)
    assert batch.kept.tolist() == [True, False, True] and batch.metrics["groups_filtered"] == 1
    expected = rloo_advantages(torch.tensor(rewards))[[0, 2]]
    expected = whiten(expected).flatten().tolist()
    got = [seq.advantages for seq in batch.sequences]
    assert got == [[a, a] for a in expected]  # one per token, the sample's advantage on each
    assert [s.completion_ids[0] for s in batch.sequences] == [0, 1, 2, 3, 20, 21, 22, 23]  # group by group, in order


def test_without_filtering_or_whitening_and_with_reinforce():
    rewards = [[1.0, 0.0], [0.0, 0.0]]
    config = LearnerConfig(advantage={"filter_uninformative": False, "normalize": False})
    batch = build_batch(to_sequences(groups_of(rewards, tokens=1)), config, step=1)
    assert [s.advantages for s in batch.sequences] == [[1.0], [-1.0], [0.0], [0.0]]
    reinforce = build_batch(to_sequences(groups_of(rewards, tokens=1)), LearnerConfig(advantage={"type": "reinforce", "normalize": False}), step=1)
    assert reinforce.kept.all() and [s.advantages for s in reinforce.sequences] == [[1.0], [0.0], [0.0], [0.0]]


def test_every_turn_of_a_trajectory_trains_with_its_advantage_and_the_policy_mask_passes_through():
    # trajectory 0: a failed attempt, then a passing one (with two environment tokens in it); 1: one failed attempt
    first = trajectory(TASKS[0], turn(2, reward(0.0)), turn(3, reward(1.0), start=5, mask=[True, False, True]))
    second = trajectory(TASKS[0], turn(2, reward(0.0), start=20))
    samples = to_sequences([[first, second]])
    assert [len(t) for t in samples.sequences[0]] == [2, 1] and samples.rewards.tolist() == [[1.0, 0.0]]
    batch = build_batch(samples, LearnerConfig(advantage={"normalize": False}), step=1)
    assert [s.advantages for s in batch.sequences] == [[1.0, 1.0], [1.0, 1.0, 1.0], [-1.0, -1.0]]
    assert batch.sequences[1].mask == [True, False, True] and batch.sequences[1].prompt_ids == [99, 5]


def test_kl_in_the_reward_sums_a_trajectorys_turns():
    first = trajectory(TASKS[0], turn(1, reward(0.0)), turn(3, reward(1.0), mask=[True, False, True]))
    second = trajectory(TASKS[0], turn(1, reward(1.0)))
    samples = to_sequences([[first, second]])
    # per token, flat order: trajectory 0's two turns, then trajectory 1's; an environment's token's is not the policy's
    samples.turn_kl = [[0.5], [1.0, 9.0, 0.5], [0.25]]
    config = LearnerConfig(kl={"coef": 0.1, "into": "reward"}, advantage={"normalize": False, "filter_uninformative": False})
    batch = build_batch(samples, config, step=1)
    assert batch.rewards[0].tolist() == pytest.approx([1.0 - 0.1 * 2.0, 1.0 - 0.1 * 0.25])
    assert batch.metrics["kl_sequence_mean"] == pytest.approx(1.125)
    with pytest.raises(ValueError, match="KL to the reference is needed"):
        build_batch(to_sequences([[first, second]]), config, step=1)
    # KL in the loss: the rewards are the outcomes
    assert build_batch(to_sequences([[first, second]]), LearnerConfig(kl={"coef": 0.1}), step=1).rewards.tolist() == [[1.0, 1.0]]


def test_the_critics_term_is_added_to_the_rewards():
    samples = to_sequences(groups_of([[1.0, 0.0]]))
    samples.critic_p_passed = torch.tensor([[0.5, 0.25]])
    batch = build_batch(samples, LearnerConfig(advantage={"normalize": False}), step=1, critic_coef=0.2)
    assert batch.rewards[0].tolist() == pytest.approx([1.1, 0.05])


def test_dense_rewards_give_per_token_advantages_whitened_over_the_kept_tokens():
    rows = [[[0.5, 0.5], [0.0]], [[0.1], [0.1]]]  # group 1 is uniform: dropped
    groups = [[trajectory(TASKS[g], turn(len(r), reward(sum(r), r), start=10 * g + j)) for j, r in enumerate(row)] for g, row in enumerate(rows)]
    config = LearnerConfig(advantage={"dense": {"coef": 1.0}})
    batch = build_batch(to_sequences(groups, token_rewards=True), config, step=1)
    advantages = rloo_advantages(torch.tensor([[1.0, 0.0], [0.1, 0.1]]))
    per_token = torch.tensor([[[0.5, 0.5], [0.0, 0.0]], [[0.1, 0.0], [0.1, 0.0]]])
    mask = torch.tensor([[[True, True], [True, False]], [[True, False], [True, False]]])
    expected = dense_advantages(advantages, per_token, mask, 1.0, 1.0)
    kept = mask & torch.tensor([True, False]).view(-1, 1, 1)
    expected[kept] = whiten(expected[kept])
    assert [s.advantages for s in batch.sequences] == [expected[0, 0].tolist(), expected[0, 1, :1].tolist()]
    assert batch.metrics["dense_advantage_abs_mean"] > 0


@pytest.mark.parametrize("token_rewards, got", [([0.6, 0.7], "2"), (None, "no")])
def test_a_wrong_number_of_token_rewards_names_the_sample(token_rewards, got):
    groups = [[trajectory(TASKS[1], turn(1, reward(0.0, [0.1]))), trajectory(TASKS[1], turn(1, reward(0.0, token_rewards)))]]
    with pytest.raises(ValueError, match=f"group 0 \\('{TASKS[1].id}'\\), sample 1: the reward service gave {got} token rewards for 1 completion tokens"):
        to_sequences(groups, token_rewards=True)


def test_per_token_rewards_need_single_turn_trajectories():
    two_turns = trajectory(TASKS[0], turn(1, reward(0.0, [0.0])), turn(1, reward(1.0, [1.0])))
    with pytest.raises(ValueError, match="per-token rewards need single-turn trajectories, got 2 turns"):
        to_sequences([[two_turns, two_turns]], token_rewards=True)


def test_truncated_completions_are_masked_out_of_the_loss_but_count_in_the_baseline():
    groups = groups_of([[1.0, 0.0, 0.0, 1.0]], tokens=3)
    groups[0][1].turns[0].truncated = True
    plain = build_batch(to_sequences(groups), LearnerConfig(advantage={"normalize": False}), step=1)
    assert all(s.mask == [True] * 3 for s in plain.sequences) and plain.metrics["truncated_fraction"] == 0.25
    masked = build_batch(to_sequences(groups), LearnerConfig(advantage={"normalize": False}, mask_truncated=True), step=1)
    assert [s.mask for s in masked.sequences] == [[True] * 3, [False] * 3, [True] * 3, [True] * 3]
    # the advantages are RLOO's over all four rewards, the truncated sample's included
    assert [s.advantages[0] for s in masked.sequences] == pytest.approx(rloo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))[0].tolist())


def test_the_overlong_penalty_is_a_reward_term_by_length():
    # max_new_tokens 8, buffer 4: 5 tokens lose 1/4, 8 tokens lose all of overlong_penalty (0.5)
    group = [trajectory(TASKS[0], turn(n, reward(1.0), start=10 * j)) for j, n in enumerate([2, 5, 8])]
    config = LearnerConfig(overlong_buffer=4, overlong_penalty=0.5, advantage={"normalize": False, "filter_uninformative": False})
    batch = build_batch(to_sequences([group]), config, step=1, max_new_tokens=8)
    assert batch.rewards.tolist() == [[1.0, 1.0 - 0.125, 1.0 - 0.5]]
    assert batch.metrics["overlong_penalty_mean"] == pytest.approx(-0.625 / 3)
    assert [s.advantages[0] for s in batch.sequences] == pytest.approx(rloo_advantages(batch.rewards)[0].tolist())
    # with filtering, a group is informative by its outcomes: length alone does not keep it (as DAPO filters by accuracy)
    filtered = build_batch(to_sequences([group]), config.model_copy(update={"advantage": config.advantage.model_copy(update={"filter_uninformative": True})}), step=1, max_new_tokens=8)
    assert filtered.kept.tolist() == [False] and filtered.metrics["groups_filtered"] == 1
    with pytest.raises(ValueError, match="the rollout's max_new_tokens is needed"):
        build_batch(to_sequences([group]), config, step=1)


def test_dr_grpo_estimator_through_the_seam():
    batch = build_batch(to_sequences(groups_of([[1.0, 0.0, 0.0, 0.0]], tokens=1)),
                        LearnerConfig(advantage={"type": "dr_grpo", "normalize": False}), step=1)
    assert [s.advantages for s in batch.sequences] == [[0.75], [-0.25], [-0.25], [-0.25]]


def _rollouts(outcomes: list[list[float]], first_task: int = 0):
    from rollout_workers.types import Rollouts

    return Rollouts([[trajectory(TASKS[(first_task + g) % 3], turn(1, reward(r))) for r in row] for g, row in enumerate(outcomes)],
                    {"time_generate_s": 1.0, "rollout_retries": 0})


def test_refill_draws_more_prompts_until_enough_groups_are_informative():
    from coderloo.controller import refill

    asked = []

    def generate(n, round_index):
        asked.append((n, round_index))
        return _rollouts([[1.0, 0.0]] * (n // 2) + [[0.0, 0.0]] * (n - n // 2))  # half informative

    # 1 of 4 informative: the rate 1/4 says 12 more prompts for the 3 missing, capped at 4 a round
    first = _rollouts([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    rollouts, metrics = refill(first, wanted=4, rounds=5, generate=generate)
    assert [len(g) for g in rollouts.groups] == [2] * len(rollouts.groups)
    # then 3 of 8 informative: 1 missing at a rate of 3/8 is 3 prompts, one of them informative
    assert asked == [(4, 1), (3, 2)]
    assert metrics == {"refill_rounds": 2, "refill_prompts": 7, "informative_groups": 4, "refill_surplus_groups": 0}
    informative = [g for g in rollouts.groups if len({t.outcome.total for t in g}) > 1]
    assert len(informative) == 4 and len(rollouts.groups) == 4 + 4 + 3  # every uninformative group stays
    assert rollouts.metrics["time_generate_s"] == 3.0  # the rounds' times add up


def test_refill_drops_the_surplus_of_its_last_round():
    from coderloo.controller import refill

    rollouts, metrics = refill(_rollouts([[1.0, 0.0], [0.0, 0.0]]), wanted=2, rounds=1,
                               generate=lambda n, r: _rollouts([[1.0, 0.0]] * n))
    assert metrics == {"refill_rounds": 1, "refill_prompts": 2, "informative_groups": 2, "refill_surplus_groups": 1}
    assert len(rollouts.groups) == 3


def test_refill_stops_at_its_round_limit_and_does_nothing_when_enough_are_informative():
    from coderloo.controller import refill

    def uniform(n, round_index):
        return _rollouts([[0.0, 0.0]] * n)

    rollouts, metrics = refill(_rollouts([[0.0, 0.0]] * 4), wanted=4, rounds=2, generate=uniform)
    assert metrics["refill_rounds"] == 2 and metrics["informative_groups"] == 0 and len(rollouts.groups) == 12
    full = _rollouts([[1.0, 0.0]] * 4)
    rollouts, metrics = refill(full, wanted=4, rounds=2, generate=uniform)
    assert metrics == {"refill_rounds": 0, "refill_prompts": 0, "informative_groups": 4, "refill_surplus_groups": 0}


def test_refill_needs_filtering_and_a_baseline():
    from coderloo.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="turn filtering on"):
        load_config("configs/default.yaml", ["train.max_refill_rounds=2", "learner.advantage.filter_uninformative=false"])


# --- PPO: GAE over each trajectory's policy tokens ---

PPO = dict(type="ppo", normalize=False, gae_gamma=1.0, gae_lambda=1.0)


def test_ppo_advantages_by_gae_with_one_sample_per_prompt_and_every_group_kept():
    samples = to_sequences(groups_of([[1.0], [0.0]], tokens=3))  # k = 1; group 1 has no signal for a group baseline
    samples.turn_values = [[0.1, 0.2, 0.3], [0.0, 0.5, 0.5]]
    batch = build_batch(samples, LearnerConfig(advantage={**PPO, "gae_lambda": 0.5}), step=1)
    values = torch.tensor(samples.turn_values)
    advantages, returns = gae(torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]), values, torch.ones(2, 3, dtype=torch.bool), 1.0, 0.5)
    assert batch.kept.tolist() == [True, True] and batch.metrics["groups_filtered"] == 0
    assert [a for s in batch.sequences for a in s.advantages] == pytest.approx(advantages.flatten().tolist())
    assert [r for s in batch.sequences for r in s.returns] == pytest.approx(returns.flatten().tolist())
    assert [s.values for s in batch.sequences] == samples.turn_values  # the estimates the value loss clips against
    assert batch.metrics["explained_variance"] == pytest.approx(explained_variance(values.flatten(), returns.flatten()))
    # whitened over the batch's tokens, mean included
    samples.turn_values = values.tolist()
    white = build_batch(samples, LearnerConfig(advantage={**PPO, "normalize": True}), step=1)
    flat = torch.tensor([a for s in white.sequences for a in s.advantages])
    assert flat.mean().item() == pytest.approx(0.0, abs=1e-6) and flat.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-4)
    with pytest.raises(ValueError, match="value model's estimates"):
        build_batch(to_sequences(groups_of([[1.0]])), LearnerConfig(advantage=PPO), step=1)


def test_ppo_with_dense_rewards_puts_penalties_on_their_tokens_and_the_rest_of_the_outcome_last():
    r = reward(1.0, token_rewards=[0.4, 0.2, 0.4], token_penalties=[0.0, -0.2, 0.0])  # lint on token 1
    samples = to_sequences([[trajectory(TASKS[0], turn(3, r))]], token_rewards=True)
    samples.turn_values = [[0.0, 0.0, 0.0]]
    batch = build_batch(samples, LearnerConfig(advantage={**PPO, "dense_rewards": True}), step=1)
    # step rewards [0, -0.2, 1.2] (they sum to the outcome); lam = 1, no values: the reward-to-go
    assert batch.sequences[0].advantages == pytest.approx([1.0, 1.0, 1.2])
    no_penalties = to_sequences([[trajectory(TASKS[0], turn(3, reward(1.0, token_rewards=[0.3, 0.3, 0.4])))]], token_rewards=True)
    no_penalties.turn_values = [[0.0] * 3]
    with pytest.raises(ValueError, match="group 0, sample 0: ppo with dense_rewards needs the reward service's token penalties"):
        build_batch(no_penalties, LearnerConfig(advantage={**PPO, "dense_rewards": True}), step=1)


def test_ppo_runs_through_a_multi_turn_trajectory_skipping_environment_tokens_with_kl_per_token():
    first = trajectory(TASKS[0], turn(2, reward(0.0)), turn(3, reward(1.0), start=5, mask=[True, False, True]))
    second = trajectory(TASKS[0], turn(1, reward(0.0), start=20))
    samples = to_sequences([[first, second]])
    samples.turn_values = [[0.1, 0.2], [0.3, 9.0, 0.4], [0.5]]
    samples.turn_kl = [[0.5, 0.0], [0.0, 7.0, 1.0], [0.0]]
    batch = build_batch(samples, LearnerConfig(advantage=PPO, kl={"coef": 0.1, "into": "reward"}), step=1)
    # trajectory 0's steps: its 4 policy tokens, rewards [-0.05, 0, 0, 1 - 0.1]; returns 0.85, 0.9, 0.9, 0.9
    turn1, turn2, other = batch.sequences
    assert turn1.advantages == pytest.approx([0.75, 0.7]) and turn1.returns == pytest.approx([0.85, 0.9])
    assert turn2.advantages == pytest.approx([0.6, 0.0, 0.5]) and turn2.returns == pytest.approx([0.9, 0.0, 0.9])
    assert other.advantages == pytest.approx([-0.5]) and batch.rewards.tolist() == [[1.0, 0.0]]  # the KL is per token, not in the outcome
    assert batch.metrics["kl_sequence_mean"] == pytest.approx((1.5 + 0.0) / 2)


def test_ppo_masks_truncated_completions_after_their_advantages():
    groups = [[trajectory(TASKS[0], turn(2, reward(0.0))), trajectory(TASKS[0], turn(2, reward(1.0), start=3))]]
    groups[0][0].turns[0].truncated = True
    samples = to_sequences(groups)
    samples.turn_values = [[0.0, 0.0], [0.0, 0.0]]
    batch = build_batch(samples, LearnerConfig(advantage=PPO, mask_truncated=True), step=1)
    assert batch.sequences[0].mask == [False, False] and batch.sequences[1].mask == [True, True]
    assert batch.sequences[1].advantages == pytest.approx([1.0, 1.0])


def test_the_learners_wait_is_split_by_what_it_waited_for():
    """coderloo.controller.waits: the step starts at 10; its job ends at 14 after 1.5 s of scoring
    past its last sample; refill rounds take it to 15."""
    from coderloo.controller import waits

    assert waits(10.0, 14.0, 15.0, 1.5) == pytest.approx(
        {"time_wait_generation_s": 2.5, "time_wait_scoring_s": 1.5, "time_wait_refill_s": 1.0})
    # generation ended before the step started: only scoring was waited for, and only since then
    assert waits(10.0, 11.0, 11.0, 3.0) == pytest.approx(
        {"time_wait_generation_s": 0.0, "time_wait_scoring_s": 1.0, "time_wait_refill_s": 0.0})
    # an overlapped step whose rollouts were ready: no wait at all
    assert waits(10.0, 10.0, 10.0, 0.4) == pytest.approx(
        {"time_wait_generation_s": 0.0, "time_wait_scoring_s": 0.0, "time_wait_refill_s": 0.0})
