"""A memory limit of an actor's own: the actor moves itself into a memory cgroup of its own with
the limit, so that when it outgrows it the kernel's OOM killer takes that actor (and only it),
instead of whichever process of the node it picks when the node runs out (the raylet, the GCS,
another run's actor). Its OOM-kill count then tells a death for memory from any other.

cgroup v1's memory controller or cgroup v2 (where the cgroup the actor runs in lets it create a
child with `memory` enabled); it needs the right to write there (root, or a delegated subtree).
The cgroup is named after the actor (`coderloo-actor-<actor name>`) and made under the cgroup the actor runs in; an actor that Ray
restarts under the same name goes back into it. The empty ones of actors gone are removed when the
next one is made.
"""
from __future__ import annotations

import os
from pathlib import Path

V2_ROOT = Path("/sys/fs/cgroup")
V1_ROOT = V2_ROOT / "memory"
# Ours alone: the sweep below must never touch another's cgroup (the sandbox's are coderloo-sandbox-*).
PREFIX = "coderloo-actor-"


class MemoryLimitError(RuntimeError):
    """A memory limit that cannot be set here; the message says why."""


def _own_cgroup() -> tuple[Path, str]:
    """The memory cgroup this process runs in, and its version ("1" or "2")."""
    with open("/proc/self/cgroup") as f:
        lines = [line.rstrip("\n").split(":", 2) for line in f]
    for _, controllers, path in lines:
        if "memory" in controllers.split(","):
            return V1_ROOT / path.lstrip("/"), "1"
    for _, controllers, path in lines:
        if controllers == "" and (V2_ROOT / "cgroup.controllers").exists():
            return V2_ROOT / path.lstrip("/"), "2"
    raise MemoryLimitError("no memory cgroup controller is mounted (neither cgroup v1's memory nor cgroup v2)")


def limit_own_memory(name: str, limit_mb: float) -> str:
    """Put this process in the memory cgroup `PREFIX + name` (made under the one it runs in) limited to
    `limit_mb` MiB of memory (and, under v1, of memory plus swap: no swapping past it). Returns the
    cgroup's path, for `oom_kills`."""
    parent, version = _own_cgroup()
    if parent.name.startswith(PREFIX):  # a restarted actor's process can start inside its cgroup already
        parent = parent.parent
    cgroup = parent / f"{PREFIX}{name}"
    limit = str(int(limit_mb * 2**20))
    for left in parent.glob(f"{PREFIX}*"):  # those of actors gone (a cgroup in use cannot be removed)
        if left != cgroup:
            remove_cgroup(str(left))
    try:
        cgroup.mkdir(exist_ok=True)
        if version == "1":
            # memsw bounds memory + swap; it must stay >= the memory limit while either moves
            memsw = cgroup / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                memsw.write_text("-1")
            (cgroup / "memory.limit_in_bytes").write_text(limit)
            if memsw.exists():
                memsw.write_text(limit)
        else:
            (cgroup / "memory.max").write_text(limit)
            if (cgroup / "memory.swap.max").exists():
                (cgroup / "memory.swap.max").write_text("0")
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as e:
        raise MemoryLimitError(f"a memory limit of {limit_mb:g} MiB needs a memory cgroup under {parent} that this "
                               f"process may create and join (root, or a delegated cgroup): {e}") from None
    return str(cgroup)


def oom_kills(cgroup: str) -> int:
    """How many processes the kernel killed for memory in `cgroup` (a path `limit_own_memory` gave)."""
    path = Path(cgroup)
    for name in ("memory.events", "memory.oom_control"):  # v2; v1 (kernel 4.13 and later)
        try:
            for line in (path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except OSError:
            continue
    return 0


def remove_cgroup(cgroup: str) -> None:
    """Remove an actor's cgroup once nothing is in it (its actor was killed); one still in use stays."""
    try:
        os.rmdir(cgroup)
    except OSError:
        pass


def return_free_memory() -> bool:
    """Give the heap's free pages back to the kernel (glibc's malloc_trim): memory a step freed,
    its transients (activations, the optimizer's temporaries), otherwise stays resident in the
    process until it is reused. False where the C library has no malloc_trim."""
    import ctypes

    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    return bool(trim(0)) if trim is not None else False
