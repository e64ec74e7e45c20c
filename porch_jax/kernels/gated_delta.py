"""The gated delta rule as the native CPU kernel (gated_delta_cpu.cc), with its gradient.

Same arguments and results as `porch_jax.models.deltanet.chunk_gated_delta_rule`; float32. The
forward writes the state every `CHECKPOINT` tokens, and the backward recomputes the states of one
chunk at a time from them, so its memory is that of the chunked form.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from porch_jax.kernels import native
from porch_jax.kernels.rule_inputs import reset_mask, value_heads_per_key_head

CHECKPOINT = 64
MAX_VALUE_DIM = 1024  # the kernel keeps a few value-dim vectors on the stack
_FORWARD, _BACKWARD = "PorchGatedDeltaForward", "PorchGatedDeltaBackward"


def available() -> bool:
    """Whether the kernel is built and registered (builds it on the first call)."""
    return native.load("gated_delta_cpu.cc", (_FORWARD, _BACKWARD)) is not None


def _like(x: jax.Array, shape=None) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape if shape is None else shape, jnp.float32)


def _forward_call(q, k, v, g, beta, keep, state):
    b, t, h, dk, dv = v.shape[0], v.shape[1], v.shape[2], k.shape[-1], v.shape[-1]
    chunks = -(-t // CHECKPOINT)
    outputs = (_like(v), _like(state), _like(state, (b, h, chunks, dk, dv)))
    return jax.ffi.ffi_call(_FORWARD, outputs, vmap_method="sequential")(
        q, k, v, g, beta, keep, state, chunk=np.int64(CHECKPOINT)
    )


@jax.custom_vjp
def _rule(q, k, v, g, beta, keep, state):
    out, final, _ = _forward_call(q, k, v, g, beta, keep, state)
    return out, final


def _rule_fwd(q, k, v, g, beta, keep, state):
    out, final, checkpoints = _forward_call(q, k, v, g, beta, keep, state)
    return (out, final), (q, k, v, g, beta, keep, checkpoints)


def _rule_bwd(residuals, cotangents):
    q, k, v, g, beta, keep, checkpoints = residuals
    d_out, d_final = cotangents
    b, t, hk, dk = k.shape
    h = v.shape[2]
    per_value_head = _like(v, (b, t, h, dk))
    outputs = (per_value_head, per_value_head, _like(v), _like(g), _like(g), _like(d_final))
    dq, dk_, dv, dg, dbeta, d_state = jax.ffi.ffi_call(_BACKWARD, outputs, vmap_method="sequential")(
        q, k, v, g, beta, keep, checkpoints, d_out, d_final, chunk=np.int64(CHECKPOINT)
    )
    dq, dk_ = (x.reshape(b, t, hk, h // hk, dk).sum(3) for x in (dq, dk_))  # value heads -> their key head
    return dq, dk_, dv, dg, dbeta, None, d_state


_rule.defvjp(_rule_fwd, _rule_bwd)


def gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    *,
    initial_state: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """q, k [B, T, Hk, Dk], v [B, T, H, Dv], g, beta [B, T, H], initial_state [B, H, Dk, Dv];
    returns o [B, T, H, Dv] and the final state."""
    if not available():
        raise RuntimeError("the native gated delta rule could not be built (see the warning above)")
    value_heads_per_key_head(q, k, v)
    b, t, h, dv = v.shape
    if g.shape != (b, t, h) or beta.shape != (b, t, h):
        raise ValueError(f"g {g.shape} and beta {beta.shape} must be [B, T, value heads] = {(b, t, h)}")
    if dv > MAX_VALUE_DIM:
        raise ValueError(
            f"the native gated delta rule takes value head dims up to {MAX_VALUE_DIM}, not {dv}: "
            "set PORCH_JAX_CPU_KERNELS=off"
        )
    if initial_state is not None and initial_state.shape != (b, h, k.shape[-1], dv):
        raise ValueError(f"initial_state {initial_state.shape} must be [B, H, Dk, Dv] = {(b, h, k.shape[-1], dv)}")
    q, k, v, g, beta = (x.astype(jnp.float32) for x in (q, k, v, g, beta))
    keep = jnp.ones((b, t), jnp.float32) if segment_ids is None else reset_mask(segment_ids)
    state = jnp.zeros((b, h, k.shape[-1], dv), jnp.float32) if initial_state is None else initial_state
    return _rule(q, k, v, g, beta, keep, state.astype(jnp.float32))
