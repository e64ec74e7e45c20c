"""Builds and loads the project's C++ XLA FFI kernels (CPU only) on first use.

A kernel is compiled once per machine with the system C++ compiler against the jaxlib headers
(`jax.ffi.include_dir()`), cached under $PORCH_JAX_KERNEL_CACHE (default ~/.cache/porch_jax/kernels)
by a hash of source, headers, jaxlib version, flags and the CPU's features, and registered with XLA.
Nothing is downloaded. Each use refreshes its library's mtime; a build deletes the kernel's other libraries
(older sources or jaxlibs, other CPUs of a shared home) unused for STALE_DAYS, and abandoned partial builds.
Where no compiler is found or the build fails, `load` returns None and says why once (a warning):
callers fall back to their pure-JAX form, which is also what runs on GPU and TPU.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import jax
import jaxlib

_SOURCES = Path(__file__).parent
STALE_DAYS = 30.0
FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno", "-std=c++17", "-shared", "-fPIC", "-pthread")


def cpu_signature() -> bytes:
    """What -march=native compiles for: a library built on one CPU may not run on another that shares
    the cache folder (an NFS home), so the CPU's feature flags are part of the cache key."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.encode()
    except OSError:
        pass
    return (platform.machine() + platform.processor()).encode()


def cache_dir() -> Path:
    return Path(os.environ.get("PORCH_JAX_KERNEL_CACHE", Path.home() / ".cache" / "porch_jax" / "kernels"))


def build(source: str) -> Path:
    """Compiles `source` (a file next to this module) into a shared library; returns its path.
    Raises RuntimeError with the compiler's message when it cannot."""
    compiler = shutil.which(os.environ.get("CXX") or "g++") or shutil.which("c++") or shutil.which("clang++")
    if compiler is None:
        raise RuntimeError(f"no C++ compiler found (CXX={os.environ.get('CXX')!r}, no g++, c++ or clang++ on PATH)")
    path = _SOURCES / source
    headers = b"".join(h.read_bytes() for h in sorted(_SOURCES.glob("*.h")))  # what the sources include
    key = hashlib.sha256(
        path.read_bytes() + headers + jaxlib.__version__.encode() + " ".join(FLAGS).encode() + cpu_signature()
    )
    key = key.hexdigest()[:16]
    target = cache_dir() / f"{path.stem}-{key}.so"
    if target.exists():
        os.utime(target)  # in use: `prune` keeps it
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Built beside the target and renamed into place: concurrent processes never load a partial file.
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".so", delete=False) as tmp:
        partial = Path(tmp.name)
    command = [compiler, *FLAGS, "-isystem", jax.ffi.include_dir(), str(path), "-o", str(partial)]
    logging.info("porch_jax: building the native kernel %s (once per machine): %s", path.name, " ".join(command))
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"compiling {path.name} failed ({' '.join(command)}):\n{result.stderr[-4000:]}")
    os.replace(partial, target)
    prune(path.stem, target)
    return target


def prune(stem: str, keep: Path, max_age_days: float = STALE_DAYS) -> list[Path]:
    """Deletes the cached libraries of kernel `stem` other than `keep` that no process has used for
    `max_age_days` (a library in use on another CPU sharing the folder is refreshed by each use, so it stays),
    and partial builds a crashed compile left (tmp*.so) older than a day. Returns what it deleted."""
    now, removed = time.time(), []
    candidates = [(p, max_age_days) for p in keep.parent.glob(f"{stem}-*.so") if p != keep]
    candidates += [(p, 1.0) for p in keep.parent.glob("tmp*.so")]
    for lib, days in candidates:
        try:
            if now - lib.stat().st_mtime > days * 86400:
                lib.unlink()
                removed.append(lib)
        except OSError:  # another process pruned or replaced it first
            continue
    if removed:
        logging.info("porch_jax: removed %d stale kernel libraries from %s", len(removed), keep.parent)
    return removed


@functools.cache
def load(source: str, symbols: tuple[str, ...]) -> ctypes.CDLL | None:
    """Builds `source` and registers each symbol as the CPU FFI target of the same name; None
    (with one warning saying why) where it cannot be built."""
    try:
        library = ctypes.cdll.LoadLibrary(str(build(source)))
    except (RuntimeError, OSError) as err:
        logging.warning("porch_jax: native kernel %s unavailable, using the pure-JAX form: %s", source, err)
        return None
    for symbol in symbols:
        jax.ffi.register_ffi_target(symbol, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
    return library
