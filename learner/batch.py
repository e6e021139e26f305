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
class Tree:
    """Sequences laid out as one block of columns: a column per token, each after its parent column
    (the token before it in every sequence through it), at its depth as position. A lone sequence is
    a chain; `prefix_trees` shares prefixes. Each member's last prompt token and completion are
    consecutive columns of its own from `starts`, so column t predicts column t+1 there."""

    tokens: list[int]
    parents: list[int]  # -1: a first token
    depths: list[int]
    starts: list[tuple[int, int]]  # per member: (sequence index, the column of its last prompt token)

    @classmethod
    def chain(cls, index: int, seq: TrainSequence) -> Tree:
        n = len(seq.prompt_ids) + len(seq.completion_ids)
        return cls(seq.prompt_ids + seq.completion_ids, list(range(-1, n - 1)), list(range(n)), [(index, len(seq.prompt_ids) - 1)])

    @property
    def members(self) -> list[int]:
        return sorted(i for i, _ in self.starts)

    def visibility(self) -> torch.Tensor:
        """[n, n] bool: each column sees itself and its ancestors."""
        seen = torch.zeros((len(self.tokens), len(self.tokens)), dtype=torch.bool)
        for c, parent in enumerate(self.parents):
            if parent >= 0:
                seen[c] = seen[parent]
            seen[c, c] = True
        return seen


# A tree's columns at most this many times its longest sequence: a row's attention costs its width
# squared on a CPU (bench learner: micro-batches as one 6144-token row ran at 0.11x), and a group of
# k samples in one tree is about k/2 sequences wide.
TREE_WIDTH = 4


class _Growing:
    """A tree being built by `prefix_trees`."""

    def __init__(self):
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.depths: list[int] = []
        self.children: dict[tuple[int, int], int] = {}
        self.starts: list[tuple[int, int]] = []

    def shared(self, context: list[int]) -> tuple[int, int]:
        """How many of `context`'s first tokens the tree has, and the column of the last of them (-1: none)."""
        parent = -1
        for depth, token in enumerate(context):
            found = self.children.get((parent, token))
            if found is None:
                return depth, parent
            parent = found
        return len(context), parent

    def add(self, index: int, seq: TrainSequence) -> None:
        ids = seq.prompt_ids + seq.completion_ids
        depth, parent = self.shared(seq.prompt_ids[:-1])
        for d in range(depth, len(ids)):
            if d == len(seq.prompt_ids) - 1:
                self.starts.append((index, len(self.tokens)))
            self.tokens.append(ids[d])
            self.parents.append(parent)
            self.depths.append(d)
            self.children.setdefault((parent, ids[d]), len(self.tokens) - 1)
            parent = len(self.tokens) - 1


def tree_tokens(sequences: list[TrainSequence], budget: int = 0) -> int:
    """The columns a tree of `sequences` may have: TREE_WIDTH times the longest, within the
    micro-batch's token `budget` (learner.max_tokens_per_micro_batch; 0: none)."""
    width = TREE_WIDTH * max((len(s.prompt_ids) + len(s.completion_ids) for s in sequences), default=0)
    return min(width, budget) if budget else width


def prefix_trees(sequences: list[TrainSequence], max_tokens: int = 0) -> list[Tree]:
    """`sequences` as trees in which a shared prefix is computed once: the k samples of a group share
    their prompt, and a turn shares the earlier turns that its context repeats.

    A sequence reuses a tree's columns only for tokens it does not train on and that predict none it
    trains on: its prompt but the last token. From its last prompt token on it has columns of its
    own, which later sequences can reuse as their context; so sequences are placed shortest prompt
    first (a trajectory's turns in order), each in the tree where it adds the fewest columns while
    the tree stays within `max_tokens` (0: `tree_tokens`), else in a tree of
    its own. One copy of the last prompt token per sequence is the price: one column predicts one
    token. Trees come in the order of their first member."""
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in sequences]
    max_tokens = max_tokens or tree_tokens(sequences)
    growing: list[_Growing] = []
    for i in sorted(range(len(sequences)), key=lambda i: len(sequences[i].prompt_ids)):
        seq = sequences[i]
        if not seq.prompt_ids:
            raise ValueError(f"sequence {i} has no prompt token")
        fits = [(lengths[i] - tree.shared(seq.prompt_ids[:-1])[0], t) for t, tree in enumerate(growing)]
        fits = [(new, t) for new, t in fits if new < lengths[i] and len(growing[t].tokens) + new <= max_tokens]
        if fits:
            growing[min(fits)[1]].add(i, seq)
        else:
            growing.append(_Growing())
            growing[-1].add(i, seq)
    trees = [Tree(g.tokens, g.parents, g.depths, g.starts) for g in growing]
    return sorted(trees, key=lambda t: t.members[0])


def layout(sequences: list[TrainSequence], share_prefixes: bool, max_tokens: int = 0) -> list[Tree]:
    """Each sequence a chain, or with `share_prefixes` the prefix trees (`prefix_trees`)."""
    if share_prefixes:
        return prefix_trees(sequences, max_tokens)
    return [Tree.chain(i, s) for i, s in enumerate(sequences)]


@dataclass
class PackedBatch:
    """Trees of sequences (`layout`) in rows of a [R, W] tensor, W the largest tree or
    learner.pack_row_tokens: end to end when packed (learner/packing.py rows_of), one a row when
    padded, right-padded either way. Without shared prefixes each tree is one sequence, kept apart
    from the others in its row by its position ids (each starts at 0; with no attention mask,
    transformers masks attention between the runs of position ids, whatever the attention
    implementation); with them, `attention_mask` lets each column see its ancestors only. Either
    way every sequence is computed as if alone. The per-token tensors are [R, W-1], aligned with
    next-token logprobs."""

    input_ids: torch.Tensor  # [R, W]
    position_ids: torch.Tensor  # [R, W], each token's depth in its sequence; a row's padding continues the last tree's
    completion_mask: torch.Tensor  # [R, W-1]: the tokens trained on
    completion_positions: torch.Tensor  # [R, W-1] bool: every completion token's (trained on or not): where logprobs are computed
    sampler_logprobs: torch.Tensor  # [R, W-1]
    advantages: torch.Tensor  # [R, W-1], each completion token's (0 elsewhere)
    old_values: torch.Tensor  # [R, W-1], PPO's values at the step's start (0 elsewhere or without them)
    returns: torch.Tensor  # [R, W-1], PPO's value targets (likewise)
    segments: torch.Tensor  # [R, W-1] long: at each completion token its sequence's index (-1 elsewhere), for per-sequence sums
    placements: list[tuple[int, int]]  # per sequence (in the order given to `pack`): its row and the column of its first prediction
    sequence_tokens: int  # the sequences' tokens, without padding or sharing
    computed_tokens: int  # the trees' columns: the tokens the model computes, padding aside
    attention_mask: torch.Tensor | None = None  # [R, 1, W, W] bool with shared prefixes: who sees whom

    def model_inputs(self, device=None, mask_dtype: torch.dtype | None = None) -> dict:
        """The model's keyword arguments: no KV cache (transformers keeps packed sequences apart only
        without one), and no attention mask but the trees' (a padding mask would let the sequences
        of a row see each other). With `mask_dtype` (the model's, for sdpa attention), the mask a
        row needs, the trees' or the one transformers makes from packed rows' position ids, comes
        as one additive mask of that dtype: given a boolean one, torch's attention converts it to
        float in every layer and keeps each copy for the backward (W x W per row and layer)."""
        inputs = {"input_ids": self.input_ids.to(device), "position_ids": self.position_ids.to(device), "use_cache": False}
        mask = self.attention_mask
        if mask_dtype is not None:
            if mask is None:
                mask = packed_mask(self.position_ids)
            if mask is not None:
                mask = torch.zeros(mask.shape, dtype=mask_dtype, device=device).masked_fill_(~mask.to(device), float("-inf"))
        if mask is not None:
            inputs["attention_mask"] = mask.to(device)
        return inputs

    @property
    def padding_share(self) -> float:
        return 1.0 - self.computed_tokens / max(self.input_ids.numel(), 1)

    def completion_rows(self, sequences: list[TrainSequence], values: torch.Tensor) -> list[list[float]]:
        """Per sequence (those packed, in their order), the values of `values` [R, W-1] at its completion tokens."""
        return [values[row, start:start + len(s.completion_ids)].tolist()
                for (row, start), s in zip(self.placements, sequences, strict=True)]


def packed_mask(position_ids: torch.Tensor) -> torch.Tensor | None:
    """[R, 1, W, W] bool, who sees whom in rows of sequences packed end to end, by transformers' rule
    (masking_utils.find_packed_sequence_indices: a sequence starts where the position ids do not
    rise by 1) and causal; None when every row is one sequence (no mask needed)."""
    runs = (torch.diff(position_ids, prepend=position_ids[:, :1] - 1, dim=-1) != 1).cumsum(-1)
    if (runs[:, -1] == 0).all():
        return None
    width = position_ids.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool).tril_()
    return ((runs[:, :, None] == runs[:, None, :]) & causal)[:, None]


def pack(sequences: list[TrainSequence], pad_id: int, packed: bool = True, row_tokens: int = 0,
         share_prefixes: bool = False, max_tree_tokens: int = 0) -> PackedBatch:
    """`sequences` laid out as trees (`layout`, trees of at most `max_tree_tokens` columns) in rows
    (end to end when `packed`, rows of learner/packing.py's `row_width`), with their per-token
    values at their completion tokens."""
    for row, seq in enumerate(sequences):
        for name, values in (("sampler logprobs", seq.sampler_logprobs), ("advantages", seq.advantages), ("mask values", seq.mask),
                             ("values", seq.values), ("returns", seq.returns)):
            if values is not None and len(values) != len(seq.completion_ids):
                raise ValueError(f"sequence {row}: {len(values)} {name} for {len(seq.completion_ids)} completion tokens")
    trees = layout(sequences, share_prefixes, max_tree_tokens)
    sizes = [len(t.tokens) for t in trees]
    rows = rows_of(sizes, list(range(len(trees))), packed, row_tokens)
    width = row_width(sizes, list(range(len(trees))), row_tokens if packed else 0)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(rows), width), dtype=torch.long)
    per_token = {name: torch.zeros((len(rows), width - 1)) for name in ("completion_mask", "sampler_logprobs", "advantages", "old_values", "returns")}
    completion_positions = torch.zeros((len(rows), width - 1), dtype=torch.bool)
    segments = torch.full((len(rows), width - 1), -1, dtype=torch.long)
    attention_mask = None
    if share_prefixes:  # padding sees itself only: a row that sees nothing would make NaNs
        attention_mask = torch.eye(width, dtype=torch.bool).repeat(len(rows), 1, 1, 1)
    placements: list[tuple[int, int]] = [(0, 0)] * len(sequences)
    for r, members in enumerate(rows):
        column = 0
        for t in members:
            tree = trees[t]
            n = len(tree.tokens)
            input_ids[r, column:column + n] = torch.tensor(tree.tokens)
            position_ids[r, column:column + n] = torch.tensor(tree.depths)
            if attention_mask is not None:
                attention_mask[r, 0, column:column + n, column:column + n] = tree.visibility()
            for i, first in tree.starts:
                seq = sequences[i]
                # Next-token position t predicts token t+1: a sequence's completion token j is
                # predicted at its last prompt token's column + j (its own columns from there on).
                start = column + first
                end = start + len(seq.completion_ids)
                placements[i] = (r, start)
                per_token["completion_mask"][r, start:end] = 1 if seq.mask is None else torch.tensor(seq.mask, dtype=torch.float)
                completion_positions[r, start:end] = True
                segments[r, start:end] = i
                for name, values in (("sampler_logprobs", seq.sampler_logprobs), ("advantages", seq.advantages),
                                     ("old_values", seq.values), ("returns", seq.returns)):
                    if values is not None:
                        per_token[name][r, start:end] = torch.tensor(values)
            column += n
        last = position_ids[r, column - 1]
        position_ids[r, column:] = torch.arange(last + 1, last + 1 + width - column)
    return PackedBatch(input_ids, position_ids, completion_positions=completion_positions, segments=segments, placements=placements,
                       sequence_tokens=sum(len(s.prompt_ids) + len(s.completion_ids) for s in sequences),
                       attention_mask=attention_mask, computed_tokens=sum(sizes), **per_token)
