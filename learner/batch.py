"""Training sequences, and packing sequences of different lengths into padded tensors for the learner."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TrainSequence:
    """One turn as the learner trains on it: the context, the tokens after it, and per token the
    sampler's logprob, the advantage and whether it is trained on (the policy produced it)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    sampler_logprobs: list[float] | None = None  # None: not sampled (SFT references, critic inputs)
    advantages: list[float] | None = None  # None: not yet computed (learner.algorithm.build_batch sets them)
    mask: list[bool] | None = None  # None: every completion token is trained on
    truncated: bool = False  # cut at max_new_tokens by the engine
    values: list[float] | None = None  # PPO: the value model's estimate before each token, at the step's start
    returns: list[float] | None = None  # PPO: each token's return (the value targets)


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # [B, T], right-padded
    attention_mask: torch.Tensor  # [B, T]
    completion_mask: torch.Tensor  # [B, T-1], aligned with next-token logprobs: the tokens trained on
    sampler_logprobs: torch.Tensor  # [B, T-1]
    advantages: torch.Tensor  # [B, T-1], each completion token's (0 elsewhere)
    old_values: torch.Tensor  # [B, T-1], PPO's values at the step's start (0 elsewhere or without them)
    returns: torch.Tensor  # [B, T-1], PPO's value targets (likewise)

    def completion_rows(self, sequences: list[TrainSequence], values: torch.Tensor) -> list[list[float]]:
        """Per sequence (the rows packed), the values of `values` [B, T-1] at its completion tokens."""
        return [values[row, len(s.prompt_ids) - 1: len(s.prompt_ids) - 1 + len(s.completion_ids)].tolist()
                for row, s in enumerate(sequences)]


def pack(sequences: list[TrainSequence], pad_id: int) -> PackedBatch:
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in sequences]
    width = max(lengths)
    batch = len(sequences)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    completion_mask = torch.zeros((batch, width - 1))
    sampler_logprobs = torch.zeros((batch, width - 1))
    advantages = torch.zeros((batch, width - 1))
    old_values = torch.zeros((batch, width - 1))
    returns = torch.zeros((batch, width - 1))
    for row, seq in enumerate(sequences):
        for name, values in (("sampler logprobs", seq.sampler_logprobs), ("advantages", seq.advantages), ("mask values", seq.mask),
                             ("values", seq.values), ("returns", seq.returns)):
            if values is not None and len(values) != len(seq.completion_ids):
                raise ValueError(f"sequence {row}: {len(values)} {name} for {len(seq.completion_ids)} completion tokens")
        ids = seq.prompt_ids + seq.completion_ids
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
        # Next-token position t predicts token t+1: completion token j sits at len(prompt)+j,
        # so it is predicted at position len(prompt)+j-1.
        start = len(seq.prompt_ids) - 1
        end = start + len(seq.completion_ids)
        completion_mask[row, start:end] = 1 if seq.mask is None else torch.tensor(seq.mask, dtype=torch.float)
        if seq.sampler_logprobs is not None:
            sampler_logprobs[row, start:end] = torch.tensor(seq.sampler_logprobs)
        for target, values in ((advantages, seq.advantages), (old_values, seq.values), (returns, seq.returns)):
            if values is not None:
                target[row, start:end] = torch.tensor(values)
    return PackedBatch(input_ids, attention_mask, completion_mask, sampler_logprobs, advantages, old_values, returns)
