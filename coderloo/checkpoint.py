"""Checkpoints that a crash cannot corrupt: written under a temporary name, renamed when whole,
and only then named in `latest`.

A checkpoint directory holds the policy in Hugging Face format at its root (so `coderloo eval
--model` and vLLM load it), DeepSpeed's state (optimizer, ZeRO partitions) under `deepspeed/`,
and the controller's state (step, policy version, data cursor, random generator state, the
evaluations so far) in `trainer_state.json`, written last.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

STATE_FILE = "trainer_state.json"


def atomic_write(path: Path, text: str) -> None:
    """`path` holds `text` whole, or what it held before (never a part: a crash or a full disk)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


class CheckpointError(RuntimeError):
    """A checkpoint that could not be written (its partial files are gone, `latest` is as it was)."""


def write_checkpoint(root: str | Path, name: str, write_model: Callable[[Path], None], state: dict) -> Path:
    """Write checkpoint `name` under `root` and make it the latest.

    `write_model(directory)` writes the weights and optimizer state. Until the final rename, the
    checkpoint lives in `.name.partial`; a crash at any point leaves `latest` naming the previous
    whole checkpoint. A write that fails (a full disk, most often) removes the partial files and
    raises CheckpointError, which says how much space is left and what `latest` names.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    partial = root / f".{name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        partial.mkdir()
        write_model(partial)
        atomic_write(partial / STATE_FILE, json.dumps(state))
    except Exception as e:
        shutil.rmtree(partial, ignore_errors=True)
        free_mb = shutil.disk_usage(root).free / 2**20
        what = "the disk is full" if _disk_full(e) else f"{type(e).__name__}: {e}"
        kept = (root / "latest").read_text().strip() if (root / "latest").exists() else None
        raise CheckpointError(
            f"checkpoint {name} could not be written to {root}: {what} ({free_mb:.1f} MiB free there after removing its "
            f"partial files). " + (f"`latest` still names {kept}, whole: free space, then `coderloo train --resume` "
                                   "continues from it." if kept else "There is no earlier checkpoint.")) from e
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    os.rename(partial, final)
    atomic_write(root / "latest", name)
    return final


def prune_checkpoints(root: str | Path, keep: int) -> list[str]:
    """Remove all but the `keep` newest whole checkpoints (by step) under `root`; the one `latest`
    names and the one `final` links to always stay. Returns the names removed."""
    root = Path(root)
    protected = {(root / "latest").read_text().strip()} if (root / "latest").exists() else set()
    if (root / "final").is_symlink():
        protected.add(os.readlink(root / "final"))
    whole = sorted((p for p in root.glob("step_*") if p.is_dir() and (p / STATE_FILE).exists()),
                   key=lambda p: read_state(p)["step"])
    removed = [p.name for p in whole[:-keep] if p.name not in protected] if keep else []
    for name in removed:
        shutil.rmtree(root / name)
    return removed


def _disk_full(error: BaseException) -> bool:
    """Whether `error` (or what caused it, through Ray's task errors) is a write refused for lack of
    space: ENOSPC, or the words for it where a library turned it into its own error (safetensors'
    `StorageFull`, torch.save's failed write on a full disk)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(words in str(error) for words in ("No space left on device", "StorageFull", "Disk quota exceeded")):
            return True
        error = getattr(error, "cause", None) or error.__cause__ or error.__context__
    return False


def latest_checkpoint(root: str | Path) -> Path | None:
    """The directory `latest` names, or None when there is none yet."""
    marker = Path(root) / "latest"
    if not marker.exists():
        return None
    path = Path(root) / marker.read_text().strip()
    if not (path / STATE_FILE).exists():
        raise FileNotFoundError(f"{marker} names {path}, which has no {STATE_FILE}")
    return path


def read_state(checkpoint: str | Path) -> dict:
    return json.loads((Path(checkpoint) / STATE_FILE).read_text())
