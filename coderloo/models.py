"""Loading causal LMs from local directories, and building a tiny one offline for CPU runs.

Any Hugging Face causal LM directory works (Qwen2.5-Coder is the target). On a machine with no
model hub, `build_tiny_model` trains a byte-level BPE tokenizer on a text corpus and writes a
randomly initialised Qwen2-architecture model next to it, in the same directory layout.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from pydantic import BaseModel, ConfigDict, Field

EOS_TOKEN = "<|endoftext|>"
# The chat form of Qwen2.5-Instruct (ChatML): each message between these special tokens, and
# <|im_end|> is the end of the assistant's turn and of the sequence.
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen2's pre-tokenizer pattern: digits are single tokens, so numbers compose from seen digits.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


class TinyModelSpec(BaseModel):
    """Shape of the tiny Qwen2 model built for CPU runs."""

    model_config = ConfigDict(extra="forbid")

    vocab_size: int = Field(default=1024, ge=300, description="BPE vocabulary size, special tokens included.")
    hidden_size: int = Field(default=128, ge=16, description="Width of the residual stream.")
    intermediate_size: int = Field(default=384, ge=16, description="Width of the MLP.")
    num_layers: int = Field(default=4, ge=1, description="Transformer blocks.")
    num_heads: int = Field(default=4, ge=1, description="Attention heads (head_dim = hidden_size / num_heads).")
    num_kv_heads: int = Field(default=2, ge=1, description="Key/value heads (grouped-query attention).")
    max_position_embeddings: int = Field(default=512, ge=64, description="Longest sequence the model accepts.")
    tie_word_embeddings: bool = Field(default=True, description="Share input embeddings and lm_head (as Qwen2.5 small models do).")
    vocab_rows: int | None = Field(
        default=None, ge=300,
        description="Embedding rows when more than the tokenizer's tokens (real models pad their vocabulary: "
        "Qwen2.5's 151,936), for a model of a real shape; None: the tokenizer's size.",
    )
    rope_theta: float = Field(default=10000.0, gt=0, description="RoPE base (Qwen2.5's: 1,000,000).")
    rms_norm_eps: float = Field(default=1e-6, gt=0, description="RMSNorm epsilon (Qwen2.5's: 1e-6).")
    seed: int = Field(default=0, description="Seed of the random initialisation.")
    chat: bool = Field(
        default=False,
        description="Give the tokenizer a ChatML chat template (Qwen2.5-Instruct's: <|im_start|>role ... <|im_end|>, "
        "both special tokens; <|im_end|> ends the turn and the sequence): an instruct model's shape of prompt.",
    )


def build_tokenizer(corpus: Iterable[str], vocab_size: int, out_dir: str | Path, chat: bool = False):
    """Train a byte-level BPE tokenizer and save it as a fast tokenizer that reloads id-for-id;
    with `chat`, with the ChatML special tokens and chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, IM_START, IM_END] if chat else [EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END if chat else EOS_TOKEN, pad_token=EOS_TOKEN)
    if chat:
        fast.chat_template = CHATML_TEMPLATE
    out_dir = Path(out_dir)
    fast.save_pretrained(out_dir)
    # A directory whose config says qwen2 would otherwise load as Qwen2Tokenizer, which re-tokenizes
    # a home-made BPE differently: pin the class so every loader (ours, vLLM's) gets these ids.
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return fast


def build_tiny_model(out_dir: str | Path, corpus: Iterable[str], spec: TinyModelSpec) -> Path:
    """Write a tokenizer and a randomly initialised tiny Qwen2 causal LM to `out_dir`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(corpus, spec.vocab_size, out_dir, spec.chat)
    config = Qwen2Config(
        vocab_size=max(len(tokenizer), spec.vocab_rows or 0),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rope_theta=spec.rope_theta,
        rms_norm_eps=spec.rms_norm_eps,
        torch_dtype="float32",
    )
    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir
