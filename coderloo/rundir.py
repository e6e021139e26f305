"""Run directories that are never clobbered: a directory that holds a run is taken only to resume
it or, when asked, to replace it, and a live run holds a lock that names it. The same holds for
the report `coderloo eval --out` writes.

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
RUN_FILES = ("config.yaml", "metrics.jsonl", "samples.jsonl", "summary.json", "training.png", "report.html", "checkpoints",
             "logs", "tensorboard", "wandb", "mlflow")  # the last three: the trackers of train.loggers (coderloo/loggers.py)


class RunDirError(ValueError):
    """A run directory that cannot be taken; the message says why and what to do."""


class RunLock:
    """The lock of a live run on `path` (see the module's docstring); `what` names what it guards
    in the message another run gets. With `remove`, the lock file goes when it is released (a
    report's, next to the user's files): whoever then takes a lock checks that the file it locked
    is still the one at `path`."""

    def __init__(self, path: Path, what: str, remove: bool = False):
        self.path, self.remove = path, remove
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(self.fd)
                os.close(self.fd)
                raise RunDirError(f"{what} is in use by a live run ({holder})") from None
            try:
                if os.stat(path).st_ino == os.fstat(self.fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(self.fd)  # its holder removed it as we locked it: lock the file there now
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(holder).encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            if self.remove:
                self.path.unlink(missing_ok=True)
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
    try:
        lock = RunLock(directory / LOCK_FILE, str(directory))
    except RunDirError as e:
        raise RunDirError(f"{e}; wait for it to end, or choose another train.output_dir") from None
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


def claim_report(path: Path, overwrite: bool) -> RunLock:
    """Lock the report `path` for a run that writes it at its end (a hidden `.NAME.lock` next to
    it, removed after), refusing, before any work starts, one that exists unless `overwrite`
    and one that another live run is writing."""
    try:
        lock = RunLock(path.with_name(f".{path.name}.lock"), str(path), remove=True)
    except RunDirError as e:
        raise RunDirError(f"{e}; wait for it to end, or choose another --out") from None
    if path.exists() and not overwrite:
        lock.release()
        raise RunDirError(f"{path} exists: --overwrite replaces it, or choose another --out")
    return lock
