"""What the native kernels and the pure-JAX forms in models/deltanet.py read from their inputs alike.

Both the forms a kernel replaces and the kernel itself restart their state where a packed segment begins
(`reset_mask`) and check the rule's head grouping (`value_heads_per_key_head`), so the two agree on the
inputs they refuse. The helpers live here, below both, because models import kernels, never the reverse.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def reset_mask(segment_ids: jax.Array) -> jax.Array:
    """[B, T] float32: 0 where a token starts a new packed segment (the state restarts), else 1."""
    same = segment_ids[:, 1:] == segment_ids[:, :-1]
    return jnp.concatenate([jnp.ones_like(segment_ids[:, :1], jnp.float32), same.astype(jnp.float32)], axis=1)


def value_heads_per_key_head(q: jax.Array, k: jax.Array, v: jax.Array) -> int:
    """Value heads per key head of q, k [B, T, Hk, Dk] and v [B, T, H, Dv], checking the shapes."""
    hk, hv = k.shape[2], v.shape[2]
    if q.shape[:3] != k.shape[:3] or hv % hk:
        raise ValueError(
            f"q {q.shape} and k {k.shape} need the same [B, T, key heads], and the value heads of "
            f"v {v.shape} a multiple of the key heads"
        )
    return hv // hk
