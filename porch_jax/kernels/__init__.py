"""Native CPU kernels (C++ XLA FFI custom calls), built on first use; see native.py.

$PORCH_JAX_CPU_KERNELS chooses where they run: auto (default: on a CPU backend, where the kernel
builds and takes the shapes), off (the pure-JAX forms everywhere, as on GPU and TPU), on (required:
an error where one cannot run). It is read when a function is traced.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import jax

CHOICES = ("auto", "off", "on")


def use_native(available: Callable[[], bool], supported: bool = True) -> bool:
    """Whether a model should call a native kernel here. `available` (a callable: it may build the
    kernel) is asked only when the answer depends on it; `supported`: the kernel takes these shapes."""
    choice = os.environ.get("PORCH_JAX_CPU_KERNELS", "auto")
    if choice not in CHOICES:
        raise ValueError(f"PORCH_JAX_CPU_KERNELS={choice!r}: expected one of {', '.join(CHOICES)}")
    if choice == "off":
        return False
    if choice == "on":
        if not supported:
            raise ValueError(
                "PORCH_JAX_CPU_KERNELS=on, but a native kernel does not take these shapes (see its docstring)"
            )
        return True
    return jax.default_backend() == "cpu" and supported and available()
