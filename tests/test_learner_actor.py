"""The DeepSpeed learner at each ZeRO stage and with two ranks: steps change the weights, the
weights it publishes are whole (ZeRO-3 partitions them), and ranks stay identical."""
import pytest
import ray
import torch

from coderloo.config import LearnerConfig
from coderloo.controller import sft_examples
from coderloo.models import load_causal_lm, load_tokenizer
from coderloo.tasksets.synthetic import synthetic_suite
from learner.batch import TrainSequence
from learner.group import LearnerGroup
from rollout_workers import RolloutGroup, RolloutWorker


def batch(tiny_model, count=8):
    examples = sft_examples(synthetic_suite()["train"][:count], load_tokenizer(tiny_model))
    sequences = [TrainSequence(p, c, [-1.0] * len(c), 1.0 if i % 2 else -1.0) for i, (p, c) in enumerate(examples)]
    return examples, sequences


@pytest.mark.parametrize("stage", [1, 3])
def test_zero_stage_trains_and_publishes_whole_weights(ray_cluster, tiny_model, stage):
    config = LearnerConfig(zero_stage=stage, optimizer_steps=2, kl_coef=0.1, max_tokens_per_micro_batch=256)
    learner = LearnerGroup(str(tiny_model), config, 1.0, sft_lr=1e-3)
    worker = RolloutWorker.remote(str(tiny_model), "transformers", threads=1)
    try:
        examples, sequences = batch(tiny_model)
        stats = learner.sft_step(examples)
        assert stats["grad_norm"] > 0 and stats["sft_loss"] > 0
        stats = learner.train_step(sequences, kl_coef=0.1)
        assert stats["grad_norm"] > 0 and "kl" in stats
        published = learner.state_dicts()[0]
        # The push gathers whole weights too: the worker checks every bucket's sum on arrival.
        group = RolloutGroup([worker])
        group.connect(learner.weight_sources)
        group.push()
        assert ray.get(worker.get_version.remote()) == 1
    finally:
        learner.kill()
        ray.kill(worker)
    initial = load_causal_lm(tiny_model).state_dict()
    assert set(initial) <= set(published)
    for name, tensor in initial.items():
        assert published[name].shape == tensor.shape, name
    assert any(not torch.equal(published[n], initial[n]) for n in initial)
    assert torch.equal(published["lm_head.weight"], published["model.embed_tokens.weight"])


def test_two_ranks_zero2_stay_identical_and_match_one_rank(ray_cluster, tiny_model):
    """Two data-parallel ranks (gloo, ZeRO-2) after three steps: the same weights on both ranks,
    and the same weights as one rank given the whole batch (the loss normalizer spans ranks)."""
    _, sequences = batch(tiny_model, count=12)
    results = {}
    for ranks in (2, 1):
        config = LearnerConfig(num_ranks=ranks, zero_stage=2, optimizer_steps=2, lr=1e-3, max_tokens_per_micro_batch=200)
        learner = LearnerGroup(str(tiny_model), config, 1.0)
        try:
            for _ in range(3):
                stats = learner.train_step(sequences)
            results[ranks] = (learner.state_dicts(), stats)
        finally:
            learner.kill()
    (rank0, rank1), stats2 = results[2]
    (single,), stats1 = results[1]
    initial = load_causal_lm(tiny_model).state_dict()
    for name in initial:
        assert torch.equal(rank0[name], rank1[name]), f"{name} differs between ranks"
        assert torch.allclose(rank0[name], single[name], atol=1e-5), f"{name}: 2 ranks differ from 1 rank"
    assert any(not torch.allclose(rank0[n], initial[n]) for n in initial)
    assert stats2["tokens"] == stats1["tokens"]  # the two ranks together saw every token once


def test_token_advantages_reach_the_loss(ray_cluster, tiny_model):
    """Per-token advantages replace the sequence's: all zero, nothing moves although every sequence
    has an advantage of +-1; one non-zero token moves the weights."""
    _, sequences = batch(tiny_model, count=4)
    learner = LearnerGroup(str(tiny_model), LearnerConfig(optimizer_steps=1), 1.0)
    try:
        initial = learner.state_dicts()[0]
        for seq in sequences:
            seq.token_advantages = [0.0] * len(seq.completion_ids)
        assert learner.train_step(sequences)["grad_norm"] == 0.0
        unchanged = learner.state_dicts()[0]
        sequences[0].token_advantages[0] = 1.0
        assert learner.train_step(sequences)["grad_norm"] > 0
        changed = learner.state_dicts()[0]
    finally:
        learner.kill()
    assert all(torch.equal(unchanged[n], initial[n]) for n in initial)
    assert any(not torch.equal(changed[n], initial[n]) for n in initial)
