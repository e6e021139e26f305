"""Checkpoints that a crash cannot corrupt: written under a temporary name, renamed when whole,
and only then named in `latest`.

A checkpoint directory holds the policy in Hugging Face format at its root (so `coderloo eval
--model` and vLLM load it), DeepSpeed's state (optimizer, ZeRO partitions) under `deepspeed/`,
and the controller's state (step, policy version, data cursor, random generator state, the
evaluations so far) in `trainer_state.json`, written last.
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

STATE_FILE = "trainer_state.json"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_checkpoint(root: str | Path, name: str, write_model: Callable[[Path], None], state: dict) -> Path:
    """Write checkpoint `name` under `root` and make it the latest.

    `write_model(directory)` writes the weights and optimizer state. Until the final rename, the
    checkpoint lives in `.name.partial`; a crash at any point leaves `latest` naming the previous
    whole checkpoint.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    partial = root / f".{name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    write_model(partial)
    _atomic_write(partial / STATE_FILE, json.dumps(state))
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    os.rename(partial, final)
    _atomic_write(root / "latest", name)
    return final


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
