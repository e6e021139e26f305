"""Splitting a step's sequences among learner ranks and into micro-batches by a token budget.

A micro-batch is padded to its longest sequence, so its cost is rows x longest length. Packing by
that cost, rather than by a fixed count, keeps memory bounded when completions are long and
avoids many tiny forward passes when they are short. Every rank must run the same number of
forward/backward passes per optimizer step (ZeRO reduces gradients at each backward), so the
number of micro-batches of a mini-batch is made a multiple of the world size, and the
micro-batches are dealt to ranks to balance their tokens.
"""
from __future__ import annotations


def padded_cost(lengths: list[int], indices: list[int]) -> int:
    return len(indices) * max((lengths[i] for i in indices), default=0)


def pack_by_tokens(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices grouped into micro-batches whose padded cost is at most `max_tokens`.

    First fit over lengths in decreasing order; a sequence longer than the budget goes alone.
    """
    bins: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for b in bins:
            # Sorted decreasing: the bin's first sequence is its longest.
            if (len(b) + 1) * lengths[b[0]] <= max_tokens:
                b.append(i)
                break
        else:
            bins.append([i])
    return bins


def _split_largest(bins: list[list[int]]) -> None:
    largest = max(range(len(bins)), key=lambda j: len(bins[j]))
    b = bins[largest]
    if len(b) < 2:
        raise ValueError("cannot split micro-batches further: fewer sequences than ranks")
    bins[largest:largest + 1] = [b[: len(b) // 2], b[len(b) // 2 :]]


def deal_to_ranks(lengths: list[int], max_tokens: int, world_size: int) -> list[list[list[int]]]:
    """Micro-batches of one mini-batch for each rank: the same count on every rank, tokens balanced."""
    if len(lengths) < world_size:
        raise ValueError(f"{len(lengths)} sequences cannot be shared among {world_size} learner ranks")
    bins = pack_by_tokens(lengths, max_tokens)
    while len(bins) % world_size:
        _split_largest(bins)
    per_rank = len(bins) // world_size
    ranks: list[list[list[int]]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for b in sorted(bins, key=lambda b: -padded_cost(lengths, b)):
        r = min((r for r in range(world_size) if len(ranks[r]) < per_rank), key=lambda r: load[r])
        ranks[r].append(sorted(b))
        load[r] += padded_cost(lengths, b)
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
