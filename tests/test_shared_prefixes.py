"""learner.share_prefixes: a prefix shared by several sequences, computed once, gives every sequence
the logprobs, entropies and gradients it gets computed alone (fp32, to float rounding): a group's
samples of one prompt, two equal samples, and a multi-turn trajectory trained as turns (each turn's
context repeats the turns before it); in one process, and in the learner under ZeRO-3 and LoRA."""
from __future__ import annotations

import pytest
import torch

from coderloo.controller import sft_examples
from coderloo.tasksets.synthetic import synthetic_suite
from common.hf import load_causal_lm, load_tokenizer
from learner.batch import TrainSequence, pack
from learner.logits import chunked_logprobs, final_hidden_states
from tests.rounding import assert_same_adam_steps, entropy_rtol, grad_norm_rtol, logprob_bound, sizes


def shared_prefix_sequences(tiny_model) -> list[TrainSequence]:
    """Groups of 4 samples of 3 prompts (completions of different lengths), a fifth sample equal to
    another, and a 3-turn trajectory as turns; with sampler logprobs and advantages."""
    examples = sft_examples(synthetic_suite()["train"][:12], load_tokenizer(tiny_model))
    g = torch.Generator().manual_seed(0)
    seqs = []
    for group in range(3):
        prompt = examples[group][0]
        for j in range(4):
            seqs.append(TrainSequence(prompt, examples[3 * j + group][1]))
    seqs.append(TrainSequence(seqs[0].prompt_ids, list(seqs[0].completion_ids)))
    context = examples[3][0]
    for turn in range(3):
        completion = examples[4 + turn][1]
        seqs.append(TrainSequence(context, completion))
        context = context + completion + examples[8 + turn][0][:6]  # the turn, then an observation
    for s in seqs:
        n = len(s.completion_ids)
        s.sampler_logprobs = (-torch.rand(n, generator=g)).tolist()
        s.advantages = [float(torch.randn(1, generator=g))] * n
    return seqs


def test_a_shared_prefix_gives_each_sequence_its_logprobs_entropies_and_gradients(tiny_model):
    """Per token, logprobs and entropies within float32 rounding of the forward; per parameter,
    the gradient of a loss that weighs every sequence's tokens differently within the rounding of
    its reduction over the tokens, relative to the tensor's largest entry (tests/rounding.py)."""
    model = load_causal_lm(tiny_model)
    seqs = shared_prefix_sequences(tiny_model)
    out = {}
    for share in (False, True):
        model.zero_grad()
        b = pack(seqs, 0, share_prefixes=share)
        hidden = final_hidden_states(model, model, b.model_inputs())
        logprobs, entropy = chunked_logprobs(hidden, model.get_output_embeddings(), b.input_ids, b.completion_positions, 0.7, 64, entropy=True)
        loss = sum((logprobs[r, s:s + len(q.completion_ids)] * torch.linspace(-1, 2, len(q.completion_ids)) * (i + 1)).sum()
                   + entropy[r, s:s + len(q.completion_ids)].sum() for i, ((r, s), q) in enumerate(zip(b.placements, seqs)))
        loss.backward()
        out[share] = (b, b.completion_rows(seqs, logprobs.detach()), b.completion_rows(seqs, entropy.detach()),
                      {n: p.grad.clone() for n, p in model.named_parameters()})
    (alone, lp, ent, grads), (shared, lp_shared, ent_shared, grads_shared) = out[False], out[True]
    assert shared.computed_tokens < 0.75 * alone.computed_tokens and shared.sequence_tokens == alone.sequence_tokens
    assert shared.attention_mask is not None and alone.attention_mask is None
    # the 4-D mask reduces the same terms in other orders (tests/rounding.py); the temperature
    # divides the logits and their errors; an entropy is a mean of logprobs, within their bound
    tokens, longest = sizes(seqs)
    bound = logprob_bound(model, longest) / 0.7
    for i in range(len(seqs)):
        assert lp_shared[i] == pytest.approx(lp[i], abs=bound), f"sequence {i}"
        assert ent_shared[i] == pytest.approx(ent[i], abs=bound), f"sequence {i}"
    for name, grad in grads.items():
        scale = grad.abs().max().item()
        assert scale > 0, name
        torch.testing.assert_close(grads_shared[name], grad, rtol=0, atol=grad_norm_rtol(tokens) * scale, msg=name)


@pytest.mark.parametrize("setting", ["zero3-2-ranks", "lora"])
def test_the_learner_takes_the_same_step_with_shared_prefixes(ray_cluster, tiny_model, tmp_path, setting):
    """One RL step with a KL term (the reference's forward shares prefixes too): the same loss, KL,
    entropy and weights as without, and fewer tokens computed."""
    from learner.config import LearnerConfig, LoraSettings
    from learner.group import LearnerGroup
    from safetensors.torch import load_file

    from learner import lora as lora_files
    from test_learner_actor import loss, saved_weights

    seqs = shared_prefix_sequences(tiny_model)
    results = {}
    for share in (False, True):
        if setting == "lora":
            config = LearnerConfig(optimizer_steps=1, lr=1e-3, kl={"coef": 0.1}, share_prefixes=share, lora=LoraSettings(rank=8, alpha=16))
        else:
            config = LearnerConfig(num_ranks=2, zero_stage=3, optimizer_steps=1, lr=1e-3, kl={"coef": 0.1}, share_prefixes=share)
        learner = LearnerGroup(str(tiny_model), config)
        try:
            stats = learner.train_step(seqs, *loss(config))
            weights = saved_weights(learner, tmp_path / str(share))
            if setting == "lora":  # what trains: the adapter (the merged weights move by B A)
                weights = load_file(tmp_path / str(share) / lora_files.ADAPTER_DIR / "adapter_model.safetensors")
            results[share] = stats, weights
        finally:
            learner.kill()
    (stats, weights), (shared_stats, shared_weights) = results[False], results[True]
    assert shared_stats["learner_tokens"] < 0.8 * stats["learner_tokens"]
    assert stats["shared_prefix_share"] == 0 < shared_stats["shared_prefix_share"]
    # the masked forward reduces the same terms in other orders (tests/rounding.py): sums over the
    # batch's tokens of terms of either sign (loss, gradient), or of one sign (KL, entropy)
    tokens, longest = sizes(seqs)
    model = load_causal_lm(tiny_model)
    rtol = {"loss": grad_norm_rtol(tokens), "grad_norm": grad_norm_rtol(tokens), "kl": entropy_rtol(model.config, longest, tokens),
            "entropy": entropy_rtol(model.config, longest, tokens)}
    for key, tolerance in rtol.items():
        assert shared_stats[key] == pytest.approx(stats[key], rel=tolerance), key
    assert shared_stats["tokens"] == stats["tokens"]
    # PEFT starts B at 0, so A has no gradient at the first step and only B moves
    initial = {n: torch.zeros_like(t) if ".lora_B." in n else t for n, t in weights.items()} if setting == "lora" else model.state_dict()
    assert_same_adam_steps(shared_weights, weights, initial, config.lr, 1, tokens)
