"""A step's rollouts as the controller reads them: per-token rewards checked against the tokens."""
import pytest

from coderloo.pipeline import StepRollouts
from coderloo.tasksets.synthetic import synthetic_suite
from reward_service.schemas import Components, ItemReward
from rollout_workers import PromptRollout
from rollout_workers.types import Sample
from sandbox_pool import Status


def reward(token_rewards):
    components = Components(syntax=1.0, functionality=0.0, lint=None, performance=None)
    return ItemReward(components=components, total=0.1, passed=False, status=Status.failed, diagnostics=[], token_rewards=token_rewards)


def step_rollouts(token_rewards):
    tasks = synthetic_suite()["train"][:2]
    samples = [Sample([1, 2], [0.0, 0.0], "ab", "stop", 0), Sample([3], [0.0], "c", "stop", 0)]
    rewards = [[reward([0.1, 0.2]), reward([0.3])], [reward([0.4, 0.5]), reward(token_rewards)]]
    return StepRollouts(7, tasks, [PromptRollout([0], samples)] * 2, rewards), tasks[1].id


def test_token_rewards_in_sample_order():
    batch, _ = step_rollouts([0.6])
    assert batch.token_rewards() == [[0.1, 0.2], [0.3], [0.4, 0.5], [0.6]]


@pytest.mark.parametrize("token_rewards, got", [([0.6, 0.7], "2"), ([], "0"), (None, "no")])
def test_a_wrong_number_of_token_rewards_names_the_sample(token_rewards, got):
    batch, task_id = step_rollouts(token_rewards)
    with pytest.raises(ValueError, match=f"RL step 7, task '{task_id}', sample 1: the reward service gave {got} token rewards for 1 completion tokens"):
        batch.token_rewards()
