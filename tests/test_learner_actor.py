"""The DeepSpeed learner at each ZeRO stage and with two ranks: steps change the weights, the
weights it publishes are whole (ZeRO-3 partitions them), and ranks stay identical."""
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest
import ray
import torch

from coderloo.controller import sft_examples
from coderloo.tasksets.synthetic import synthetic_suite
from common.hf import load_causal_lm, load_tokenizer
from learner.batch import TrainSequence
from learner.config import ClipLoss, LearnerConfig
from learner.group import LearnerGroup
from rollout_workers import RolloutGroup, RolloutWorker
from tests.rounding import assert_same_adam_steps, entropy_rtol, grad_norm_rtol, sizes


def batch(tiny_model, count=8):
    examples = sft_examples(synthetic_suite()["train"][:count], load_tokenizer(tiny_model))
    sequences = [TrainSequence(p, c, [-1.0] * len(c), [1.0 if i % 2 else -1.0] * len(c)) for i, (p, c) in enumerate(examples)]
    return examples, sequences


def loss(config: LearnerConfig, section=None):
    """train_step's arguments after the sequences at RL step 1: the loss (config's, or `section`),
    the temperature, the loss's KL weight and max_new_tokens."""
    return section or config.loss, 1.0, config.loss_kl_coef(1), 48


def saved_weights(learner: LearnerGroup, path) -> dict[str, torch.Tensor]:
    """The policy as the learner publishes it (rank 0's whole weights, in Hugging Face format)."""
    learner.save(str(path))
    model = load_causal_lm(path)
    return {**model.state_dict(), "lm_head.weight": model.get_output_embeddings().weight}


def test_gradient_checkpointing_takes_the_same_step(ray_cluster, tiny_model, tmp_path):
    """Recomputing each layer in the backward changes what the step keeps, not the update it makes."""
    _, sequences = batch(tiny_model)
    steps = {}
    for checkpointing in (False, True):
        config = LearnerConfig(optimizer_steps=1, max_tokens_per_micro_batch=256, gradient_checkpointing=checkpointing)
        learner = LearnerGroup(str(tiny_model), config)
        try:
            engaged = ray.get(learner.ranks[0].__ray_call__.remote(lambda self: self.engine.module.is_gradient_checkpointing))
            assert engaged == checkpointing
            stats = learner.train_step(sequences, *loss(config))
            steps[checkpointing] = stats, saved_weights(learner, tmp_path / str(checkpointing))
        finally:
            learner.kill()
    (off_stats, off), (on_stats, on) = steps[False], steps[True]
    tokens, _ = sizes(sequences)
    assert off_stats["grad_norm"] > 0
    # the recomputed forward is another call of the same kernels: rounding at most
    assert on_stats["grad_norm"] == pytest.approx(off_stats["grad_norm"], rel=grad_norm_rtol(tokens))
    assert_same_adam_steps(on, off, load_causal_lm(tiny_model).state_dict(), LearnerConfig().lr, 1, tokens)


@pytest.mark.parametrize("stage", [1, 3])
def test_zero_stage_trains_and_publishes_whole_weights(ray_cluster, tiny_model, tmp_path, stage):
    config = LearnerConfig(zero_stage=stage, optimizer_steps=2, kl={"coef": 0.1}, max_tokens_per_micro_batch=256)
    learner = LearnerGroup(str(tiny_model), config, sft_lr=1e-3)
    worker = RolloutWorker.remote(str(tiny_model), "transformers", threads=1)
    try:
        examples, sequences = batch(tiny_model)
        stats = learner.sft_step(examples)
        assert stats["grad_norm"] > 0 and stats["sft_loss"] > 0
        stats = learner.train_step(sequences, *loss(config))
        assert stats["grad_norm"] > 0 and "kl" in stats
        published = saved_weights(learner, tmp_path / "published")
        # The KL reference (model.path's weights here) moves a quarter of the way to the policy,
        # then becomes it: from the gathered parameters under ZeRO-3, into the checkpoint.
        learner.mix_reference(0.25)
        learner.save(str(tmp_path / "mixed"), with_state=True)
        kl_mixed, _ = learner.token_stats(sequences, 1.0, kl=True, values=False)
        learner.mix_reference(1.0)
        kl_same, _ = learner.token_stats(sequences, 1.0, kl=True, values=False)
        # The push gathers whole weights too: the worker checks every bucket's sum on arrival.
        group = RolloutGroup([worker])
        group.connect(learner.weight_sources)
        group.push()
        assert ray.get(worker.status.remote())[1] == 1
    finally:
        learner.kill()
        ray.kill(worker)
    initial = load_causal_lm(tiny_model).state_dict()
    assert set(initial) <= set(published)
    for name, tensor in initial.items():
        assert published[name].shape == tensor.shape, name
    assert any(not torch.equal(published[n], initial[n]) for n in initial)
    assert torch.equal(published["lm_head.weight"], published["model.embed_tokens.weight"])
    mixed = load_causal_lm(tmp_path / "mixed" / "reference").state_dict()
    for name, tensor in initial.items():
        # a multiply and an add (two roundings), or one fused multiply-add: within 2 ulps
        expected = 0.75 * tensor + 0.25 * published[name]
        torch.testing.assert_close(mixed[name], expected, rtol=2 * torch.finfo(torch.float32).eps, atol=0, msg=name)
    assert max(max(k) for k in kl_mixed) > 1e-3
    assert max(abs(v) for k in kl_same for v in k) < 1e-6


def test_one_mini_batch_takes_its_step_start_logprobs_from_the_training_forward(ray_cluster, tiny_model, tmp_path):
    """With one mini-batch the separate step-start pass is skipped: the update, the policy's
    entropy and the sampler/learner difference are those of the pass, to the bit (fp32)."""
    _, sequences = batch(tiny_model)
    results = {}
    for pass_always in (True, False):
        config = LearnerConfig(optimizer_steps=1, max_tokens_per_micro_batch=256, lr=1e-3, kl={"coef": 0.05})
        learner = LearnerGroup(str(tiny_model), config)
        try:
            ray.get(learner.ranks[0].__ray_call__.remote(lambda self, on: setattr(self, "step_start_pass_always", on), pass_always))
            stats = [learner.train_step(sequences, *loss(config)) for _ in range(2)]
            results[pass_always] = stats, saved_weights(learner, tmp_path / str(pass_always))
        finally:
            learner.kill()
    (with_pass, weights), (shortcut, shortcut_weights) = results[True], results[False]
    initial = load_causal_lm(tiny_model).state_dict()
    assert any(not torch.equal(weights[n], initial[n]) for n in initial)
    for name in initial:
        assert torch.equal(shortcut_weights[name], weights[name]), name
    for before, after in zip(with_pass, shortcut):
        for key in ("loss", "grad_norm", "entropy", "sampler_logprob_diff_mean", "sampler_logprob_diff_max", "tokens", "kl"):
            assert after[key] == before[key], key
    assert with_pass[1]["entropy"] != with_pass[0]["entropy"] > 0  # the statistic follows the policy


# One learner step with each aggregation (the last one also at sequence level, GSPO, with clip-higher).
AGGREGATION_STEPS = [
    ClipLoss(aggregation="token_mean"),
    ClipLoss(aggregation="seq_mean_token_mean"),
    ClipLoss(aggregation="seq_mean_token_sum"),
    ClipLoss(aggregation="seq_mean_token_sum_norm", importance_level="sequence", eps_high=0.28),
]


def test_two_ranks_zero2_match_one_rank(ray_cluster, tiny_model, tmp_path):
    """Two data-parallel ranks (gloo, ZeRO-2) after a step of each loss aggregation: the same weights
    as one rank given the whole batch (each loss normalizer spans the mini-batch over ranks and
    micro-batches). ZeRO-2 gathers every parameter from the rank that updated it, so rank 0's
    weights stand for both."""
    _, sequences = batch(tiny_model, count=12)
    results = {}
    for ranks in (2, 1):
        config = LearnerConfig(num_ranks=ranks, zero_stage=2, optimizer_steps=2, lr=1e-3, max_tokens_per_micro_batch=200)
        learner = LearnerGroup(str(tiny_model), config)
        try:
            for section in AGGREGATION_STEPS:
                stats = learner.train_step(sequences, *loss(config, section))
            results[ranks] = (saved_weights(learner, tmp_path / f"ranks{ranks}"), stats)
        finally:
            learner.kill()
    rank0, stats2 = results[2]
    single, stats1 = results[1]
    tokens, longest = sizes(sequences)
    # the two ranks' gradients summed by gloo: another order of the same reduction
    steps = len(AGGREGATION_STEPS) * config.optimizer_steps
    assert_same_adam_steps(rank0, single, load_causal_lm(tiny_model).state_dict(), config.lr, steps, tokens, "2 ranks against 1: ")
    assert stats2["tokens"] == stats1["tokens"]  # the two ranks together saw every token once
    # the policy's entropy on the step's tokens, merged over ranks as a token mean
    rtol = entropy_rtol(load_causal_lm(tiny_model).config, longest, tokens)
    assert 0 < stats1["entropy"] and stats2["entropy"] == pytest.approx(stats1["entropy"], rel=rtol)


@pytest.mark.parametrize("ranks, stage, minis", [(1, 0, 1), (2, 1, 2)])
def test_a_step_streamed_in_parts_takes_the_step_of_the_whole_batch(ray_cluster, tiny_model, tmp_path, ranks, stage, minis):
    """train.stream_groups: a step opened, its sequences streamed in sends (the first of one
    sequence: a rank gets none) with advantages before whitening (here twice the whitened ones),
    each send of one mini-batch, and closed with the mini-batches' normalizers and the whitening
    divisor takes train_step's step (or steps) on the whole batch: the same gradient norm before
    clipping, the same entropy at the step's start and the same weights."""
    _, sequences = batch(tiny_model, count=12)
    unwhitened = [replace(s, advantages=[2.0 * a for a in s.advantages]) for s in sequences]
    halves = [unwhitened[:6], unwhitened[6:]] if minis == 2 else [unwhitened]  # as train_step splits them
    results = {}
    for mode in ("whole", "streamed"):
        config = LearnerConfig(num_ranks=ranks if mode == "streamed" else 1, zero_stage=stage, optimizer_steps=minis, lr=1e-3,
                               max_tokens_per_micro_batch=200)
        learner = LearnerGroup(str(tiny_model), config)
        try:
            if mode == "whole":
                stats = learner.train_step(sequences, *loss(config))
            else:
                learner.open_step(*loss(config)[:3])
                for part, mini in [(unwhitened[:1], 0), (unwhitened[1:5], 0), (unwhitened[5:6], 0), (unwhitened[6:9], minis - 1),
                                   (unwhitened[9:], minis - 1)]:
                    learner.stream(part, mini)
                stats = learner.close_step(halves, config.loss.aggregation, 48, divisor=2.0)
            results[mode] = saved_weights(learner, tmp_path / mode), stats
        finally:
            learner.kill()
    (whole, whole_stats), (streamed, streamed_stats) = results["whole"], results["streamed"]
    # other ranks and micro-batches: other orders of the same reductions (tests/rounding.py)
    tokens, longest = sizes(sequences)
    initial = load_causal_lm(tiny_model)
    assert whole_stats["grad_norm"] > 0  # the mean of its optimizer steps'
    assert streamed_stats["grad_norm"] == pytest.approx(whole_stats["grad_norm"], rel=grad_norm_rtol(tokens))
    assert streamed_stats["tokens"] == whole_stats["tokens"]
    assert streamed_stats["entropy"] == pytest.approx(whole_stats["entropy"], rel=entropy_rtol(initial.config, longest, tokens))
    assert_same_adam_steps(streamed, whole, initial.state_dict(), 1e-3, minis, tokens)


def test_a_streamed_call_that_failed_fails_the_close(ray_cluster, tiny_model):
    """A streamed call's error is not lost once the learner is idle again: the close raises it, and
    no optimizer step is taken on part of the step."""
    _, sequences = batch(tiny_model, count=2)
    config = LearnerConfig(optimizer_steps=1)
    learner = LearnerGroup(str(tiny_model), config)
    try:
        learner.open_step(*loss(config)[:3])
        learner.stream([replace(sequences[0], advantages=[1.0])])  # one advantage for several tokens: the rank raises
        while learner.busy():
            time.sleep(0.05)
        learner.stream(sequences[1:])
        with pytest.raises(ray.exceptions.RayTaskError, match="advantages"):
            learner.close_step([sequences], config.loss.aggregation, 48, divisor=1.0)
    finally:
        learner.kill()


def test_the_step_gradient_norm_counts_every_optimizer_step(ray_cluster, tiny_model):
    """With two optimizer steps a step, one sample's advantage makes one of them move: its norm
    reaches the step's grad_norm wherever that sample falls (a last mini-batch of equal rewards
    once reported 0 for a step that moved the weights)."""
    _, sequences = batch(tiny_model, count=4)
    config = LearnerConfig(optimizer_steps=2)
    learner = LearnerGroup(str(tiny_model), config)
    try:
        for moved in range(len(sequences)):
            for i, seq in enumerate(sequences):
                seq.advantages = [float(i == moved)] + [0.0] * (len(seq.completion_ids) - 1)
            assert learner.train_step(sequences, *loss(config))["grad_norm"] > 0, moved
    finally:
        learner.kill()


def test_token_advantages_and_the_mask_reach_the_loss(ray_cluster, tiny_model, tmp_path):
    """All advantages zero: nothing moves; one non-zero advantage on a masked token (not the
    policy's): nothing moves either; the same advantage on a token of the policy's moves the weights
    (at learning rate 0 for the step, it does not)."""
    _, sequences = batch(tiny_model, count=4)
    config = LearnerConfig(optimizer_steps=1)
    learner = LearnerGroup(str(tiny_model), config)
    try:
        initial = saved_weights(learner, tmp_path / "initial")
        for seq in sequences:
            seq.advantages = [0.0] * len(seq.completion_ids)
        assert learner.train_step(sequences, *loss(config))["grad_norm"] == 0.0
        sequences[0].advantages[0] = 1.0
        sequences[0].mask = [False] + [True] * (len(sequences[0].completion_ids) - 1)
        assert learner.train_step(sequences, *loss(config))["grad_norm"] == 0.0
        unchanged = saved_weights(learner, tmp_path / "unchanged")
        sequences[0].mask = None
        assert learner.train_step(sequences, *loss(config), lr=0.0)["grad_norm"] > 0  # the step's rate reaches AdamW
        at_zero = saved_weights(learner, tmp_path / "at-zero")
        assert learner.train_step(sequences, *loss(config))["grad_norm"] > 0
        changed = saved_weights(learner, tmp_path / "changed")
    finally:
        learner.kill()
    assert all(torch.equal(unchanged[n], initial[n]) and torch.equal(at_zero[n], initial[n]) for n in initial)
    assert any(not torch.equal(changed[n], initial[n]) for n in initial)


@pytest.mark.parametrize("value_model, stage", [("separate", 3), ("shared", 2)])
def test_ppo_value_model_and_moving_kl_reference_learn_stay_out_of_the_policy_and_resume(ray_cluster, tiny_model, tmp_path, value_model, stage):
    """PPO's value model (its own engine at ZeRO-3, built from the policy after an SFT step; or a head
    on the policy at ZeRO-2, idle through SFT): it starts at zero, its loss falls as it learns fixed
    returns, the policy it publishes has no value tensor, and a checkpoint brings its estimates back
    exactly, and the KL reference as it had moved. (The default config, ZeRO-0 with a separate model,
    runs in tests/test_end_to_end.py.)"""
    examples, sequences = batch(tiny_model, count=6)
    config = LearnerConfig(advantage={"type": "ppo", "value_model": value_model, "value_loss_coef": 1.0}, zero_stage=stage,
                           optimizer_steps=2, lr=1e-3, max_tokens_per_micro_batch=256,
                           kl={"coef": 0.05, "into": "reward", "reference_mix": 0.5})
    for seq in sequences:
        seq.returns = [0.8] * len(seq.completion_ids)
    learner = LearnerGroup(str(tiny_model), config)
    losses, first = [], None
    try:
        assert learner.sft_step(examples)["grad_norm"] > 0
        for _ in range(5):
            kl, values = learner.token_stats(sequences, 1.0, kl=False, values=True)
            assert kl is None and [len(v) for v in values] == [len(s.completion_ids) for s in sequences]
            first = first or values
            for seq, v in zip(sequences, values):
                seq.values = v
            stats = learner.train_step(sequences, *loss(config))
            losses.append(stats["value_loss"])
            assert 0.0 <= stats["value_clip_fraction"] <= 1.0 and stats["grad_norm"] > 0
        learner.mix_reference(0.5)  # half-way from model.path's weights to the policy
        learner.save(str(tmp_path / "ckpt"), with_state=True)
        saved_kl, saved_values = learner.token_stats(sequences, 1.0, kl=True, values=True)
    finally:
        learner.kill()
    assert all(v == 0.0 for row in first for v in row)  # the head starts at zero: the first advantages are the returns
    assert losses[-1] < 0.5 * losses[0], losses
    published = load_causal_lm(tmp_path / "ckpt").state_dict()  # no unexpected (value) tensor in the Hugging Face export
    assert set(published) == set(load_causal_lm(tiny_model).state_dict())
    resumed = LearnerGroup(str(tiny_model), config)
    try:
        resumed.load_state(str(tmp_path / "ckpt"))
        kl, values = resumed.token_stats(sequences, 1.0, kl=True, values=True)
    finally:
        resumed.kill()
    assert values == saved_values
    assert kl == saved_kl and max(max(k) for k in kl) > 1e-3


def test_deepspeeds_cpu_collectives_op_is_kept_by_its_content_not_its_virtualenv(tmp_path):
    """A fresh virtualenv (a fresh clone, CI) finds the op compiled for another with the same files
    and versions; a changed source is compiled anew."""
    from learner.ops import library_path, shm_comm_builder

    builder = shm_comm_builder()
    assert builder is not None, "DeepSpeed has no shared-memory collectives op on this machine"
    here = library_path(builder)
    source = Path(builder.deepspeed_src_path(builder.sources()[0])).parent
    elsewhere = tmp_path / "other-venv" / source.name
    shutil.copytree(source, elsewhere)
    builder.deepspeed_src_path = lambda path: str(elsewhere / Path(path).name)
    assert library_path(builder) == here
    (elsewhere / "shm.cpp").write_text((source / "shm.cpp").read_text() + "\n// changed\n")
    assert library_path(builder) != here
