"""Splitting a step's sequences among learner ranks and into micro-batches by a token budget.

A micro-batch is a tensor of rows x width, its width the longest sequence's. Packed (the
default, learner.pack_sequences), each row holds sequences end to end, first fit in decreasing
length, and the model keeps them apart by their position ids (learner/batch.py); padded, each
sequence has a row. Packing by that cost, rather than by a fixed count, keeps memory bounded when
completions are long and avoids many tiny forward passes when they are short. Every rank must run
the same number of forward/backward passes per optimizer step (ZeRO reduces gradients at each
backward), so the number of micro-batches of a mini-batch is made a multiple of the world size,
and the micro-batches are dealt to ranks to balance their tokens.
"""
from __future__ import annotations


def row_width(lengths: list[int], indices: list[int], row_tokens: int = 0) -> int:
    """A micro-batch's width: its longest sequence, or `row_tokens` when wider (learner.pack_row_tokens)."""
    return max(max((lengths[i] for i in indices), default=0), row_tokens)


def rows_of(lengths: list[int], indices: list[int], packed: bool = True, row_tokens: int = 0) -> list[list[int]]:
    """`indices` placed in rows of `row_width`: end to end, first fit in decreasing length (ties in
    `indices`' order), or one a row when not `packed`."""
    if not packed:
        return [[i] for i in indices]
    width = row_width(lengths, indices, row_tokens)
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(indices, key=lambda i: -lengths[i]):
        row = next((r for r, free in enumerate(room) if lengths[i] <= free), None)
        if row is None:
            rows.append([])
            room.append(width)
            row = len(rows) - 1
        rows[row].append(i)
        room[row] -= lengths[i]
    return rows


def cost(lengths: list[int], indices: list[int], packed: bool = True, row_tokens: int = 0) -> int:
    """Tokens of the micro-batch's tensor, padding included: rows x their width."""
    width = row_width(lengths, indices, row_tokens if packed else 0)
    return len(rows_of(lengths, indices, packed, row_tokens)) * width


def pack_by_tokens(lengths: list[int], max_tokens: int, packed: bool = True, row_tokens: int = 0) -> list[list[int]]:
    """Indices grouped into micro-batches whose cost is at most `max_tokens`.

    First fit over lengths in decreasing order; a sequence longer than the budget goes alone. Each
    micro-batch's rows are placed as it fills, as `rows_of` places them (the same order: its width
    is its first sequence's), so its cost is known without placing it again.
    """
    bins: list[list[int]] = []
    rooms: list[list[int]] = []  # per micro-batch, the tokens left in each of its rows
    widths: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for b, room, width in zip(bins, rooms, widths):
            row = next((r for r, free in enumerate(room) if lengths[i] <= free), None) if packed else None
            if row is not None:
                room[row] -= lengths[i]
            elif (len(room) + 1) * width <= max_tokens:
                room.append(width - lengths[i])
            else:
                continue
            b.append(i)
            break
        else:
            bins.append([i])
            widths.append(max(lengths[i], row_tokens if packed else 0))
            rooms.append([widths[-1] - lengths[i]])
    return bins


def _split_largest(bins: list[list[int]]) -> None:
    largest = max(range(len(bins)), key=lambda j: len(bins[j]))
    b = bins[largest]
    if len(b) < 2:
        raise ValueError("cannot split micro-batches further: fewer sequences than ranks")
    bins[largest:largest + 1] = [b[: len(b) // 2], b[len(b) // 2 :]]


def deal_to_ranks(lengths: list[int], max_tokens: int, world_size: int, packed: bool = True,
                  row_tokens: int = 0) -> list[list[list[int]]]:
    """Micro-batches of one mini-batch for each rank: the same count on every rank, tokens balanced."""
    if len(lengths) < world_size:
        raise ValueError(f"{len(lengths)} sequences cannot be shared among {world_size} learner ranks")
    bins = pack_by_tokens(lengths, max_tokens, packed, row_tokens)
    while len(bins) % world_size:
        _split_largest(bins)
    per_rank = len(bins) // world_size
    ranks: list[list[list[int]]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for b in sorted(bins, key=lambda b: -cost(lengths, b, packed, row_tokens)):
        r = min((r for r in range(world_size) if len(ranks[r]) < per_rank), key=lambda r: load[r])
        ranks[r].append(sorted(b))
        load[r] += cost(lengths, b, packed, row_tokens)
    return ranks


def split_even(items: list, count: int) -> list[list]:
    """`count` near-equal consecutive chunks (the mini-batches of one RL step)."""
    if not 1 <= count <= len(items):
        raise ValueError(f"cannot split {len(items)} items into {count} parts")
    size, extra = divmod(len(items), count)
    chunks, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        chunks.append(items[start:end])
        start = end
    return chunks
