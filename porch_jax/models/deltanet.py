"""Gated DeltaNet maths (Yang et al., 2024) as pure jnp functions, in float32.

Per value head, with a state S [Dk, Dv]:

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = S_t^T q_t

Two forms of the same rule: `chunk_gated_delta_rule` (training and prefill: a sequential scan over
chunks of 64 tokens, everything inside a chunk as matmuls via the WY/UT transform) and
`recurrent_gated_delta_rule` (decoding: one token at a time). Both take `segment_ids` for packed
sequences: the state restarts wherever the id changes, exactly as if each segment ran alone.
`causal_conv1d` is the short depthwise convolution in front of q/k/v, with its decoding state.

`gated_delta_rule` is what models call for training and prefill: on a CPU backend the native kernel
(porch_jax/kernels: the recurrence in C++, faster there than XLA's many small matmuls), elsewhere,
or where it cannot be built, the chunked form. `causal_conv1d` likewise runs a native kernel on a
CPU ($PORCH_JAX_CPU_KERNELS = off | on overrides both, see porch_jax/kernels). The kernels have no
partitioning rule: under a mesh context (`jax.set_mesh`) they run per device on its rows of the
batch (`_per_batch_shard`); without one, in a program sharded over several CPU devices, XLA gathers
their operands (exact, not partitioned).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from porch_jax.kernels.rule_inputs import reset_mask, value_heads_per_key_head
from porch_jax.models.layers import transposed

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
    """x @ y as an unrolled sum of outer products, one elementwise fusion: XLA:CPU runs batches of
    tiny dots one by one, and a multiply-reduce ~20% slower."""
    return sum(x[..., :, i, None] * y[..., None, i, :] for i in range(x.shape[-1]))


def unit_lower_inverse(lower: jax.Array) -> jax.Array:
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


def causal_conv1d(
    x: jax.Array,
    weight: jax.Array,
    *,
    state: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Depthwise causal convolution followed by SiLU: on a CPU backend the native kernel (channel
    counts that are multiples of 16), else `xla_causal_conv1d`, whose arguments and results it has."""
    from porch_jax.kernels import causal_conv, use_native

    if not use_native(causal_conv.available, causal_conv.supports(x.shape[-1])):
        return xla_causal_conv1d(x, weight, state=state, segment_ids=segment_ids)
    return _per_batch_shard(
        causal_conv.causal_conv1d, dict(x=x), dict(state=state, segment_ids=segment_ids), dict(weight=weight)
    )


def xla_causal_conv1d(
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
    group = value_heads_per_key_head(q, k, v)
    q, k = (jnp.repeat(x, group, axis=2) for x in (q, k))
    b, t, h, dk = k.shape
    dv = v.shape[-1]
    q, k, v, g, beta = (x.astype(jnp.float32) for x in (q, k, v, g, beta))
    state = jnp.zeros((b, h, dk, dv), jnp.float32) if initial_state is None else initial_state.astype(jnp.float32)
    keep = jnp.ones((b, t), jnp.float32) if segment_ids is None else reset_mask(segment_ids)

    def step(state, inputs):
        q_t, k_t, v_t, g_t, beta_t, keep_t = inputs
        state = state * (jnp.exp(g_t) * keep_t[:, None])[..., None, None]
        predicted = jnp.einsum("bhkv,bhk->bhv", state, k_t)
        state = state + k_t[..., None] * ((v_t - predicted) * beta_t[..., None])[..., None, :]
        return state, jnp.einsum("bhkv,bhk->bhv", state, q_t)

    time_major = [jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, beta, keep)]
    state, out = jax.lax.scan(step, state, time_major)
    return jnp.moveaxis(out, 0, 1), state


def _chunk_masks(run: jax.Array | None, c: int):
    """Masks from the run index [N, B, C] of each token (None: one sequence), shaped to broadcast
    against [N, B, Hk, G, C(, C)]: visible (token i sees token j of its chunk), carry (the token
    still sees the incoming state), end (the token reaches the outgoing state); None when all ones."""
    causal = jnp.asarray(np.tril(np.ones((c, c), bool)))
    if run is None:
        return causal, None, None
    before = jnp.concatenate([run[:1, :, :1], run[:-1, :, -1:]], axis=0)  # run just before each chunk
    visible = (causal & (run[..., :, None] == run[..., None, :]))[:, :, None, None]
    carry = (run == before)[:, :, None, None].astype(jnp.float32)
    end = (run == run[..., -1:])[:, :, None, None].astype(jnp.float32)
    return visible, carry, end


def _t(x: jax.Array) -> jax.Array:
    return jnp.swapaxes(x, -1, -2)


def _per_key_head(x: jax.Array) -> jax.Array:
    """Sum over the value heads of each key head (axis 3), as adds: fused with the producers."""
    return sum(x[:, :, :, i : i + 1] for i in range(x.shape[3]))


def _rule_forward(q, k, v, g, beta, state, run):
    """The chunked rule on chunk-major operands: q, k [N, B, Hk, 1, C, Dk], v [N, B, Hk, G, C, Dv],
    g, beta [N, B, Hk, G, C], state [B, Hk, G, Dk, Dv]. Returns (out, final state), residuals."""
    n, c = v.shape[0], v.shape[-2]
    visible, carry, end = _chunk_masks(run, c)
    cum = jnp.cumsum(g, axis=-1)  # log decay from the chunk start
    # decay(j -> i) = exp(cum_i - cum_j) where visible; masked before exp so nothing overflows.
    decay = jnp.exp(jnp.where(visible, cum[..., :, None] - cum[..., None, :], -jnp.inf))
    gram, qk = k @ _t(k), q @ _t(k)  # once per key head, shared by its value heads
    from_start, to_end = jnp.exp(cum), jnp.exp(cum[..., -1:] - cum)
    if carry is not None:
        from_start, to_end = from_start * carry, to_end * end
    chunk_decay = jnp.exp(cum[..., -1]) if carry is None else jnp.exp(cum[..., -1]) * carry[..., -1]
    lower = jnp.tril(beta[..., None] * gram * decay, -1)
    transform = unit_lower_inverse(lower)
    u = transform @ (v * beta[..., None])
    w = transform @ (k * (beta * from_start)[..., None])
    k_out = k * to_end[..., None]

    def boundary(s, inputs):
        u_n, w_n, k_n, decay_n = inputs
        new_n = u_n - w_n @ s
        return s * decay_n[..., None, None] + _t(k_n) @ new_n, (s, new_n)

    # Unrolled in groups of 16 chunks: XLA:CPU's loop overhead dominates these small steps.
    final, (states, new) = jax.lax.scan(boundary, state, (u, w, k_out, chunk_decay), unroll=min(n, 16))
    attn = qk * decay
    out = (q * from_start[..., None]) @ states + attn @ new
    return (out, final), (q, k, v, beta, decay, gram, qk, transform, w, from_start, to_end, chunk_decay, states, new)


@jax.custom_vjp
def _chunk_rule(q, k, v, g, beta, state, run):
    return _rule_forward(q, k, v, g, beta, state, run)[0]


def _rule_backward(residuals, cotangents):
    """The chunked rule's gradient: a reverse scan over chunk boundaries for the state cotangents
    (two small matmuls per chunk, as forward), everything else batched over chunks. Autodiff of the
    forward differentiates the inverse's doubling steps and keeps many more, smaller ops; here T is
    only read: new = T r with r = beta v - beta k decay(start->i) S, so dr = T^T d_new and
    d(I + lower) = -dr new^T."""
    q, k, v, beta, decay, gram, qk, transform, w, from_start, to_end, chunk_decay, states, new = residuals
    d_out, d_final = cotangents
    n = v.shape[0]
    attn = qk * decay
    q_start, k_out = q * from_start[..., None], k * to_end[..., None]

    def boundary(ds, inputs):  # ds: cotangent of the state after chunk n
        a_n, p_n, k_n, w_n, decay_n = inputs
        d_new = a_n + k_n @ ds
        return ds * decay_n[..., None, None] + p_n - _t(w_n) @ d_new, (ds, d_new)

    inputs = (transposed(attn) @ d_out, transposed(q_start) @ d_out, k_out, w, chunk_decay)
    d_state, (d_after, d_new) = jax.lax.scan(boundary, d_final, inputs, reverse=True, unroll=min(n, 16))

    d_q_start = d_out @ _t(states)
    d_k_out = new @ _t(d_after)
    d_chunk_decay = jnp.sum(states * d_after, axis=(-2, -1))
    d_bv = transposed(transform) @ d_new  # new = T (beta v - beta k ... S): this is d(beta v) and -d(... S)
    d_bk = -(d_bv @ _t(states))
    d_lower = jnp.tril(-(d_bv @ _t(new)), -1)
    d_attn = d_out @ _t(new)
    d_lower_decay = d_lower * decay
    d_gram = _per_key_head(d_lower_decay * beta[..., None])
    d_qk = _per_key_head(d_attn * decay)
    d_decay = (d_attn * qk + d_lower * beta[..., None] * gram) * decay
    k_bk = jnp.sum(k * d_bk, axis=-1)
    d_start = jnp.sum(q * d_q_start, axis=-1) + beta * k_bk
    d_end = jnp.sum(k * d_k_out, axis=-1) * to_end
    d_cum = jnp.sum(d_decay, axis=-1) - jnp.sum(d_decay, axis=-2) + d_start * from_start - d_end
    d_cum = d_cum.at[..., -1].add(jnp.sum(d_end, axis=-1) + d_chunk_decay * chunk_decay)
    d_g = jax.lax.cumsum(d_cum, axis=d_cum.ndim - 1, reverse=True)
    d_beta = jnp.sum(d_lower_decay * gram, axis=-1) + jnp.sum(v * d_bv, axis=-1) + from_start * k_bk
    d_v = d_bv * beta[..., None]
    d_q = _per_key_head(d_q_start * from_start[..., None]) + d_qk @ k
    d_k = (
        _per_key_head(d_k_out * to_end[..., None] + d_bk * (beta * from_start)[..., None])
        + (d_gram + _t(d_gram)) @ k
        + transposed(d_qk) @ q
    )
    return d_q, d_k, d_v, d_g, d_beta, d_state, None


_chunk_rule.defvjp(_rule_forward, _rule_backward)


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
    head, not once per value head as a repeat of q and k would). The gradient is hand-written
    (`_rule_backward`).
    """
    group = value_heads_per_key_head(q, k, v)
    b, t, hk, dk = k.shape
    h, dv = v.shape[2], v.shape[-1]
    c = chunk_size
    pad = -t % c
    n = (t + pad) // c

    def chunked(x: jax.Array, per_head: int) -> jax.Array:
        """[B, T, Hk * per_head, ...] -> [N, B, Hk, per_head, C, ...] in float32, zero-padded (a zero
        token leaves the state alone)."""
        x = jnp.pad(x.astype(jnp.float32), [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        x = x.reshape(b, n, c, hk, per_head, *x.shape[3:])
        return jnp.moveaxis(x, (1, 2), (0, 4))

    q, k = (chunked(x, 1) for x in (q, k))
    v, g, beta = (chunked(x, group) for x in (v, g, beta))
    run = None
    if segment_ids is not None:
        run = jnp.moveaxis(jnp.pad(_runs(segment_ids), [(0, 0), (0, pad)], mode="edge").reshape(b, n, c), 1, 0)
    state = jnp.zeros((b, h, dk, dv), jnp.float32) if initial_state is None else initial_state.astype(jnp.float32)
    out, state = _chunk_rule(q, k, v, g, beta, state.reshape(b, hk, group, dk, dv), run)
    out = jnp.moveaxis(out, (0, 4), (1, 2)).reshape(b, n * c, h, dv)[:, :t]
    return out, state.reshape(b, h, dk, dv)


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
    """The rule for training and prefill (arguments as `chunk_gated_delta_rule`), in the form that
    is fastest where it runs: see the module docstring."""
    from porch_jax.kernels import gated_delta, use_native

    if not use_native(gated_delta.available, v.shape[-1] <= gated_delta.MAX_VALUE_DIM):
        return chunk_gated_delta_rule(q, k, v, g, beta, initial_state=initial_state, segment_ids=segment_ids)
    return _per_batch_shard(
        gated_delta.gated_delta_rule,
        dict(q=q, k=k, v=v, g=g, beta=beta),
        dict(initial_state=initial_state, segment_ids=segment_ids),
    )


def _per_batch_shard(kernel, batched: dict, optional: dict, replicated: dict | None = None):
    """kernel(**batched, **optional, **replicated) on each device's rows of the batch when a mesh is set
    (`jax.set_mesh`) and shards the batch: a native kernel has no partitioning rule,
    so XLA would otherwise gather every operand onto every device. `batched` and `optional` (which may
    hold None) lead with the batch axis, as do the kernel's results; `replicated` do not."""
    from jax.sharding import PartitionSpec

    from porch_jax.models.sharding import logical_to_spec

    replicated = replicated or {}
    mesh = jax.sharding.get_abstract_mesh()
    first = next(iter(batched.values()))
    axes = None if mesh.empty else logical_to_spec(("batch",), mesh=mesh, shape=first.shape[:1])[0]
    if axes is None:
        return kernel(**batched, **optional, **replicated)
    sharded = {**batched, **{name: x for name, x in optional.items() if x is not None}}
    names = list(sharded) + list(replicated)

    def local(*arrays):
        return kernel(
            **dict(zip(names, arrays, strict=False)), **{name: None for name, x in optional.items() if x is None}
        )

    in_specs = (PartitionSpec(axes),) * len(sharded) + (PartitionSpec(),) * len(replicated)
    return jax.shard_map(local, in_specs=in_specs, out_specs=PartitionSpec(axes), check_vma=False)(
        *sharded.values(), *replicated.values()
    )
