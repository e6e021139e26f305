"""A non-finite loss or gradient norm never reaches the weights or the rollout workers: the learner
drops the step (on every rank alike, at ZeRO 0 and 2), the controller pushes nothing, and after
train.max_skipped_steps in a row the run stops with a clear error and its last checkpoint intact.
The faults are injected for real: NaN advantages into the step's batch, an advantage so large
that the loss is finite and its gradient norm is not."""
import math

import pytest
import torch
from safetensors.torch import load_file

import coderloo.controller as controller
from coderloo.checkpoint import latest_checkpoint
from coderloo.config import load_config
from coderloo.controller import NonFiniteError, train
from learner.config import LearnerConfig
from learner.group import LearnerGroup
from tests.runs import SMALL, rl_steps
from tests.test_learner_actor import batch, loss, saved_weights


def poisoned(sequences, value):
    """The sequences with every advantage of the first one set to `value`."""
    first = sequences[0]
    return [type(first)(first.prompt_ids, first.completion_ids, first.sampler_logprobs, [value] * len(first.advantages))] + sequences[1:]


def same(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("ranks,stage", [(1, 0), (2, 2)])
def test_learner_drops_a_step_whose_loss_or_gradient_is_not_finite(ray_cluster, tiny_model, tmp_path, ranks, stage):
    config = LearnerConfig(num_ranks=ranks, zero_stage=stage, optimizer_steps=1, lr=1e-3, max_tokens_per_micro_batch=256)
    learner = LearnerGroup(str(tiny_model), config)
    try:
        _, sequences = batch(tiny_model)
        before = saved_weights(learner, tmp_path / "before")
        # NaN advantages in one sequence: one rank's loss is NaN (with two ranks, the other's is finite)
        stats = learner.train_step(poisoned(sequences, math.nan), *loss(config))
        assert stats["skipped_optimizer_steps"] == 1, stats
        assert same(saved_weights(learner, tmp_path / "after_nan"), before)
        if stage == 0:
            # a finite loss whose gradient overflows float32
            stats = learner.train_step(poisoned(sequences, 1e37), *loss(config))
            assert math.isfinite(stats["loss"]) and stats["skipped_optimizer_steps"] == 1, stats
            assert same(saved_weights(learner, tmp_path / "after_overflow"), before)
        # the next finite step is taken: the dropped ones left no gradient behind
        stats = learner.train_step(sequences, *loss(config))
        assert stats["skipped_optimizer_steps"] == 0 and math.isfinite(stats["grad_norm"]), stats
        after = saved_weights(learner, tmp_path / "after_good")
        assert not same(after, before)
        assert all(torch.isfinite(t).all() for t in after.values())
    finally:
        learner.kill()


def test_run_skips_non_finite_steps_then_stops_with_its_checkpoint_intact(ray_cluster, tiny_model, tmp_path, monkeypatch):
    """NaN advantages at RL step 2 (skipped, the run goes on), then at steps 4 and 5: two in a row
    (train.max_skipped_steps=2) stop the run."""
    out = tmp_path / "nan"
    poisoned_steps = {2, 4, 5}
    real_build_batch = controller.build_batch

    def build_batch(samples, config, step, *args, **kwargs):
        result = real_build_batch(samples, config, step, *args, **kwargs)
        if step in poisoned_steps:
            for seq in result.sequences:
                seq.advantages = [math.nan] * len(seq.advantages)
        return result

    monkeypatch.setattr(controller, "build_batch", build_batch)
    config = load_config("configs/default.yaml", [f"model.path={tiny_model}", f"train.output_dir={out}", "train.steps=6",
                                                  "train.checkpoint_every=1", "train.max_skipped_steps=2", *SMALL])
    with pytest.raises(NonFiniteError) as error:
        train(config)
    message = str(error.value)
    assert "rl steps 4-5" in message and "train.max_skipped_steps 2" in message and "step_4" in message, message
    steps = {r["step"]: r for r in rl_steps(out)}
    assert sorted(steps) == [1, 2, 3, 4, 5]  # the failing step's metrics are written too
    every = config.learner.optimizer_steps  # all of a poisoned step's optimizer steps are dropped
    assert [steps[s]["skipped_optimizer_steps"] for s in sorted(steps)] == [0, every, 0, every, every]
    # nothing was pushed after a skipped step: the policy version moves only with taken steps
    assert steps[2]["version"] == steps[1]["version"] and steps[3]["version"] == steps[1]["version"] + 1
    assert steps[5]["version"] == steps[3]["version"]
    # the checkpoint after the skipped step 4 holds step 3's weights, finite; `latest` names it
    ckpts = out / "checkpoints"
    assert latest_checkpoint(ckpts) == ckpts / "step_4"
    step3, step4 = (load_file(ckpts / name / "model.safetensors") for name in ("step_3", "step_4"))
    assert same(step3, step4) and all(torch.isfinite(t).all() for t in step4.values())
