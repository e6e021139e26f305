"""CPU sets for the roles (rollout workers, learner ranks, reward replicas, sandbox executors, the
driver), so that one machine can stand in for the separate devices each role has on a cluster.

A set is written as Linux's cpuset lists are: "1", "0-3", "0,2-3". A role pins every thread of its
process to it; what the process starts afterwards (torch's and OpenMP's threads, the sandbox's fork
server and every run it forks) inherits the set. It is an affinity, not a cgroup cpuset: it places
work, and a sandboxed program could widen its own (the cgroup's CPU share still bounds it).
"""
from __future__ import annotations

import os
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator


def parse_cpus(text: str) -> list[int]:
    """The sorted CPU ids of a cpuset list ("0", "0-3", "0,2-3"); ValueError naming the bad part."""
    cpus: set[int] = set()
    for part in str(text).split(","):
        low, dash, high = part.strip().partition("-")
        try:
            first, last = int(low), int(high) if dash else int(low)
        except ValueError:
            raise ValueError(f"{part.strip()!r} in {text!r} is not a CPU id or a range a-b of them") from None
        if first < 0 or last < first:
            raise ValueError(f"{part.strip()!r} in {text!r}: a range a-b needs 0 <= a <= b")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def _valid(text: str | None) -> str | None:
    if text is not None:
        parse_cpus(text)
    return text


# A config field's type: None (no pinning) or a cpuset list, checked when the config is read (a
# single CPU may come as a number: YAML reads `cpus: 1` so).
CpuSet = Annotated[str | None, BeforeValidator(lambda v: str(v) if isinstance(v, int) and not isinstance(v, bool) else v),
                   AfterValidator(_valid)]


def cpu_set_problem(text: str | None, field: str, available: set[int] | None = None) -> str | None:
    """What is wrong with the CPU set `text` of the config field `field` here, or None: a CPU this
    process may not run on (`available`, by default its own affinity: the node's CPUs unless
    something pinned it)."""
    if text is None:
        return None
    have = os.sched_getaffinity(0) if available is None else available
    missing = [c for c in parse_cpus(text) if c not in have]
    if not missing:
        return None
    return f"{field} {text!r}: CPU {', '.join(map(str, missing))} not on this node (its CPUs: {','.join(map(str, sorted(have)))})"


def pin_process(text: str | None, field: str) -> None:
    """Pin every thread of this process to the CPU set `text` (the config field `field`; None:
    leave it). Raises ValueError naming the field when the node lacks one of its CPUs."""
    if text is None:
        return
    problem = cpu_set_problem(text, field)
    if problem:
        raise ValueError(problem)
    pin_threads(set(parse_cpus(text)))


def pin_threads(cpus: set[int]) -> None:
    """Every thread of this process onto `cpus` (one thread's affinity is its own: the threads
    already started would keep theirs)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass


def computes_bf16() -> bool:
    """Whether this machine's CPU multiplies bf16 matrices in hardware (AVX-512 BF16 or AMX). On one
    without, torch and vLLM emulate bf16, slower than float32: 7x for torch's matrix products on an
    AMD EPYC with AVX2 (bench/results.md, real_models)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def precision(dtype: str, on_gpu: bool) -> str:
    """A config's `dtype`, "auto" resolved: bfloat16 on GPUs and on a CPU that computes it, else float32."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if on_gpu or computes_bf16() else "float32"
