"""Gated DeltaNet's depthwise causal conv + SiLU as the native CPU kernel (causal_conv_cpu.cc), with its
gradient. Same arguments and results as `porch_jax.models.deltanet.causal_conv1d`; computed in float32,
returned in x's dtype. Takes channel counts that are multiples of 16 (`supports`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from porch_jax.kernels import native
from porch_jax.kernels.rule_inputs import reset_mask

_FORWARD, _BACKWARD = "PorchCausalConvForward", "PorchCausalConvBackward"


def available() -> bool:
    """Whether the kernel is built and registered (builds it on the first call)."""
    return native.load("causal_conv_cpu.cc", (_FORWARD, _BACKWARD)) is not None


def supports(channels: int) -> bool:
    return channels % 16 == 0


@jax.custom_vjp
def _conv(x, state, weight_t, reach):
    return jax.ffi.ffi_call(_FORWARD, jax.ShapeDtypeStruct(x.shape, jnp.float32), vmap_method="sequential")(
        x, state, weight_t, reach
    )


def _conv_fwd(x, state, weight_t, reach):
    return _conv(x, state, weight_t, reach), (x, state, weight_t, reach)


def _conv_bwd(residuals, dy):
    x, state, weight_t, reach = residuals
    shapes = tuple(jax.ShapeDtypeStruct(a.shape, jnp.float32) for a in (x, state, weight_t))
    dx, dstate, dw = jax.ffi.ffi_call(_BACKWARD, shapes, vmap_method="sequential")(x, state, weight_t, reach, dy)
    return dx, dstate, dw, None


_conv.defvjp(_conv_fwd, _conv_bwd)


def causal_conv1d(
    x: jax.Array,
    weight: jax.Array,
    *,
    state: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """x [B, T, C], weight [C, K], state [B, K-1, C] or None; returns (silu(conv(x)), new state)."""
    b, t, c = x.shape
    width = weight.shape[-1]
    if not supports(c):
        raise ValueError(f"the native causal conv takes channel counts that are multiples of 16, not {c}")
    if weight.shape != (c, width) or (state is not None and state.shape != (b, width - 1, c)):
        raise ValueError(
            f"weight {weight.shape} must be [C, K] = [{c}, K] and state "
            f"{None if state is None else state.shape} [B, K-1, C] = {(b, width - 1, c)}"
        )
    if not available():
        raise RuntimeError("the native causal conv could not be built (see the warning above)")
    if state is None:
        state = jnp.zeros((b, width - 1, c), x.dtype)
    # The largest lag that stays in each token's segment: all K-1 in the first segment (which
    # continues the state; its start is 0, where no segment can begin), else the distance to the
    # segment's first token.
    reach = jnp.full((b, t), width - 1, jnp.int32)
    if segment_ids is not None:
        position = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        start = jax.lax.cummax(jnp.where(reset_mask(segment_ids) == 0, position, 0), axis=1)
        reach = jnp.where(start == 0, reach, position - start)
    y = _conv(x.astype(jnp.float32), state.astype(jnp.float32), weight.T.astype(jnp.float32), reach)
    new_state = jnp.concatenate([state.astype(x.dtype), x], axis=1)[:, t:]
    return y.astype(x.dtype), new_state
