"""The learner's chunked logprobs and entropies (learner/logits.py) equal the whole-vocabulary
computation's within 1e-6, gradients included, and autograd keeps nothing of the size tokens x
vocabulary for the backward."""
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from learner.batch import TrainSequence, pack
from learner.logits import chunked_logprobs, final_hidden_states
from learner.losses import token_entropy, token_logprobs

VOCAB = 4099


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=256)
    return Qwen2ForCausalLM(config).float()


def batch_of(lengths: list[tuple[int, int]]):
    generator = torch.Generator().manual_seed(1)
    sequences = [TrainSequence(prompt_ids=torch.randint(VOCAB, (p,), generator=generator).tolist(),
                               completion_ids=torch.randint(VOCAB, (c,), generator=generator).tolist()) for p, c in lengths]
    return pack(sequences, pad_id=0)


def whole(model, batch, temperature):
    logits = model(**batch.model_inputs()).logits
    return token_logprobs(logits, batch.input_ids, temperature), token_entropy(logits, temperature)


def chunked(model, batch, temperature, chunk_tokens):
    hidden = final_hidden_states(model, model, batch.model_inputs())
    return chunked_logprobs(hidden, model.get_output_embeddings(), batch.input_ids, batch.completion_positions, temperature,
                            chunk_tokens, entropy=True)


@pytest.mark.parametrize("chunk_tokens", [1, 7, 10_000])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_chunked_logprobs_entropies_and_gradients_equal_the_whole_vocabulary_computation(model, chunk_tokens, dtype):
    """In float64 the two agree within 1e-9: the same function. In float32 the logprobs and entropies
    within 1e-6 of their scale and the gradients within 5e-6 of theirs (a parameter's largest
    gradient): rounding only (the head's matmul over a chunk of rows, and a gradient's sum over
    chunks, add in another order)."""
    model = model.to(dtype)
    batch = batch_of([(5, 9), (3, 20), (12, 4)])  # right-padded rows of different lengths
    where = batch.completion_positions
    weights = torch.randn(where.shape, generator=torch.Generator().manual_seed(2), dtype=dtype)
    outputs, grads = [], []
    for compute in (lambda: whole(model, batch, 0.7), lambda: chunked(model, batch, 0.7, chunk_tokens)):
        model.zero_grad()
        logprobs, entropies = compute()
        # a loss through both outputs, at the completion tokens only (as every loss of the learner)
        ((logprobs * weights + 0.1 * entropies)[where]).sum().backward()
        outputs.append((logprobs.detach(), entropies.detach()))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    (whole_logprobs, whole_entropies), (got_logprobs, got_entropies) = outputs
    assert got_logprobs.dtype == dtype
    assert (got_logprobs[~where] == 0).all()  # prompt and padding positions are not computed
    pairs = [(got_logprobs[where], whole_logprobs[where]), (got_entropies[where], whole_entropies[where])]
    pairs += [(grads[1][name], grads[0][name]) for name in grads[0]]
    for i, (got, expected) in enumerate(pairs):
        bound = 1e-9 if dtype == torch.float64 else (1e-6 if i < 2 else 5e-6) * expected.abs().max().item()
        assert (got - expected).abs().max().item() <= bound
    assert grads[1]["model.embed_tokens.weight"].abs().sum() > 0  # the tied head's gradient arrives
    model.float()


def saved_for_backward_bytes(compute, model) -> int:
    """Bytes of the tensors autograd keeps for the backward while `compute` runs, but the model's
    parameters (kept anyway)."""
    total = 0
    parameters = {p.data_ptr() for p in model.parameters()}

    def pack_hook(tensor):
        nonlocal total
        if tensor.data_ptr() not in parameters:
            total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda tensor: tensor):
        compute()
    return total


def test_autograd_keeps_no_logits_for_the_backward(model):
    batch = batch_of([(4, 60)] * 4)
    tokens = int(batch.completion_positions.sum())
    logits_bytes = tokens * VOCAB * 4
    body = saved_for_backward_bytes(lambda: final_hidden_states(model, model, batch.model_inputs()), model)
    kept_whole = saved_for_backward_bytes(lambda: whole(model, batch, 1.0), model) - body
    kept_chunked = saved_for_backward_bytes(lambda: chunked(model, batch, 1.0, chunk_tokens=16), model) - body
    assert kept_whole > 2 * logits_bytes  # the logits, their whole-vocabulary log-softmax and more
    assert kept_chunked < logits_bytes / 10  # beyond the decoder's own: each chunk's hidden states and targets
