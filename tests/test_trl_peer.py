"""Peer check against TRL (a test-only dependency, pinned in pyproject.toml).

TRL computes advantages and the policy loss inside its trainers, not in free functions, so this
builds small real RLOOTrainer / GRPOTrainer instances on the tiny randomly initialised Qwen2
model (built offline by the `tiny_model` fixture; nothing comes from the hub) and calls their own
methods: `_generate_and_score_completions` (it generates, scores with a scripted reward function
and returns the advantages), `_get_per_token_logps_and_entropies` and `compute_loss`.
"""
from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

from learner.advantages import grpo_advantages, reinforce_advantages, rloo_advantages
from learner.losses import LossConfig, LossInputs, policy_loss, token_logprobs

G, K, T = 3, 4, 6  # prompt groups, samples per prompt, completion tokens
PROMPTS = ["def add(a, b):", "def is_even(n):", "class Stack:"]
CLIP_EPS = 0.2
TOL = 1e-6
TRL_GRPO_EPS = 1e-4  # TRL divides by (group std + 1e-4), hard-coded in GRPOTrainer


def _rewards() -> torch.Tensor:
    """[G, K]: two groups of random rewards and one group of equal rewards (no signal)."""
    rewards = torch.rand(G, K, generator=torch.Generator().manual_seed(7))
    rewards[1] = 1.0
    return rewards


def _trainer(trainer_cls, config_cls, model_path, out_dir, rewards: torch.Tensor, **config):
    script = rewards.flatten().tolist()

    def scripted_reward(completions, **_):
        # TRL scores all G * K completions of the generation batch in one call, in prompt order.
        assert len(completions) == len(script)
        return list(script)

    args = config_cls(
        output_dir=str(out_dir),
        num_generations=K,
        per_device_train_batch_size=G * K,
        max_completion_length=T,
        epsilon=CLIP_EPS,
        bf16=False,  # TRL defaults to bf16 autocast (CPU too); compare in float32
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        seed=0,
        **config,
    )
    return trainer_cls(
        model=AutoModelForCausalLM.from_pretrained(model_path),
        reward_funcs=scripted_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        processing_class=AutoTokenizer.from_pretrained(model_path),
    )


def _generation_batch(trainer) -> dict:
    # What TRL's RepeatSampler hands the trainer: each prompt K times in a row.
    inputs = [{"prompt": p} for p in PROMPTS for _ in range(K)]
    with torch.no_grad():
        return trainer._generate_and_score_completions(inputs)


def test_rloo_advantages_match_trl(tiny_model, tmp_path):
    rewards = _rewards()
    trainer = _trainer(RLOOTrainer, RLOOConfig, tiny_model, tmp_path, rewards, beta=0.0, normalize_advantages=False)
    theirs = _generation_batch(trainer)["advantages"]
    ours = rloo_advantages(rewards).flatten()
    assert theirs.shape == (G * K,)
    assert (theirs - ours).abs().max().item() <= TOL
    # The comparison can fail: a wrong grouping or no baseline gives different advantages.
    assert (theirs - rloo_advantages(rewards.reshape(K, G)).flatten()).abs().max().item() > 1e-2
    assert (theirs - reinforce_advantages(rewards).flatten()).abs().max().item() > 1e-2


def test_grpo_advantages_match_trl_with_the_unbiased_group_std(tiny_model, tmp_path):
    rewards = _rewards()
    trainer = _trainer(GRPOTrainer, GRPOConfig, tiny_model, tmp_path, rewards, beta=0.0, scale_rewards="group")
    theirs = _generation_batch(trainer)["advantages"]
    ours = grpo_advantages(rewards, eps=TRL_GRPO_EPS).flatten()
    assert (theirs - ours).abs().max().item() <= TOL
    assert torch.equal(theirs[K : 2 * K], torch.zeros(K))  # the equal-reward group
    # The biased (divide by k) std would not match.
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    biased = (centred / (rewards.std(dim=1, keepdim=True, unbiased=False) + TRL_GRPO_EPS)).flatten()
    assert (theirs - biased).abs().max().item() > 1e-2


def _loss_inputs(trainer, rewards: torch.Tensor) -> dict:
    """A real generated batch, with completions cut to different lengths and off-policy old logprobs."""
    batch = _generation_batch(trainer)
    lengths = 1 + torch.arange(G * K) % T  # 1..T tokens
    mask = batch["completion_mask"] * (torch.arange(T)[None, :] < lengths[:, None]).to(batch["completion_mask"].dtype)
    assert len(set(mask.sum(dim=1).tolist())) > 2  # token mean and sequence mean really differ
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], mask], dim=1)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, input_ids, attention_mask, T)
    noise = torch.randn(logps.shape, generator=torch.Generator().manual_seed(3))
    return {
        "prompt_ids": batch["prompt_ids"],
        "prompt_mask": batch["prompt_mask"],
        "completion_ids": batch["completion_ids"],
        "completion_mask": mask,
        "advantages": rloo_advantages(rewards).flatten(),
        "old_per_token_logps": logps + 0.4 * noise,  # ratios well outside [1 - eps, 1 + eps]
        "num_items_in_batch": mask.sum(),  # as TRL's _generate_and_score_completions counts it
    }


def _trl_loss(trainer, inputs: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model = trainer.model
    model.train()
    # HF Trainer's loop sets this per optimizer step; one micro-batch per step here.
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer.compute_loss(model, inputs)
    params = [p for p in model.parameters() if p.requires_grad]
    return loss, list(torch.autograd.grad(loss, params))


def _our_loss(trainer, inputs: dict, advantages: torch.Tensor) -> tuple[torch.Tensor, dict, list[torch.Tensor]]:
    model = trainer.model
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    logps, _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, T)
    old = inputs["old_per_token_logps"]
    per_token = advantages.unsqueeze(1).expand_as(logps)
    config = LossConfig(clip_eps=CLIP_EPS, tis_cap=None, kl_coef=0.0, kl_estimator="k3", aggregation="token_mean", temperature=T)
    loss, stats = policy_loss(LossInputs(logps, old, old, per_token, inputs["completion_mask"]), config)
    params = [p for p in model.parameters() if p.requires_grad]
    return loss, stats, list(torch.autograd.grad(loss, params))


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


# TRL 1.16: "bnpo" divides the masked sum by the batch's mask sum; "dapo" (the default) divides by
# num_items_in_batch, the token count of the whole generation batch. With one batch per step
# both are our token mean over the batch.
@pytest.mark.parametrize("loss_type", ["bnpo", "dapo"])
def test_policy_loss_matches_trl(tiny_model, tmp_path, loss_type):
    rewards = _rewards()
    trainer = _trainer(GRPOTrainer, GRPOConfig, tiny_model, tmp_path, rewards, beta=0.0, loss_type=loss_type)
    inputs = _loss_inputs(trainer, rewards)

    trl_loss, trl_grads = _trl_loss(trainer, inputs)
    our_loss, stats, our_grads = _our_loss(trainer, inputs, inputs["advantages"])
    assert 0.1 < stats["clip_fraction"] < 0.9  # both branches of the min are exercised
    assert abs(trl_loss.item() - our_loss.item()) <= TOL
    assert _max_diff(trl_grads, our_grads) <= TOL
    assert max(g.abs().max().item() for g in our_grads) > 1e-3  # the gradients are not trivially zero

    # The comparison can fail: flipped advantages give another loss and other gradients.
    wrong_loss, _, wrong_grads = _our_loss(trainer, inputs, -inputs["advantages"])
    assert abs(trl_loss.item() - wrong_loss.item()) > 1e-3
    assert _max_diff(trl_grads, wrong_grads) > 1e-3


def test_trl_sequence_mean_aggregation_differs_from_ours(tiny_model, tmp_path):
    # TRL's loss_type="grpo" averages per sequence first: not what policy_loss computes when the
    # completions have different lengths. Guards against the match above being an accident.
    rewards = _rewards()
    trainer = _trainer(GRPOTrainer, GRPOConfig, tiny_model, tmp_path, rewards, beta=0.0, loss_type="grpo")
    inputs = _loss_inputs(trainer, rewards)
    trl_loss, _ = _trl_loss(trainer, inputs)
    our_loss, _, _ = _our_loss(trainer, inputs, inputs["advantages"])
    assert abs(trl_loss.item() - our_loss.item()) > 1e-3


def test_token_logprobs_match_trl(tiny_model, tmp_path):
    # TRL computes logprobs through its own fused lm-head path; ours goes through the logits.
    rewards = _rewards()
    trainer = _trainer(GRPOTrainer, GRPOConfig, tiny_model, tmp_path, rewards, beta=0.0)
    inputs = _loss_inputs(trainer, rewards)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    trainer.model.eval()
    with torch.no_grad():
        theirs, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, input_ids, attention_mask, T)
        logits = trainer.model(input_ids=input_ids, attention_mask=attention_mask).logits
    ours = token_logprobs(logits, input_ids)[:, -T:]
    mask = inputs["completion_mask"].bool()
    assert (theirs - ours)[mask].abs().max().item() <= 1e-5
    shifted = token_logprobs(logits, input_ids.roll(1, dims=1))[:, -T:]  # off by one token: must not match
    assert (theirs - shifted)[mask].abs().max().item() > 1e-2
