"""Building blocks of a Qwen3-style decoder: RMSNorm, RoPE, GQA attention, SwiGLU MLP.

Parameters carry logical axis names (`out_sharding` metadata, see sharding.py) and are never
sharded eagerly, so the same module runs on one device or on a mesh.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from porch_jax.models.config import ModelConfig, RopeScaling

# Scores of masked keys. Finite, so a query with no visible key (a left pad) stays NaN-free.
_MASKED = -1e30
# Query blocks of the blockwise causal attention (see `causal_attention` and `_blocks`): at least ATTENTION_BLOCK
# queries each, as few as ATTENTION_BLOCKS blocks where a block of at most MAX_ATTENTION_BLOCK queries allows.
ATTENTION_BLOCK = 64
ATTENTION_BLOCKS = 4
MAX_ATTENTION_BLOCK = 512


def param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str, ...], dtype, std: float) -> nnx.Param:
    """A normal(0, std) parameter (std 0 gives ones, as for norm weights) with logical axis names."""
    if std:
        value = std * jax.random.normal(rngs.params(), shape, jnp.float32)
    else:
        value = jnp.ones(shape, jnp.float32)
    return nnx.Param(value.astype(dtype), out_sharding=axes, eager_sharding=False)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm in float32 whatever the compute dtype; returns x's dtype."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * weight.astype(jnp.float32)).astype(x.dtype)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, *, param_dtype=jnp.float32):
        self.weight = param(None, (dim,), ("norm",), param_dtype, 0.0)
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, self.weight[...], self.eps)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> np.ndarray:
    """RoPE's inverse frequencies [head_dim // 2] (float32), with Llama 3's scaling when given."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    if scaling is None:
        return inv_freq
    old_len, factor = scaling.original_max_position_embeddings, scaling.factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > old_len / scaling.low_freq_factor, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    medium = (wavelen >= old_len / scaling.high_freq_factor) & (wavelen <= old_len / scaling.low_freq_factor)
    return np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled).astype(np.float32)


def rope_tables(
    positions: jax.Array,
    head_dim: int,
    theta: float,
    num_positions: int | None = None,
    scaling: RopeScaling | None = None,
) -> tuple[jax.Array, jax.Array]:
    """cos and sin [B, T, head_dim] (float32) for HF's rotate_half convention.

    num_positions: a static bound (every position < it), known when the model derives the positions
    itself. The tables are then computed once per position and gathered: computed directly, XLA:CPU
    fuses cos and sin into every q and k rotation of every layer, forward and backward, and evaluates
    them once per head (measured: 3-4% of a bf16 train step, benchmarks/bench_train_step.py).
    """
    inv_freq = rope_inv_freq(head_dim, theta, scaling)

    def cos_sin(at: jax.Array) -> tuple[jax.Array, jax.Array]:
        angles = at.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
        emb = jnp.concatenate([angles, angles], axis=-1)
        return jnp.cos(emb), jnp.sin(emb)

    if num_positions is None:
        return cos_sin(positions)
    return tuple(jnp.take(table, positions, axis=0, mode="clip") for table in cos_sin(jnp.arange(num_positions)))


@jax.custom_vjp
def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates x [B, T, heads, D] by position; computed in float32.

    The gradient is the inverse rotation, one fused elementwise op; autodiff of the slices and
    concatenation costs several times more on XLA:CPU.
    """
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos[:, :, None] + rotated * sin[:, :, None]).astype(x.dtype)


def _rope_fwd(x, cos, sin):
    return apply_rope(x, cos, sin), (cos, sin)


def _rope_bwd(res, dy):
    cos, sin = res
    return apply_rope(dy, cos, -sin), None, None


apply_rope.defvjp(_rope_fwd, _rope_bwd)


def _barrier(x: jax.Array) -> jax.Array:
    """Materialises x as computed: stops XLA from folding our transposes back into the dots. Besides
    speed (row_major), this keeps XLA:CPU (jax 0.10.2) from forming bf16 dots with a transposed
    operand, some of which it fails to run ("Unsupported element type for DotThunk")."""
    return jax.lax.optimization_barrier(x)


def row_major(x: jax.Array) -> jax.Array:
    """x written out in row-major order. XLA:CPU otherwise lays out a transpose (or a swap of axes)
    as a strided view of its input, and a dot reading such a view is a transposed-operand dot,
    which its fast dot (YNNPACK) does not take in bf16: XLA upcasts it to f32 (~2.5x slower). A
    barrier alone keeps the view; merging the last two axes pairwise behind it leaves none. Other
    backends transpose inside their dots: x as is there, and on a CPU mesh of several devices too, where
    the reshape of a row-sharded activation is a reshard the partitioner can only do by replicating it."""
    mesh = jax.sharding.get_abstract_mesh()
    if jax.default_backend() != "cpu" or (not mesh.empty and mesh.size > 1):
        return x
    *lead, r, c = x.shape
    if r % 2:
        return _barrier(x)
    return _barrier(x.reshape(*lead, r // 2, 2 * c)).reshape(x.shape)


def transposed(a: jax.Array) -> jax.Array:
    """a with its last two axes swapped, row-major (see row_major)."""
    return row_major(jnp.swapaxes(a, -1, -2))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def dense(x: jax.Array, w: jax.Array, out_dtype=None) -> jax.Array:
    """x [..., in] @ w [in, out] (result in out_dtype, default x's), with a backward pass shaped
    for XLA:CPU.

    Every dot accumulates and returns f32 and is rounded afterwards: XLA:CPU's fast dot (YNNPACK)
    takes bf16 operands only with an f32 result, and upcasts a bf16-result dot to f32. The weight
    gradient contracts over tokens, the major axis of both x and dy; the fast dot takes no such
    operand, so XLA would transpose the wider activation in a slow loop and fall back to a slower
    dot. Here the narrower of x and dy is transposed once, so every backward dot is a fast one
    (about 30% off an MLP's forward + backward in f32; in bf16 every dot runs at bf16 speed, ~2x f32).
    """
    return jnp.matmul(x, w, preferred_element_type=jnp.float32).astype(out_dtype or x.dtype)


def _dense_fwd(x, w, out_dtype):
    return dense(x, w, out_dtype), (x, w)


def _dense_bwd(out_dtype, res, dy):
    x, w = res
    dy = dy.astype(x.dtype)
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    if w.shape[0] <= w.shape[1]:
        dw = jnp.matmul(transposed(x2), dy2, preferred_element_type=jnp.float32)
    else:
        dw = _barrier(jnp.matmul(transposed(dy2), x2, preferred_element_type=jnp.float32)).T
    dx = jnp.matmul(dy, w.T, preferred_element_type=jnp.float32)
    return dx.astype(x.dtype), dw.astype(w.dtype)


dense.defvjp(_dense_fwd, _dense_bwd)


def _einsum(spec: str, a: jax.Array, b: jax.Array, dtype) -> jax.Array:
    """einsum with operands in the compute dtype and a float32 result."""
    return jnp.einsum(spec, a.astype(dtype), b.astype(dtype), preferred_element_type=jnp.float32)


def _visible(start: int, end: int, groups: int, attention_mask, segment_ids) -> jax.Array:
    """bool [B or 1, 1, (end - start) * groups, end]: which keys each query row of a block sees."""
    rows = np.repeat(np.arange(start, end), groups)  # query rows are (position, group) pairs
    visible = jnp.asarray(rows[:, None] >= np.arange(end)[None, :])[None]
    if attention_mask is not None:
        visible = visible & attention_mask[:, None, :end]
    if segment_ids is not None:
        q_segments = jnp.repeat(segment_ids[:, start:end], groups, axis=1)
        visible = visible & (q_segments[:, :, None] == segment_ids[:, None, :end])
    return visible[:, None]


def _blocks(length: int, block: int) -> list[tuple[int, int]]:
    """Query blocks [start, end) of a `length`-token attention: ATTENTION_BLOCKS blocks where each holds at least
    `block` and at most max(block, MAX_ATTENTION_BLOCK) queries, else more.

    XLA unrolls every block of every layer, so the block count sets the compile time; a larger block also computes
    more masked scores (4 blocks: 62% of the T x T scores, against 53% in blocks of 64). SmolLM2 (30 layers) on 2
    CPU cores, against blocks of 64: a train step's forward and backward at 896 tokens compiles in 18 s instead of 50
    s and at 1,536 tokens in 19 s instead of 147 s, a 8 x 1,536-token forward in 5 s instead of 26 s, each running
    within 3% of the old time (alternating A/B); 2 blocks run that forward 20% slower, and a 4-layer model with
    hidden 256 steps 7% slower at 2,048 tokens (blocks of 512 or 256 alike). The upper bound keeps one block's
    scores small at GPU lengths."""
    size = min(max(block, -(-length // ATTENTION_BLOCKS)), max(block, MAX_ATTENTION_BLOCK))
    return [(start, min(start + size, length)) for start in range(0, length, size)]


def _attention_forward(q, k, v, attention_mask, segment_ids, block):
    """Blockwise causal softmax attention; also returns what the backward pass reuses."""
    groups = q.shape[2] // k.shape[2]
    outputs, probs, sums = [], [], []
    for start, end in _blocks(k.shape[2], block):
        rows = slice(start * groups, end * groups)
        scores = _einsum("bkmd,bksd->bkms", q[:, :, rows], k[:, :, :end], q.dtype)
        visible = _visible(start, end, groups, attention_mask, segment_ids)
        scores = jnp.where(visible, scores, _MASKED)
        p = jnp.where(visible, jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True)), 0.0)
        total = jnp.sum(p, axis=-1, keepdims=True)
        total = jnp.where(total > 0, total, 1.0)  # a query that sees no key outputs 0
        outputs.append(_einsum("bkms,bksd->bkmd", p, v[:, :, :end], v.dtype) / total)
        probs.append(p)
        sums.append(total)
    return jnp.concatenate(outputs, axis=2).astype(q.dtype), probs, sums


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _attention(q, k, v, attention_mask, segment_ids, block):
    return _attention_forward(q, k, v, attention_mask, segment_ids, block)[0]


def _attention_fwd(q, k, v, attention_mask, segment_ids, block):
    out, probs, sums = _attention_forward(q, k, v, attention_mask, segment_ids, block)
    return out, (q, k, v, out, probs, sums, attention_mask, segment_ids)


def _attention_bwd(block, res, d_out):
    """Flash-attention gradients from the saved unnormalised probabilities.

    dS = P * (dO V^T - rowsum(dO * O)); dK and dV are accumulated transposed ([D, T]) so that
    every dot has a fast form on XLA:CPU and only small [rows, D] tensors are transposed.
    """
    q, k, v, out, probs, sums, attention_mask, segment_ids = res
    groups, length, dtype = q.shape[2] // k.shape[2], k.shape[2], q.dtype
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)
    q_t = transposed(q)
    dq = []
    dk_t = jnp.zeros(q_t.shape[:3] + (length,), jnp.float32)
    dv_t = jnp.zeros_like(dk_t)
    for (start, end), p, total in zip(_blocks(length, block), probs, sums, strict=False):
        rows = slice(start * groups, end * groups)
        d_scaled = d_out[:, :, rows].astype(jnp.float32) / total
        ds = p * (_einsum("bkmd,bksd->bkms", d_scaled, v[:, :, :end], dtype) - delta[:, :, rows] / total)
        dq.append(_einsum("bkms,bksd->bkmd", ds, k[:, :, :end], dtype))
        dk_t = dk_t.at[..., :end].add(_einsum("bkdm,bkms->bkds", q_t[..., rows], ds, dtype))
        dv_t = dv_t.at[..., :end].add(_einsum("bkdm,bkms->bkds", transposed(d_scaled.astype(dtype)), p, dtype))
    # Swapped behind a barrier (see _barrier): with a single block XLA would fold the swaps into the dots.
    dk, dv = jnp.swapaxes(_barrier(dk_t), 2, 3), jnp.swapaxes(_barrier(dv_t), 2, 3)
    return (
        jnp.concatenate(dq, axis=2).astype(q.dtype),
        dk.astype(k.dtype),
        dv.astype(v.dtype),
        _zero_cotangent(attention_mask),
        _zero_cotangent(segment_ids),
    )


def _zero_cotangent(x):
    return None if x is None else np.zeros(x.shape, jax.dtypes.float0)


_attention.defvjp(_attention_fwd, _attention_bwd)


def causal_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    attention_mask: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    block: int = ATTENTION_BLOCK,
) -> jax.Array:
    """Causal GQA self-attention, q [B, T, K, G, D] (pre-scaled), k/v [B, T, K, D] -> [B, T, K, G, D].

    XLA:CPU has no fused attention. Blockwise (`_blocks`; `block` the fewest queries a block holds): each block of
    queries sees only keys up to its own end, so most of the masked half of the scores is never computed and no
    [T, T] matrix for all heads exists at once; a hand-written backward pass reuses the forward's probabilities.
    Queries are laid out [B, K, T * G, D] so the G heads sharing a key head form one matrix product.
    """
    b, t, kv, g, d = q.shape
    q = jnp.transpose(q, (0, 2, 1, 3, 4)).reshape(b, kv, t * g, d)
    k, v = row_major(jnp.swapaxes(k, 1, 2)), row_major(jnp.swapaxes(v, 1, 2))
    out = _attention(q, k, v, attention_mask, segment_ids, block)
    return jnp.transpose(out.reshape(b, kv, t, g, d), (0, 2, 1, 3, 4))


def fresh_prefill(length: int, cache_index: Any) -> bool:
    """Whether a cached forward of `length` tokens at `cache_index` is a first prefill: a static index 0 and more
    than one token. The cache then holds nothing before the chunk, so causal attention within the chunk is the
    cached attention's result, blockwise (models/sampler.py prefills long prompts this way; decoding and a chunk after
    reused keys read the cache)."""
    return length > 1 and isinstance(cache_index, int) and cache_index == 0


def cached_attention(q: jax.Array, k: jax.Array, v: jax.Array, key_mask: jax.Array, cache_index) -> jax.Array:
    """Queries q [B, T, K, G, D] in cache slots [cache_index, cache_index + T) over all cache slots.

    k, v: [B, K, S, D], heads-major (the caches' layout, which the batched matmuls read as it is:
    from [B, S, K, D], XLA:CPU transposes the whole cache of every layer at every decode step).
    A query in slot s sees key slots <= s whose key_mask [B, S] is True.
    Dense: decoding has few queries, and the cache length is fixed.
    """
    t, s = q.shape[1], k.shape[2]
    query_slots = cache_index + jnp.arange(t)
    visible = (jnp.arange(s)[None, :] <= query_slots[:, None])[None] & key_mask[:, None, :]
    scores = _einsum("bqkgd,bksd->bkgqs", q, k, q.dtype)
    probs = jax.nn.softmax(jnp.where(visible[:, None, None], scores, _MASKED), axis=-1)
    # Heads-major out, swapped to [B, T, K, G, D] behind a barrier (see _barrier).
    out = _barrier(_einsum("bkgqs,bksd->bkgqd", probs, v, v.dtype))
    return jnp.transpose(out, (0, 3, 1, 2, 4)).astype(q.dtype)


class Attention(nnx.Module):
    """GQA attention; per-head q/k RMSNorm before RoPE when `config.qk_norm` (Qwen3), q/k/v biases
    when `config.qkv_bias` (Qwen2), neither for Llama."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        h, n, kv, d = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
        std = config.initializer_range
        self.q_proj = param(rngs, (h, n, d), ("embed", "heads", "head_dim"), param_dtype, std)
        self.k_proj = param(rngs, (h, kv, d), ("embed", "kv_heads", "head_dim"), param_dtype, std)
        self.v_proj = param(rngs, (h, kv, d), ("embed", "kv_heads", "head_dim"), param_dtype, std)
        self.o_proj = param(rngs, (n, d, h), ("heads", "head_dim", "embed"), param_dtype, std)
        if config.qk_norm:
            self.q_norm = RMSNorm(d, config.rms_norm_eps, param_dtype=param_dtype)
            self.k_norm = RMSNorm(d, config.rms_norm_eps, param_dtype=param_dtype)
        if config.qkv_bias:  # HF initialises biases at zero; std gives a random model non-trivial ones
            self.q_bias = param(rngs, (n, d), ("heads", "head_dim"), param_dtype, std)
            self.k_bias = param(rngs, (kv, d), ("kv_heads", "head_dim"), param_dtype, std)
            self.v_bias = param(rngs, (kv, d), ("kv_heads", "head_dim"), param_dtype, std)
        self.qk_norm, self.qkv_bias = config.qk_norm, config.qkv_bias
        self.num_kv_heads, self.num_groups, self.head_dim = kv, config.num_groups, d
        self.dtype = dtype

    def __call__(
        self,
        x: jax.Array,
        rope: tuple[jax.Array, jax.Array],
        *,
        attention_mask: jax.Array | None,
        segment_ids: jax.Array | None,
        kv_cache: tuple[jax.Array, jax.Array, int, jax.Array, jax.Array] | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """x [B, T, H]. kv_cache: (k, v [L, B, K, S, D] of all layers, this layer's index,
        key_mask [B, S], cache_index) or None.

        Returns the output [B, T, H] and, with a cache, the updated all-layer (k, v): writing into
        the stacked arrays directly lets a donated cache be updated in place.
        """
        b, t, h = x.shape
        cos, sin = rope
        q, k, v = (
            dense(x, w[...].astype(self.dtype).reshape(h, -1)).reshape(b, t, -1, self.head_dim)
            for w in (self.q_proj, self.k_proj, self.v_proj)
        )
        if self.qkv_bias:
            q, k, v = (
                y + bias[...].astype(self.dtype)
                for y, bias in zip((q, k, v), (self.q_bias, self.k_bias, self.v_bias), strict=True)
            )
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q, cos, sin) * jnp.asarray(1.0 / math.sqrt(self.head_dim), self.dtype)
        k = apply_rope(k, cos, sin)
        q = q.reshape(b, t, self.num_kv_heads, self.num_groups, self.head_dim)
        if kv_cache is None:
            out = causal_attention(q, k, v, attention_mask=attention_mask, segment_ids=segment_ids)
            new_kv = None
        else:
            k_cache, v_cache, layer, key_mask, index = kv_cache
            start = (layer, 0, 0, index, 0)  # KVCache is heads-major: [L, B, K, S, D]
            k_cache = jax.lax.dynamic_update_slice(k_cache, jnp.swapaxes(k, 1, 2).astype(k_cache.dtype)[None], start)
            v_cache = jax.lax.dynamic_update_slice(v_cache, jnp.swapaxes(v, 1, 2).astype(v_cache.dtype)[None], start)
            if fresh_prefill(t, index):  # the cache holds nothing before this chunk: attend within it, blockwise
                out = causal_attention(q, k, v, attention_mask=key_mask[:, :t], segment_ids=None)
            else:
                keys, values = k_cache[layer].astype(self.dtype), v_cache[layer].astype(self.dtype)
                out = cached_attention(q, keys, values, key_mask, index)
            new_kv = (k_cache, v_cache)
        return dense(out.reshape(b, t, -1), self.o_proj[...].astype(self.dtype).reshape(-1, h)), new_kv


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        h, i, std = config.hidden_size, config.intermediate_size, config.initializer_range
        self.gate_proj = param(rngs, (h, i), ("embed", "mlp"), param_dtype, std)
        self.up_proj = param(rngs, (h, i), ("embed", "mlp"), param_dtype, std)
        self.down_proj = param(rngs, (i, h), ("mlp", "embed"), param_dtype, std)
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        gate = dense(x, self.gate_proj[...].astype(self.dtype))
        up = dense(x, self.up_proj[...].astype(self.dtype))
        return dense(jax.nn.silu(gate) * up, self.down_proj[...].astype(self.dtype))
