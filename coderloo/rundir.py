"""Run directories that are never clobbered: a directory that holds a run is taken only to resume
it or, when asked, to replace it, and a live run holds a lock that names it.

The lock is an exclusive `flock` on `run.lock`, held as long as the run's process lives (the
kernel releases it when the process ends, however it ends: a killed run leaves no stale lock).
The file says who holds it, for the message another run gets.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
from pathlib import Path

LOCK_FILE = "run.lock"
# What a run writes at the top of its directory: any of them there means the directory holds a run.
RUN_FILES = ("config.yaml", "metrics.jsonl", "samples.jsonl", "summary.json", "training.png", "checkpoints")


class RunDirError(ValueError):
    """A run directory that cannot be taken; the message says why and what to do."""


class RunLock:
    """The lock of a live run on its directory (see the module's docstring)."""

    def __init__(self, directory: Path):
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(self.fd)
            os.close(self.fd)
            raise RunDirError(f"{directory} is in use by a live run ({holder}); wait for it to end, or choose "
                              "another train.output_dir") from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(holder).encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the lock
            self.fd = None


def _read_holder(fd: int) -> str:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {holder['pid']} on {holder['host']}, started {holder['started']}"
    except (ValueError, KeyError):
        return "its lock holder did not say who it is"


def holds_run(directory: Path) -> bool:
    return any((directory / name).exists() for name in RUN_FILES)


def claim(directory: Path, resume: bool, overwrite: bool) -> RunLock:
    """Lock `directory` for a run. One that holds a run is taken only with `resume` (the caller
    continues it) or `overwrite` (its run's files are removed first); a live run's is never taken."""
    if resume and overwrite:
        raise RunDirError("--resume continues the run in train.output_dir and --overwrite replaces it: give one of them")
    lock = RunLock(directory)
    if holds_run(directory) and not (resume or overwrite):
        lock.release()
        raise RunDirError(f"{directory} holds a run already: --resume continues it, --overwrite replaces it, "
                          "or choose another train.output_dir")
    if overwrite:
        for name in RUN_FILES:
            path = directory / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
    return lock


def check_new_file(path: Path, overwrite: bool) -> None:
    """Refuse to replace an existing file (a report) unless `overwrite`, before any work starts."""
    if path.exists() and not overwrite:
        raise RunDirError(f"{path} exists: --overwrite replaces it, or choose another --out")
