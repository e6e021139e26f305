"""The DeepSpeed learner at each ZeRO stage: steps change the weights, and the weights it publishes
are whole (ZeRO-3 partitions them)."""
import pytest
import ray
import torch

from coderloo.config import LearnerConfig
from coderloo.controller import sft_examples
from coderloo.models import load_causal_lm, load_tokenizer
from coderloo.tasksets.synthetic import synthetic_suite
from learner.actor import Learner
from learner.batch import TrainSequence
from rollout_workers import RolloutGroup, RolloutWorker


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stage_trains_and_publishes_whole_weights(ray_cluster, tiny_model, stage):
    config = LearnerConfig(zero_stage=stage, grad_accum_steps=2, optimizer_steps=2, kl_coef=0.1)
    learner = Learner.remote(str(tiny_model), config, 1.0, sft_lr=1e-3)
    worker = RolloutWorker.remote(str(tiny_model), "transformers", threads=1)
    try:
        examples = sft_examples(synthetic_suite()["train"][:8], load_tokenizer(tiny_model))
        stats = ray.get(learner.sft_step.remote(examples))
        assert stats["grad_norm"] > 0 and stats["sft_loss"] > 0
        sequences = [TrainSequence(p, c, [-1.0] * len(c), 1.0 if i % 2 else -1.0) for i, (p, c) in enumerate(examples)]
        stats = ray.get(learner.train_step.remote(sequences))
        assert stats["grad_norm"] > 0 and "kl" in stats
        published = ray.get(learner.state_dict.remote())
        # The push gathers whole weights too: the worker checks every bucket's sum on arrival.
        group = RolloutGroup([worker])
        group.connect(learner)
        group.push()
        assert ray.get(worker.get_version.remote()) == 1
    finally:
        ray.kill(learner)
        ray.kill(worker)
    initial = load_causal_lm(tiny_model).state_dict()
    assert set(initial) <= set(published)
    for name, tensor in initial.items():
        assert published[name].shape == tensor.shape, name
    assert any(not torch.equal(published[n], initial[n]) for n in initial)
    assert torch.equal(published["lm_head.weight"], published["model.embed_tokens.weight"])
