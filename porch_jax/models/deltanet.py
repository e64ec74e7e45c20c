"""Gated DeltaNet maths (Yang et al., 2024) as pure jnp functions, in float32.

Per value head, with a state S [Dk, Dv]:

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = S_t^T q_t

Two forms of the same rule: `chunk_gated_delta_rule` (training and prefill: a sequential scan over
chunks of 64 tokens, everything inside a chunk as matmuls via the WY/UT transform) and
`recurrent_gated_delta_rule` (decoding: one token at a time). Both take `segment_ids` for packed
sequences: the state restarts wherever the id changes, exactly as if each segment ran alone.
`causal_conv1d` is the short depthwise convolution in front of q/k/v, with its decoding state.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

CHUNK_SIZE = 64


def l2norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x / sqrt(|x|^2 + eps) over the last axis (the eps placement of FLA and transformers)."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def _runs(segment_ids: jax.Array) -> jax.Array:
    """Index of each token's run of equal segment ids [B, T]; the first run is 0.

    Equality of run indices means "same packed sequence, no boundary in between", which is all
    the state reset needs; the first run continues any initial state.
    """
    change = jnp.concatenate(
        [jnp.zeros_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
    )
    return jnp.cumsum(change, axis=1, dtype=jnp.int32)


def _diagonal_blocks(m: jax.Array, size: int) -> jax.Array:
    """The diagonal blocks [..., n / size, size, size] of square matrices m [..., n, n]."""
    p = m.shape[-1] // size
    blocks = m.reshape(*m.shape[:-2], p, size, p, size)
    return jnp.moveaxis(jnp.diagonal(blocks, axis1=-4, axis2=-2), -1, -3)


def _small_matmul(x: jax.Array, y: jax.Array) -> jax.Array:
    """x @ y as a fused multiply-sum: XLA:CPU runs batches of tiny dots one by one."""
    return jnp.sum(x[..., :, :, None] * y[..., None, :, :], axis=-2)


def _doubling_inverse(lower: jax.Array) -> jax.Array:
    """(I + lower)^-1 for strictly lower-triangular lower [..., n, n], n a power of two.

    Block doubling: inverses of the diagonal blocks of size s give those of size 2s as
    [[A^-1, 0], [-D^-1 C A^-1, D^-1]]: log2(n) batched steps, as exact as forward substitution.
    (XLA:CPU's batched triangular_solve is ~50x slower.)
    """
    n = lower.shape[-1]
    inverse = jnp.ones((*lower.shape[:-2], n, 1, 1), lower.dtype)
    size = 1
    while size < n:
        below = _diagonal_blocks(lower, 2 * size)[..., size:, :size]
        pairs = inverse.reshape(*inverse.shape[:-3], n // (2 * size), 2, size, size)
        upper_inv, lower_inv = pairs[..., 0, :, :], pairs[..., 1, :, :]
        matmul = _small_matmul if size <= 8 else jnp.matmul
        corner = -matmul(matmul(lower_inv, below), upper_inv)
        top = jnp.concatenate([upper_inv, jnp.zeros_like(upper_inv)], axis=-1)
        inverse = jnp.concatenate([top, jnp.concatenate([corner, lower_inv], axis=-1)], axis=-2)
        size *= 2
    return inverse[..., 0, :, :]


# Differentiating through the doubling steps costs more than the closed form in _inverse_bwd.
unit_lower_inverse = jax.custom_vjp(_doubling_inverse)


def _inverse_fwd(lower: jax.Array) -> tuple[jax.Array, jax.Array]:
    inverse = _doubling_inverse(lower)
    return inverse, inverse


def _inverse_bwd(inverse: jax.Array, grad: jax.Array) -> tuple[jax.Array]:
    """d(M^-1) = -M^-1 dM M^-1; only the strictly lower part of M is an input."""
    t = jnp.swapaxes(inverse, -1, -2)
    return (jnp.tril(-(t @ grad @ t), -1),)


unit_lower_inverse.defvjp(_inverse_fwd, _inverse_bwd)


def causal_conv1d(
    x: jax.Array,
    weight: jax.Array,
    *,
    state: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Depthwise causal convolution followed by SiLU.

    x [B, T, C], weight [C, K] (weight[:, -1] multiplies the current token), state [B, K-1, C]:
    the inputs before x (zeros when None). Returns (y [B, T, C], new state = the last K-1 inputs).
    With segment_ids, a token never sees inputs of an earlier segment.
    """
    t, width = x.shape[1], weight.shape[-1]
    if state is None:
        state = jnp.zeros((x.shape[0], width - 1, x.shape[2]), x.dtype)
    padded = jnp.concatenate([state.astype(x.dtype), x], axis=1)
    runs = None
    if segment_ids is not None:
        run = _runs(segment_ids)
        runs = jnp.concatenate([jnp.broadcast_to(run[:, :1], (run.shape[0], width - 1)), run], axis=1)
    y = x * weight[:, -1]
    for lag in range(1, width):
        shifted = padded[:, width - 1 - lag : width - 1 - lag + t]
        if runs is not None:
            same = runs[:, width - 1 - lag : width - 1 - lag + t] == runs[:, width - 1 :]
            shifted = jnp.where(same[..., None], shifted, 0)
        y = y + shifted * weight[:, width - 1 - lag]
    return jax.nn.silu(y), padded[:, t:]


def _grouped(q: jax.Array, k: jax.Array, v: jax.Array) -> int:
    """Value heads per key head, checking the shapes both forms take."""
    hk, hv = k.shape[2], v.shape[2]
    if q.shape[:3] != k.shape[:3] or hv % hk:
        raise ValueError(f"q {q.shape} and k {k.shape} need the same [B, T, key heads], and the value heads of "
                         f"v {v.shape} a multiple of the key heads")
    return hv // hk


def recurrent_gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    *,
    initial_state: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The rule token by token: the reference form, and the decode step (T = 1).

    q, k [B, T, Hk, Dk] (l2-normalised, q also scaled), v [B, T, H, Dv] with H a multiple of Hk
    (value head j reads key head j // (H / Hk)), g (log decay, <= 0) and beta [B, T, H],
    initial_state [B, H, Dk, Dv]. Returns o [B, T, H, Dv] and the final state, float32.
    """
    group = _grouped(q, k, v)
    q, k = (jnp.repeat(x, group, axis=2) for x in (q, k))
    b, t, h, dk = k.shape
    dv = v.shape[-1]
    q, k, v, g, beta = (x.astype(jnp.float32) for x in (q, k, v, g, beta))
    state = jnp.zeros((b, h, dk, dv), jnp.float32) if initial_state is None else initial_state.astype(jnp.float32)
    keep = jnp.ones((b, t), jnp.float32)
    if segment_ids is not None:
        run = _runs(segment_ids)
        keep = jnp.concatenate([keep[:, :1], (run[:, 1:] == run[:, :-1]).astype(jnp.float32)], axis=1)

    def step(state, inputs):
        q_t, k_t, v_t, g_t, beta_t, keep_t = inputs
        state = state * (jnp.exp(g_t) * keep_t[:, None])[..., None, None]
        predicted = jnp.einsum("bhkv,bhk->bhv", state, k_t)
        state = state + k_t[..., None] * ((v_t - predicted) * beta_t[..., None])[..., None, :]
        return state, jnp.einsum("bhkv,bhk->bhv", state, q_t)

    time_major = [jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, beta, keep)]
    state, out = jax.lax.scan(step, state, time_major)
    return jnp.moveaxis(out, 0, 1), state


def chunk_gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    *,
    initial_state: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[jax.Array, jax.Array]:
    """The rule in chunks (chunk_size a power of two); same arguments and results as
    `recurrent_gated_delta_rule`.

    Inside a chunk, the delta-rule updates are condensed by the UT transform: with
    A = I + strictly_lower(beta_i k_i.k_j decay(j->i)), the corrections written to the state are
    u = A^-1 (beta v) - A^-1 (beta k decay(start->i)) S_prev. Only the state at chunk boundaries is
    scanned sequentially (two small matmuls per chunk); the outputs are then batched matmuls.
    Value heads that share a key head share its Gram matrices k.k and q.k (computed once per key
    head, not once per value head as a repeat of q and k would).
    """
    group = _grouped(q, k, v)
    b, t, hk, dk = k.shape
    h, dv = v.shape[2], v.shape[-1]
    c = chunk_size
    pad = -t % c
    n = (t + pad) // c
    q, k, v, g, beta = (x.astype(jnp.float32) for x in (q, k, v, g, beta))

    def chunked(x: jax.Array, heads: int, per_head: int) -> jax.Array:
        """[B, T, heads * per_head, ...] -> [B, heads, per_head, N, C, ...], zero-padded (a zero
        token leaves the state alone)."""
        x = jnp.moveaxis(jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)), 1, 2)
        return x.reshape(b, heads, per_head, n, c, *x.shape[3:])

    q, k = (chunked(x, hk, 1) for x in (q, k))  # [B, Hk, 1, N, C, Dk]
    # The Gram matrices once per key head, then every operand per value head: [B, H, N, ...].
    gram, qk = (jnp.einsum("...id,...jd->...ij", x, k) for x in (k, q))
    gram, qk, q, k = (jnp.broadcast_to(x, (b, hk, group, *x.shape[3:])).reshape(b, h, *x.shape[3:])
                      for x in (gram, qk, q, k))
    v, g, beta = (chunked(x, hk, group).reshape(b, h, n, c, *x.shape[3:]) for x in (v, g, beta))
    cum = jnp.cumsum(g, axis=-1)  # log decay from the chunk start, [B, H, N, C]
    causal = jnp.asarray(np.tril(np.ones((c, c), bool)))
    if segment_ids is None:
        visible = causal  # token i sees token j of its chunk
        carry = end = last_carry = None
    else:
        run = jnp.pad(_runs(segment_ids), [(0, 0), (0, pad)], mode="edge").reshape(b, n, c)
        before = jnp.concatenate([run[:, :1, :1], run[:, :-1, -1:]], axis=1)  # run just before each chunk
        visible = (causal & (run[..., :, None] == run[..., None, :]))[:, None]  # [B, 1, N, C, C]
        carry = (run == before)[:, None].astype(jnp.float32)  # token still sees the incoming state
        end = (run == run[..., -1:])[:, None].astype(jnp.float32)  # token reaches the outgoing state
        last_carry = carry[..., -1]

    # decay(j -> i) = exp(cum_i - cum_j) where visible; masked before exp so nothing overflows.
    decay = jnp.exp(jnp.where(visible, cum[..., :, None] - cum[..., None, :], -jnp.inf))
    k_beta = k * beta[..., None]
    from_start = jnp.exp(cum)[..., None]
    if carry is not None:
        from_start = from_start * carry[..., None]
    lower = beta[..., None] * gram * decay
    transform = unit_lower_inverse(lower * jnp.asarray(np.tri(c, k=-1, dtype=np.float32)))
    u, w = transform @ (v * beta[..., None]), transform @ (k_beta * from_start)

    to_end = jnp.exp(cum[..., -1:] - cum)[..., None]
    chunk_decay = jnp.exp(cum[..., -1])
    if carry is not None:
        to_end, chunk_decay = to_end * end[..., None], chunk_decay * last_carry
    k_out = k * to_end

    def boundary(state, inputs):
        u_n, w_n, k_n, decay_n = inputs
        new = u_n - jnp.einsum("bhck,bhkv->bhcv", w_n, state)
        return state * decay_n[..., None, None] + jnp.einsum("bhck,bhcv->bhkv", k_n, new), (state, new)

    state = jnp.zeros((b, h, dk, dv), jnp.float32) if initial_state is None else initial_state.astype(jnp.float32)
    over_chunks = [jnp.moveaxis(x, 2, 0) for x in (u, w, k_out, chunk_decay)]
    # Unrolled in groups of 16 chunks: XLA:CPU's loop overhead dominates these small steps.
    state, (states, new) = jax.lax.scan(boundary, state, over_chunks, unroll=min(n, 16))
    states, new = jnp.moveaxis(states, 0, 2), jnp.moveaxis(new, 0, 2)

    attn = qk * decay
    out = jnp.einsum("bhnck,bhnkv->bhncv", q * from_start, states) + attn @ new
    out = jnp.moveaxis(out, 1, 3).reshape(b, n * c, h, dv)[:, :t]
    return out, state
