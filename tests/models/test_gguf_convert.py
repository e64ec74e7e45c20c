"""GGUF conversion: the real SmolLM2 file's folder loads in our loader; broken files (cut anywhere, garbage, a
corrupt field) are named with their fault."""

import shutil
import struct

import numpy as np
import pytest

from porch_jax.models import LlamaForCausalLM, from_pretrained
from porch_jax.models.gguf_convert import GGUFError, check_gguf, convert, main
from porch_jax.models.smollm2 import GGUF_MEMBER, cache_root


def write_tiny_gguf(path):
    """A complete little llama GGUF file (metadata, a token list, two f32 tensors), written as the real ones are."""
    gguf = pytest.importorskip("gguf", reason="the `gguf` package is in the test extra")
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b", "c", "d"])
    w.add_token_scores([0.0, -1.0, -2.0, -3.0])
    w.add_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}")
    w.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    w.add_tensor("output_norm.weight", np.ones(8, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def smollm2_gguf(smollm2_dir):
    return cache_root() / "gguf" / GGUF_MEMBER.rsplit("/", 1)[-1]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_smollm2_folder_has_tokenizer_template_and_loads(smollm2_dir, smollm2_gguf):
    assert check_gguf(smollm2_gguf) == "llama"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"):
        assert (smollm2_dir / name).is_file(), name
    assert "<|im_start|>" in (smollm2_dir / "chat_template.jinja").read_text()
    assert type(from_pretrained(smollm2_dir)) is LlamaForCausalLM


def test_missing_and_non_gguf_files_are_named(tmp_path):
    with pytest.raises(GGUFError, match=r"nothing\.gguf does not exist"):
        check_gguf(tmp_path / "nothing.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"PK\x03\x04 not a gguf file at all")
    with pytest.raises(GGUFError, match=r"bad\.gguf is not a GGUF file"):
        check_gguf(bad)
    with pytest.raises(SystemExit, match=r"error: .*bad\.gguf is not a GGUF file"):
        main(["--gguf", str(bad), "--out", str(tmp_path / "out")])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_truncated_and_corrupt_gguf_files_are_named(tmp_path, smollm2_gguf):
    data = smollm2_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])  # metadata intact, tensor data missing
    with pytest.raises(GGUFError, match=r"cut\.gguf is truncated"):
        check_gguf(cut)
    header = tmp_path / "header.gguf"
    header.write_bytes(data[:4096])  # cut inside the metadata
    with pytest.raises(GGUFError, match=r"header\.gguf is truncated or corrupt"):
        check_gguf(header)
    wrong = tmp_path / "version.gguf"
    shutil.copyfile(smollm2_gguf, wrong)
    with wrong.open("r+b") as f:
        f.seek(4)
        f.write((99).to_bytes(4, "little"))
    with pytest.raises(GGUFError, match=r"version\.gguf has GGUF version 99"):
        check_gguf(wrong)


def test_a_tiny_gguf_file_cut_anywhere_is_named_as_truncated(tmp_path):
    """Every cut of a complete file (inside the counts, a key, a value, a token list, the tensor infos, the tensor
    data) is a GGUFError naming the file and saying it is truncated, never a numpy or struct error."""
    data = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    assert check_gguf(tmp_path / "tiny.gguf") == "llama"
    messages = []
    for cut in range(len(data)):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(GGUFError) as info:
            check_gguf(path)
        message = str(info.value)
        assert message.startswith(f"{path} is ") and "truncated" in message, (cut, message)
        messages.append(message)
        path.unlink()
    wheres = ("the tensor count", "the key of metadata entry 2", "item 3 of metadata entry 6 ('tokenizer.ggml.tokens')")
    for where in (*wheres, "it declares 2 tensors", "the name of tensor 1", "tensor 'token_embd.weight' ends at"):
        assert any(where in m for m in messages), where
    data_cut = tmp_path / "data.gguf"
    data_cut.write_bytes(data[:-1])
    with pytest.raises(GGUFError, match=r"data\.gguf is truncated: tensor 'output_norm\.weight' ends at byte"):
        check_gguf(data_cut)


def _entry_offset(data: bytes, key: str) -> int:
    """The byte after `key`'s name in the metadata: where its value type is."""
    name = key.encode()
    return data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)


def test_garbage_and_corrupt_fields_are_named(tmp_path):
    data = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    cases = {
        "garbage": b"GGUF" + struct.pack("<I", 3) + np.random.default_rng(0).bytes(500),
        "count": data[:16] + struct.pack("<Q", 2**62) + data[24:],
        "vtype": bytearray(data),
        "ttype": bytearray(data),
        "utf8": bytearray(data),
    }
    at = _entry_offset(data, "general.name")
    cases["vtype"][at : at + 4] = struct.pack("<I", 77)
    at = data.index(b"output_norm.weight") + len(b"output_norm.weight") + 4 + 8  # past n_dims and its one dim
    cases["ttype"][at : at + 4] = struct.pack("<I", 999)
    at = data.index(b"general.name")
    cases["utf8"][at] = 0xFF
    expected = {
        "garbage": r"is truncated or corrupt: it declares \d+ metadata entries, more than the 484 bytes after byte 24",
        "count": r"is truncated or corrupt: it declares 4611686018427387904 metadata entries",
        "vtype": r"is truncated or corrupt: metadata entry \d \('general.name'\) has value type 77, which GGUF does",
        "ttype": r"is truncated or corrupt: tensor 'output_norm.weight' has type 999, which ggml does not define",
        "utf8": r"is truncated or corrupt: the key of metadata entry \d at byte \d+ is not UTF-8",
    }
    for name, content in cases.items():
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(bytes(content))
        with pytest.raises(GGUFError, match=rf"^{path} " + expected[name]):
            check_gguf(path)


def test_convert_names_the_broken_file_before_and_inside_transformers(tmp_path):
    """convert checks the file first (a cut one never reaches transformers); a complete file transformers cannot
    turn into a model (here: 8 hidden units, the default 32 heads) is named with transformers' reason."""
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[:300])
    with pytest.raises(GGUFError, match=r"cut\.gguf is truncated or corrupt"):
        convert(cut, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit, match=r"error: .*cut\.gguf is truncated or corrupt"):
        main(["--gguf", str(cut), "--out", str(tmp_path / "out")])
    pytest.importorskip("torch", reason="the conversion runs in transformers + torch (test extra)")
    with pytest.raises(GGUFError, match=r"(?s)transformers cannot read .*tiny\.gguf: .*hidden size"):
        convert(tiny, tmp_path / "out")
