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
from pydantic import TypeAdapter
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

from learner.advantages import dr_grpo_advantages, grpo_advantages, reinforce_advantages, rloo_advantages
from learner.config import LearnerConfig, PolicyLoss
from learner.losses import LossInputs, policy_loss, token_entropy, token_logprobs
from tests.rounding import UNIT_ROUNDOFF, grad_norm_rtol, logprob_bound

G, K, T = 3, 4, 6  # prompt groups, samples per prompt, completion tokens
PROMPTS = ["def add(a, b):", "def is_even(n):", "class Stack:"]
CLIP_EPS = 0.2
# Tolerances of ours against TRL (tests/rounding.py): both sides run the same forward and compute
# the same formulas in other float32 orders. A group statistic reduces K terms, then a division and
# a square root add an ulp each: (K + 2) u of the largest advantage. A loss is a mean of G K T
# per-token terms, each at most 4 times the largest advantage (the ratio is clipped to 1 + eps_high
# or delta, all below 4): G K T u of that. Its gradients pass terms off by as much through one same
# backward, whose sums over the tokens cancel to about sqrt(G K T) of their terms' sizes: the
# gradient norm's bound, of each tensor's largest gradient.
ADVANTAGE_RTOL = (K + 2) * UNIT_ROUNDOFF
TOKENS = G * K * T
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
    assert_advantages_close(theirs, ours)
    # The comparison can fail: a wrong grouping or no baseline gives different advantages.
    assert (theirs - rloo_advantages(rewards.reshape(K, G)).flatten()).abs().max().item() > 1e-2
    assert (theirs - reinforce_advantages(rewards).flatten()).abs().max().item() > 1e-2


def test_grpo_advantages_match_trl_with_the_unbiased_group_std(tiny_model, tmp_path):
    rewards = _rewards()
    trainer = _trainer(GRPOTrainer, GRPOConfig, tiny_model, tmp_path, rewards, beta=0.0, scale_rewards="group")
    theirs = _generation_batch(trainer)["advantages"]
    ours = grpo_advantages(rewards, eps=TRL_GRPO_EPS).flatten()
    assert_advantages_close(theirs, ours)
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


def _our_loss(trainer, inputs: dict, advantages: torch.Tensor, **fields) -> tuple[torch.Tensor, dict, list[torch.Tensor]]:
    """Our policy_loss on TRL's logprobs of the same batch, with the learner.loss section of
    `fields` (clip at CLIP_EPS unless they say otherwise), no mismatch correction unless they give
    one (against the sampler's logprobs in `inputs`, where TRL's vLLM path put them)."""
    model = trainer.model
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    logps, _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, T)
    old = inputs["old_per_token_logps"]
    sampler = inputs.get("sampling_per_token_logps", old)
    per_token = advantages.unsqueeze(1).expand_as(logps)
    section = {"type": "clip", "mismatch": None, **fields}
    if section["type"] == "clip":
        section = {"eps_low": CLIP_EPS, "eps_high": CLIP_EPS, **section}
    config = TypeAdapter(PolicyLoss).validate_python(section)
    loss, stats = policy_loss(LossInputs(logps, old, sampler, per_token, inputs["completion_mask"]), config, max_new_tokens=T)
    params = [p for p in model.parameters() if p.requires_grad]
    return loss, stats, list(torch.autograd.grad(loss, params))


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def assert_advantages_close(theirs: torch.Tensor, ours: torch.Tensor) -> None:
    assert (theirs - ours).abs().max().item() <= ADVANTAGE_RTOL * ours.abs().max().item()


def assert_loss_close(trl_loss, trl_grads: list[torch.Tensor], our_loss, our_grads: list[torch.Tensor], advantages) -> None:
    assert abs(trl_loss.item() - our_loss.item()) <= TOKENS * UNIT_ROUNDOFF * 4 * advantages.abs().max().item()
    for theirs, ours in zip(trl_grads, our_grads, strict=True):
        assert (theirs - ours).abs().max().item() <= grad_norm_rtol(TOKENS) * ours.abs().max().item()


# Every policy loss TRL 1.16's GRPOTrainer offers, with the learner config that reproduces it, and a
# config that must not (a negative control besides flipped advantages; None where flipping is the
# only one: bnpo and dapo are our default). TRL's aggregations: "grpo" and "sapo" average each
# sequence's token mean; "bnpo" divides by the batch's tokens and "dapo", "cispo" and "vespo" by
# num_items_in_batch, the generation batch's tokens (with one batch per step, both our token mean);
# "dr_grpo" divides the token sum by sequences x max_completion_length; "luspo" averages each
# sequence's token sum. TRL's CISPO caps the weight at epsilon_high itself (ours at 1 + eps_high).
TRL_VARIANTS = {
    "grpo": ({"loss_type": "grpo"}, {"aggregation": "seq_mean_token_mean"}, {}),
    "bnpo": ({"loss_type": "bnpo"}, {}, None),
    "dapo": ({"loss_type": "dapo"}, {}, None),
    "dr_grpo": ({"loss_type": "dr_grpo"}, {"aggregation": "seq_mean_token_sum_norm"}, {"aggregation": "seq_mean_token_sum"}),
    "cispo": ({"loss_type": "cispo", "epsilon_high": 1.25}, {"type": "cispo", "eps_high": 0.25}, {"eps_high": 0.25}),
    "sapo": ({"loss_type": "sapo"}, {"type": "sapo", "aggregation": "seq_mean_token_mean"}, {"aggregation": "seq_mean_token_mean"}),
    "luspo": ({"loss_type": "luspo", "importance_sampling_level": "sequence"},
              {"importance_level": "sequence", "aggregation": "seq_mean_token_sum"}, {"aggregation": "seq_mean_token_sum"}),
    "vespo": ({"loss_type": "vespo"}, {"type": "vespo"}, {}),
    "dapo+epsilon_high": ({"loss_type": "dapo", "epsilon_high": 0.28}, {"eps_high": 0.28}, {}),
    "dapo+delta": ({"loss_type": "dapo", "delta": 1.5}, {"delta": 1.5}, {}),
    "gspo": ({"loss_type": "grpo", "importance_sampling_level": "sequence"},
             {"importance_level": "sequence", "aggregation": "seq_mean_token_mean"}, {"aggregation": "seq_mean_token_mean"}),
}


@pytest.mark.parametrize("variant", list(TRL_VARIANTS))
def test_policy_loss_matches_trl(tiny_model, tmp_path, variant):
    theirs_config, ours_config, control = TRL_VARIANTS[variant]
    rewards = _rewards()
    trainer = _trainer(GRPOTrainer, GRPOConfig, tiny_model, tmp_path, rewards, beta=0.0, **theirs_config)
    inputs = _loss_inputs(trainer, rewards)

    trl_loss, trl_grads = _trl_loss(trainer, inputs)
    our_loss, stats, our_grads = _our_loss(trainer, inputs, inputs["advantages"], **ours_config)
    assert_loss_close(trl_loss, trl_grads, our_loss, our_grads, inputs["advantages"])
    assert max(g.abs().max().item() for g in our_grads) > 1e-3  # the gradients are not trivially zero
    metrics = {key: values[-1] for key, values in trainer._metrics["train"].items()}
    # the clipped surrogates at token level: both sides are exercised and counted alike (TRL counts
    # sequences at sequence level, ours tokens)
    # (fractions of the G K T tokens: equal counts, or at least 1 / (G K T) apart)
    if "clip_ratio/low_mean" in metrics and theirs_config.get("importance_sampling_level", "token") == "token":
        assert 0.05 < stats["clip_fraction"] < 0.95
        assert stats["clip_fraction_low"] == pytest.approx(metrics["clip_ratio/low_mean"], abs=1e-6)
        assert stats["clip_fraction_high"] == pytest.approx(metrics["clip_ratio/high_mean"], abs=1e-6)
        assert stats["clip_fraction"] == pytest.approx(metrics["clip_ratio/region_mean"], abs=1e-6)

    # The comparison can fail: flipped advantages, or the neighbouring config, give another loss and gradients.
    wrong_loss, _, wrong_grads = _our_loss(trainer, inputs, -inputs["advantages"], **ours_config)
    assert abs(trl_loss.item() - wrong_loss.item()) > 1e-3 and _max_diff(trl_grads, wrong_grads) > 1e-3
    if control is not None:
        near_loss, _, near_grads = _our_loss(trainer, inputs, inputs["advantages"], **control)
        assert abs(trl_loss.item() - near_loss.item()) > 1e-4 or _max_diff(trl_grads, near_grads) > 1e-4


def _as_if_sampled_by_vllm(trainer, noise: float) -> None:
    """TRL 1.16 corrects the sampler/learner mismatch only on its vLLM path, inline in
    _generate_and_score_completions. Its generation here stays transformers', but each completion
    comes with per-token sampler logprobs as vLLM returns them: the model's own plus `noise` x a
    normal draw, so that TRL's own code computes the importance ratios."""
    generate = trainer._generate
    draw = torch.Generator().manual_seed(5)

    def sampled(prompts):
        trainer.use_vllm = False
        try:
            out = list(generate(prompts))
        finally:
            trainer.use_vllm = True
        logprobs = []
        for prompt_ids, completion_ids in zip(out[0], out[1]):
            ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
            with torch.no_grad():
                own, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, torch.ones_like(ids), len(completion_ids))
            logprobs.append((own[0] + noise * torch.randn(len(completion_ids), generator=draw)).tolist())
        out[4] = logprobs  # _generate's sampler logprobs, per completion
        return tuple(out)

    trainer._generate = sampled
    trainer.use_vllm = True


# Each mismatch correction as TRL 1.16 sets it (vllm_importance_sampling_mode and its bounds), ours,
# and a neighbouring config of ours that must not match. IcePop is TRL's token_mask with the band
# [0.5, 5].
TRL_MISMATCH = {
    "token_truncate": (("token_truncate", None, 2.0), {"mode": "token_truncate", "cap": 2.0}, {"mode": "token_mask", "cap": 2.0}),
    "token_mask": (("token_mask", 0.5, 2.0), {"mode": "token_mask", "cap": 2.0}, {"mode": "token_truncate", "cap": 2.0}),
    "icepop": (("token_mask", 0.5, 5.0), {"mode": "token_mask", "cap": 5.0, "floor": 0.5}, {"mode": "token_mask", "cap": 5.0}),
    "sequence_truncate": (("sequence_truncate", None, 2.0), {"mode": "sequence_truncate", "cap": 2.0},
                          {"mode": "token_truncate", "cap": 2.0}),
    "sequence_mask": (("sequence_mask", 0.5, 2.0), {"mode": "sequence_mask", "cap": 2.0}, {"mode": "token_mask", "cap": 2.0}),
}


@pytest.mark.parametrize("variant", list(TRL_MISMATCH))
def test_mismatch_corrections_match_trl(tiny_model, tmp_path, variant):
    (mode, clip_min, clip_max), ours, control = TRL_MISMATCH[variant]
    rewards = _rewards()
    trainer = _trainer(GRPOTrainer, GRPOConfig, tiny_model, tmp_path, rewards, beta=0.0)
    trainer.vllm_importance_sampling_correction = True
    trainer.vllm_importance_sampling_mode = mode
    trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max = clip_min, clip_max
    _as_if_sampled_by_vllm(trainer, noise=0.5)
    inputs = _generation_batch(trainer)
    weights = inputs["importance_sampling_ratio"]
    assert weights.shape[1] == (1 if mode.startswith("sequence") else T)
    kept = weights[weights > 0]
    assert 0 < kept.numel() < weights.numel() if mode.endswith("mask") else (weights == clip_max).any()  # the bound does work

    trl_loss, trl_grads = _trl_loss(trainer, inputs)
    our_loss, stats, our_grads = _our_loss(trainer, inputs, inputs["advantages"], mismatch=ours)
    assert_loss_close(trl_loss, trl_grads, our_loss, our_grads, inputs["advantages"])
    assert max(g.abs().max().item() for g in our_grads) > 1e-3
    if mode.startswith("token"):  # TRL's mean is over trained tokens here, over sequences at sequence level
        # logged as evaluation's: the model was in eval mode when the batch was generated
        logged = trainer._metrics["eval"]["sampling/importance_sampling_ratio/mean"][-1]
        assert stats["mismatch_weight_mean"] == pytest.approx(logged, rel=TOKENS * UNIT_ROUNDOFF)  # a mean of positive terms

    # The comparison can fail: without a correction, or with the neighbouring one, the loss or the gradients differ.
    for other in (None, control):
        near_loss, _, near_grads = _our_loss(trainer, inputs, inputs["advantages"], mismatch=other)
        assert abs(trl_loss.item() - near_loss.item()) > 1e-4 or _max_diff(trl_grads, near_grads) > 1e-4


def test_dr_grpo_advantages_match_trl_without_std_scaling(tiny_model, tmp_path):
    rewards = _rewards()
    trainer = _trainer(GRPOTrainer, GRPOConfig, tiny_model, tmp_path, rewards, beta=0.0, scale_rewards="none")
    theirs = _generation_batch(trainer)["advantages"]
    assert_advantages_close(theirs, dr_grpo_advantages(rewards).flatten())
    assert (theirs - grpo_advantages(rewards, eps=TRL_GRPO_EPS).flatten()).abs().max().item() > 1e-2


def test_truncated_completions_are_masked_as_trl_masks_them(tiny_model, tmp_path):
    """mask_truncated_completions: TRL zeroes the loss mask of a completion that did not end in EOS.
    Ours marks a turn truncated when the engine stopped it at max_new_tokens, and the algorithm seam
    masks it (learner.mask_truncated). On TRL's own generations (a model given many EOS tokens, so
    that some completions stop early), both mask the same rows, and the losses agree."""
    from learner.algorithm import StepSamples, build_batch
    from learner.batch import TrainSequence
    from learner.group import trained_tokens

    rewards = _rewards()
    trainer = _trainer(GRPOTrainer, GRPOConfig, tiny_model, tmp_path, rewards, beta=0.0, mask_truncated_completions=True)
    eos = list(range(40, 240))  # 200 of the 715 tokens end a completion: most stop within T = 6 tokens
    trainer.model.generation_config.eos_token_id = eos
    trainer.eos_token_ids = [trainer.processing_class.eos_token_id, *eos]
    batch = _generation_batch(trainer)
    ids, theirs = batch["completion_ids"], batch["completion_mask"]
    # ours: what the engine reports (stopped at an EOS, or at max_new_tokens), through the seam
    sequences = []
    for row in range(G * K):
        length = next((t + 1 for t in range(T) if ids[row, t].item() in trainer.eos_token_ids), T)
        tokens = ids[row, :length].tolist()
        sequences.append([TrainSequence([0], tokens, [0.0] * length, truncated=tokens[-1] not in trainer.eos_token_ids)])
    truncated = [seq[0].truncated for seq in sequences]
    assert 0 < sum(truncated) < G * K  # some rows of each kind
    samples = StepSamples([sequences[g * K:(g + 1) * K] for g in range(G)], rewards)
    ours = build_batch(samples, LearnerConfig(mask_truncated=True, advantage={"filter_uninformative": False}), step=1)
    trained = [trained_tokens(seq) for seq in ours.sequences]
    assert [n > 0 for n in trained] == [bool(theirs[row].any()) for row in range(G * K)] == [not t for t in truncated]
    assert trained == theirs.sum(dim=1).tolist()  # the kept rows train on the same tokens

    inputs = {key: batch[key] for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    inputs["advantages"] = rloo_advantages(rewards).flatten()
    with torch.no_grad():
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, input_ids, torch.cat([inputs["prompt_mask"], theirs], dim=1), T)
    inputs["old_per_token_logps"] = logps + 0.4 * torch.randn(logps.shape, generator=torch.Generator().manual_seed(3))
    inputs["num_items_in_batch"] = theirs.sum()
    trl_loss, trl_grads = _trl_loss(trainer, inputs)
    our_loss, _, our_grads = _our_loss(trainer, inputs, inputs["advantages"])
    assert_loss_close(trl_loss, trl_grads, our_loss, our_grads, inputs["advantages"])
    unmasked = dict(inputs, completion_mask=(torch.arange(T)[None, :] < torch.tensor([len(s[0].completion_ids) for s in sequences])[:, None]).long())
    wrong_loss, _, _ = _our_loss(trainer, unmasked, inputs["advantages"])  # without masking: another loss
    assert abs(trl_loss.item() - wrong_loss.item()) > 1e-4


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
    bound = logprob_bound(trainer.model, input_ids.shape[1])  # the fused head and the logits round otherwise
    assert (theirs - ours)[mask].abs().max().item() <= bound
    with torch.no_grad():
        _, their_entropy, _ = trainer._get_per_token_logps_and_entropies(trainer.model, input_ids, attention_mask, T, compute_entropy=True)
    our_entropy = token_entropy(logits)[:, -T:]
    assert (their_entropy - our_entropy)[mask].abs().max().item() <= bound
    assert (their_entropy - token_entropy(logits, temperature=2.0)[:, -T:])[mask].abs().max().item() > 1e-2
    shifted = token_logprobs(logits, input_ids.roll(1, dims=1))[:, -T:]  # off by one token: must not match
    assert (theirs - shifted)[mask].abs().max().item() > 1e-2
