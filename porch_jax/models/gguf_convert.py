"""GGUF files (llama, qwen2, qwen3) into Hugging Face folders: f32 safetensors, config, tokenizer and chat template.

transformers (with the `gguf` package) dequantizes a GGUF file into a PyTorch model; a model loaded so
refuses `save_pretrained` until its quantizer and quantization config are dropped, after which the folder
reloads in plain transformers, in vLLM and in `porch_jax.models.from_pretrained` with the same logits.

    python -m porch_jax.models.gguf_convert --gguf FILE.gguf --out DIR
"""

from __future__ import annotations

import argparse
import math
import mmap
import struct
from pathlib import Path

GGUF_MAGIC = b"GGUF"
ARCHITECTURES = ("llama", "qwen2", "qwen3")
# GGUF metadata value types (gguf.GGUFValueType): the fixed sizes of the scalar ones; 8 is a string, 9 an array.
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 4  # GGML_MAX_DIMS


class GGUFError(ValueError):
    """A GGUF file that cannot be converted; the message names the file and what is wrong with it."""


class _Layout:
    """A walk over a GGUF file's header (counts, metadata, tensor infos) that checks every length against the file's
    size before reading, so a cut or a corrupt count is reported where it is found, never as a numpy or struct error
    (nor as a huge allocation)."""

    def __init__(self, path: Path, data: bytes | mmap.mmap):
        self.path, self.data, self.pos = path, data, 0

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path} is truncated or corrupt: {what}")

    def take(self, n: int, what: str) -> bytes:
        if n > len(self.data) - self.pos:
            need = f"{n} byte{'s' if n != 1 else ''}"
            raise self.fail(f"{what} at byte {self.pos} needs {need}, but the file ends at byte {len(self.data)}")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, what: str):
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        raw = self.take(self.unpack("Q", f"the length of {what}"), what)
        try:
            return raw.decode()
        except UnicodeDecodeError as e:
            raise self.fail(f"{what} at byte {self.pos - len(raw)} is not UTF-8 ({e.reason})") from None

    def count(self, n: int, min_size: int, what: str) -> int:
        """`n` entries of at least `min_size` bytes each, after checking that the rest of the file can hold them."""
        if n * min_size > len(self.data) - self.pos:
            raise self.fail(
                f"it declares {n} {what}, more than the {len(self.data) - self.pos} bytes after byte {self.pos} can hold"
            )
        return n

    def value(self, vtype: int, what: str):
        if vtype in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[vtype], what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            item = self.unpack("I", f"the item type of {what}")
            if item not in _SCALAR_SIZES and item not in (_STRING, _ARRAY):
                raise self.fail(f"{what} is an array of value type {item}, which GGUF does not define")
            n = self.count(self.unpack("Q", f"the length of {what}"), _SCALAR_SIZES.get(item, 8), f"items in {what}")
            if item in _SCALAR_SIZES:  # numbers are not decoded: a token list's scores run to megabytes
                self.take(n * _SCALAR_SIZES[item], what)
                return None
            return [self.value(item, f"item {i} of {what}") for i in range(n)]
        raise self.fail(f"{what} has value type {vtype}, which GGUF does not define")


def read_layout(path: Path) -> tuple[dict[str, object], list[tuple[str, int]]]:
    """The metadata (numbers inside arrays left out) and each tensor's (name, end byte) of GGUF file `path`;
    raises GGUFError naming the file and where its header stops making sense."""
    with path.open("rb") as f:
        if path.stat().st_size == 0:
            return _walk(_Layout(path, b""))
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:  # only the header's pages are read
            return _walk(_Layout(path, data))


def _walk(layout: _Layout) -> tuple[dict[str, object], list[tuple[str, int]]]:
    import gguf

    path = layout.path
    if layout.take(4, "the magic bytes") != GGUF_MAGIC:
        raise GGUFError(f"{path} is not a GGUF file (it does not start with the magic bytes 'GGUF')")
    version = layout.unpack("I", "the GGUF version")
    if version not in (2, 3):
        raise GGUFError(f"{path} has GGUF version {version}; versions 2 and 3 are supported")
    n_tensors = layout.unpack("Q", "the tensor count")
    n_kv = layout.unpack("Q", "the metadata count")
    metadata: dict[str, object] = {}
    for i in range(layout.count(n_kv, 12, "metadata entries")):
        key = layout.string(f"the key of metadata entry {i}")
        what = f"metadata entry {i} ({key!r})"
        metadata[key] = layout.value(layout.unpack("I", f"the value type of {what}"), what)
    infos = []
    for i in range(layout.count(n_tensors, 24, "tensors")):
        name = layout.string(f"the name of tensor {i}")
        what = f"the info of tensor {i} ({name!r})"
        n_dims = layout.unpack("I", what)
        if not 1 <= n_dims <= _MAX_DIMS:
            raise layout.fail(f"tensor {name!r} has {n_dims} dimensions (GGUF allows 1 to {_MAX_DIMS})")
        dims = [layout.unpack("Q", what) for _ in range(n_dims)]
        ggml_type = layout.unpack("I", what)
        if ggml_type not in gguf.GGML_QUANT_SIZES:
            raise layout.fail(f"tensor {name!r} has type {ggml_type}, which ggml does not define")
        offset = layout.unpack("Q", what)
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
        elements = math.prod(dims)
        if elements % block:
            raise layout.fail(f"tensor {name!r} has {elements} elements, not a multiple of its type's block {block}")
        infos.append((name, offset, elements // block * size))
    alignment = metadata.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise layout.fail(f"'general.alignment' is {alignment!r}, not a power of two")
    start = -(-layout.pos // alignment) * alignment
    return metadata, [(name, start + offset + n_bytes) for name, offset, n_bytes in infos]


def check_gguf(path: Path) -> str:
    """The file's architecture, after checking that it is a complete GGUF file of one we convert."""
    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"GGUF file {path} does not exist")
    metadata, tensors = read_layout(path)
    arch = metadata.get("general.architecture")
    if arch is None:
        raise GGUFError(f"{path} has no 'general.architecture' metadata field")
    if arch not in ARCHITECTURES:
        raise GGUFError(f"{path} holds a {arch!r} model; convertible: {', '.join(ARCHITECTURES)}")
    size = path.stat().st_size
    for name, end in tensors:
        if end > size:
            raise GGUFError(f"{path} is truncated: tensor {name!r} ends at byte {end}, the file has {size}")
    import gguf

    try:
        gguf.GGUFReader(str(path))  # what transformers reads the file with
    except Exception as e:  # the reader's errors (struct, mmap, value) name neither file nor field
        raise GGUFError(f"{path} is truncated or corrupt: gguf's reader fails: {type(e).__name__}: {e}") from e
    return arch


def convert(gguf_file: str | Path, out_dir: str | Path) -> Path:
    """Writes the HF folder of `gguf_file` into `out_dir` (f32 weights, tokenizer, chat template)."""
    gguf_file, out_dir = Path(gguf_file), Path(out_dir)
    check_gguf(gguf_file)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

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
