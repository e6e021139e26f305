"""Training sequences, and packing sequences of different lengths into tensors for the learner."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from learner.packing import row_width, rows_of


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
    """Sequences in rows of a [R, W] tensor, W the longest sequence or learner.pack_row_tokens: end
    to end when packed (learner/packing.py rows_of), one a row when padded, right-padded either way. The model keeps
    sequences apart by their position ids (each starts at 0; with no attention mask, transformers
    masks attention between the runs of position ids, whatever the attention implementation), so
    every sequence is computed as if alone in its row. The per-token tensors are [R, W-1], aligned
    with next-token logprobs."""

    input_ids: torch.Tensor  # [R, W]
    position_ids: torch.Tensor  # [R, W], each sequence's from 0; a row's padding continues the last sequence's
    completion_mask: torch.Tensor  # [R, W-1]: the tokens trained on
    completion_positions: torch.Tensor  # [R, W-1] bool: every completion token's (trained on or not): where logprobs are computed
    sampler_logprobs: torch.Tensor  # [R, W-1]
    advantages: torch.Tensor  # [R, W-1], each completion token's (0 elsewhere)
    old_values: torch.Tensor  # [R, W-1], PPO's values at the step's start (0 elsewhere or without them)
    returns: torch.Tensor  # [R, W-1], PPO's value targets (likewise)
    placements: list[tuple[int, int]]  # per sequence (in the order given to `pack`): its row and first column
    sequence_tokens: int  # the sequences' tokens, without padding

    def model_inputs(self, device=None) -> dict:
        """The model's keyword arguments: no attention mask, or the sequences of a row would see each
        other, and no KV cache (transformers keeps packed sequences apart only without one)."""
        return {"input_ids": self.input_ids.to(device), "position_ids": self.position_ids.to(device), "use_cache": False}

    @property
    def padding_share(self) -> float:
        return 1.0 - self.sequence_tokens / max(self.input_ids.numel(), 1)

    def completion_rows(self, sequences: list[TrainSequence], values: torch.Tensor) -> list[list[float]]:
        """Per sequence (those packed, in their order), the values of `values` [R, W-1] at its completion tokens."""
        out = []
        for (row, column), s in zip(self.placements, sequences, strict=True):
            start = column + len(s.prompt_ids) - 1
            out.append(values[row, start:start + len(s.completion_ids)].tolist())
        return out


def pack(sequences: list[TrainSequence], pad_id: int, packed: bool = True, row_tokens: int = 0) -> PackedBatch:
    """`sequences` in rows (end to end when `packed`, rows of learner/packing.py's `row_width`), with
    their per-token values at their completion tokens."""
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in sequences]
    for row, seq in enumerate(sequences):
        for name, values in (("sampler logprobs", seq.sampler_logprobs), ("advantages", seq.advantages), ("mask values", seq.mask),
                             ("values", seq.values), ("returns", seq.returns)):
            if values is not None and len(values) != len(seq.completion_ids):
                raise ValueError(f"sequence {row}: {len(values)} {name} for {len(seq.completion_ids)} completion tokens")
    rows = rows_of(lengths, list(range(len(sequences))), packed, row_tokens)
    width = row_width(lengths, list(range(len(sequences))), row_tokens if packed else 0)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(rows), width), dtype=torch.long)
    per_token = {name: torch.zeros((len(rows), width - 1)) for name in ("completion_mask", "sampler_logprobs", "advantages", "old_values", "returns")}
    completion_positions = torch.zeros((len(rows), width - 1), dtype=torch.bool)
    placements: list[tuple[int, int]] = [(0, 0)] * len(sequences)
    for r, members in enumerate(rows):
        column = 0
        for i in members:
            seq = sequences[i]
            placements[i] = (r, column)
            ids = seq.prompt_ids + seq.completion_ids
            input_ids[r, column:column + len(ids)] = torch.tensor(ids)
            position_ids[r, column:column + len(ids)] = torch.arange(len(ids))
            # Next-token position t predicts token t+1: completion token j sits at len(prompt)+j,
            # so it is predicted at position len(prompt)+j-1 (a sequence's first token is a prompt
            # token: no position predicts across two sequences' boundary).
            start = column + len(seq.prompt_ids) - 1
            end = start + len(seq.completion_ids)
            per_token["completion_mask"][r, start:end] = 1 if seq.mask is None else torch.tensor(seq.mask, dtype=torch.float)
            completion_positions[r, start:end] = True
            for name, values in (("sampler_logprobs", seq.sampler_logprobs), ("advantages", seq.advantages),
                                 ("old_values", seq.values), ("returns", seq.returns)):
                if values is not None:
                    per_token[name][r, start:end] = torch.tensor(values)
            column += len(ids)
        position_ids[r, column:] = torch.arange(position_ids[r, column - 1] + 1, position_ids[r, column - 1] + 1 + width - column)
    return PackedBatch(input_ids, position_ids, completion_positions=completion_positions, placements=placements,
                       sequence_tokens=sum(lengths), **per_token)
