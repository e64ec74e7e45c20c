"""GGUF files (llama, qwen2, qwen3) into Hugging Face folders: f32 safetensors, config, tokenizer and chat template.

transformers (with the `gguf` package) dequantizes a GGUF file into a PyTorch model; a model loaded so
refuses `save_pretrained` until its quantizer and quantization config are dropped, after which the folder
reloads in plain transformers, in vLLM and in `porch_jax.models.from_pretrained` with the same logits.

    python -m porch_jax.models.gguf_convert --gguf FILE.gguf --out DIR
"""

from __future__ import annotations

import argparse
import struct
from pathlib import Path

GGUF_MAGIC = b"GGUF"
ARCHITECTURES = ("llama", "qwen2", "qwen3")


class GGUFError(ValueError):
    """A GGUF file that cannot be converted; the message names the file and what is wrong with it."""


def check_gguf(path: Path) -> str:
    """The file's architecture, after checking that it is a complete GGUF file of one we convert."""
    if not path.is_file():
        raise GGUFError(f"GGUF file {path} does not exist")
    with path.open("rb") as f:
        head = f.read(8)
    if len(head) < 8 or head[:4] != GGUF_MAGIC:
        raise GGUFError(f"{path} is not a GGUF file (it does not start with the magic bytes 'GGUF')")
    version = struct.unpack("<I", head[4:8])[0]
    if version not in (2, 3):
        raise GGUFError(f"{path} has GGUF version {version}; versions 2 and 3 are supported")
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # the reader's errors (struct, mmap, value) name neither file nor field
        raise GGUFError(f"{path} is truncated or corrupt: {type(e).__name__}: {e}") from e
    field = reader.get_field("general.architecture")
    if field is None:
        raise GGUFError(f"{path} has no 'general.architecture' metadata field")
    arch = bytes(field.parts[field.data[0]]).decode()
    if arch not in ARCHITECTURES:
        raise GGUFError(f"{path} holds a {arch!r} model; convertible: {', '.join(ARCHITECTURES)}")
    size = path.stat().st_size
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size:
            raise GGUFError(f"{path} is truncated: tensor {tensor.name!r} ends at byte {end}, the file has {size}")
    return arch


def convert(gguf_file: str | Path, out_dir: str | Path) -> Path:
    """Writes the HF folder of `gguf_file` into `out_dir` (f32 weights, tokenizer, chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file, out_dir = Path(gguf_file), Path(out_dir)
    check_gguf(gguf_file)
    folder, name = str(gguf_file.parent), gguf_file.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except Exception as e:
        raise GGUFError(f"transformers cannot read {gguf_file}: {type(e).__name__}: {e}") from e
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", required=True, help="the .gguf file")
    parser.add_argument("--out", required=True, help="the folder to write")
    args = parser.parse_args(argv)
    try:
        print(convert(args.gguf, args.out))
    except GGUFError as e:
        raise SystemExit(f"error: {e}") from e


if __name__ == "__main__":
    main()
