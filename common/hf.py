"""Loading Hugging Face causal LMs and tokenizers from local directories (no hub)."""
from __future__ import annotations

from pathlib import Path


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(path: str | Path, dtype: str = "float32"):
    """Load any Hugging Face causal LM from a local directory."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(path), dtype=getattr(torch, dtype), local_files_only=True
    )
