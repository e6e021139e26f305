"""Packing sequences of different lengths into padded tensors for the learner."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TrainSequence:
    """One sampled completion, as the learner needs it."""

    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]  # the sampler's logprob of each completion token
    advantage: float
    token_advantages: list[float] | None = None  # one per completion token (dense rewards); None: `advantage` for each


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # [B, T], right-padded
    attention_mask: torch.Tensor  # [B, T]
    completion_mask: torch.Tensor  # [B, T-1], aligned with next-token logprobs
    old_logprobs: torch.Tensor  # [B, T-1]
    advantages: torch.Tensor  # [B, T-1], each completion token's (0 elsewhere)


def pack(sequences: list[TrainSequence], pad_id: int) -> PackedBatch:
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in sequences]
    width = max(lengths)
    batch = len(sequences)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    completion_mask = torch.zeros((batch, width - 1))
    old_logprobs = torch.zeros((batch, width - 1))
    advantages = torch.zeros((batch, width - 1))
    for row, seq in enumerate(sequences):
        for name, values in (("logprobs", seq.old_logprobs), ("token advantages", seq.token_advantages)):
            if values is not None and len(values) != len(seq.completion_ids):
                raise ValueError(f"sequence {row}: {len(values)} {name} for {len(seq.completion_ids)} completion tokens")
        ids = seq.prompt_ids + seq.completion_ids
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
        # Next-token position t predicts token t+1: completion token j sits at len(prompt)+j,
        # so it is predicted at position len(prompt)+j-1.
        start = len(seq.prompt_ids) - 1
        end = start + len(seq.completion_ids)
        completion_mask[row, start:end] = 1
        old_logprobs[row, start:end] = torch.tensor(seq.old_logprobs)
        advantages[row, start:end] = seq.advantage if seq.token_advantages is None else torch.tensor(seq.token_advantages)
    return PackedBatch(input_ids, attention_mask, completion_mask, old_logprobs, advantages)
