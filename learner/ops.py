"""DeepSpeed's CPU collectives op (its shared-memory all-reduce), compiled once per machine.

DeepSpeed compiles the op on first use into torch's extensions directory, under its name alone,
and the ninja file there names the paths of the virtualenv it came from: every new virtualenv
(each fresh clone, each CI run) compiled it again, minutes on 2 cores. Here the library is kept
under a digest of what goes into it (its sources and headers, the compiler flags, Python's,
torch's and DeepSpeed's versions) and handed to DeepSpeed before DeepSpeed looks for it.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "coderloo" / "deepspeed-ops"


def shm_comm_builder():
    """DeepSpeed's builder of the op for this machine's accelerator, or None where it has none
    (DeepSpeed then uses gloo's collectives, as it would by itself)."""
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    return builder if builder is not None and builder.is_compatible(False) else None


def library_path(builder) -> Path:
    """Where the op `builder` compiles is kept: named by the content of what goes into it, not by
    where the files are, so that every virtualenv with the same versions finds the same library."""
    import deepspeed
    import torch

    digest = hashlib.sha256()
    for part in (sys.version, torch.__version__, deepspeed.__version__, *builder.cxx_args(), *builder.extra_ldflags()):
        digest.update(part.encode() + b"\0")
    folders = {Path(builder.deepspeed_src_path(p)).parent for p in builder.sources()}
    folders |= {Path(builder.deepspeed_src_path(p)) for p in builder.include_paths()}
    for folder in sorted(folders):
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return CACHE / f"{builder.NAME}-{digest.hexdigest()[:16]}" / f"{builder.NAME}.so"


def load_shm_comm_op() -> None:
    """Give DeepSpeed the op from the cache, compiling it into the cache first when it is not
    there (one process compiles; another rank of the machine waits for it)."""
    builder = shm_comm_builder()
    if builder is None:
        return
    from deepspeed.ops.op_builder.builder import OpBuilder

    library = library_path(builder)
    if not library.exists():
        library.parent.mkdir(parents=True, exist_ok=True)
        with open(library.parent / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not library.exists():
                _compile(builder, library)
                return  # DeepSpeed's own build loaded it and keeps it (OpBuilder._loaded_ops)
    spec = importlib.util.spec_from_file_location(builder.NAME, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    OpBuilder._loaded_ops[builder.NAME] = module  # where DeepSpeed's own load() looks first


def _compile(builder, library: Path) -> None:
    before = os.environ.get("TORCH_EXTENSIONS_DIR")
    with tempfile.TemporaryDirectory(dir=library.parent) as build:
        os.environ["TORCH_EXTENSIONS_DIR"] = build
        try:
            builder.jit_load(verbose=False)
        finally:
            if before is None:
                os.environ.pop("TORCH_EXTENSIONS_DIR")
            else:
                os.environ["TORCH_EXTENSIONS_DIR"] = before
        partial = library.with_suffix(".partial")
        shutil.copy2(Path(build) / builder.NAME / library.name, partial)
        os.replace(partial, library)  # whole or absent: a build killed half-way is compiled again
