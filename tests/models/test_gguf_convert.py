"""GGUF conversion: the real SmolLM2 file's folder loads in our loader; broken files are named with their fault."""

import shutil

import pytest

from porch_jax.models import LlamaForCausalLM, from_pretrained
from porch_jax.models.gguf_convert import GGUFError, check_gguf, main
from porch_jax.models.smollm2 import GGUF_MEMBER, cache_root


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
