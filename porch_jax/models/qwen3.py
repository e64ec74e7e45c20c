"""Qwen3 causal language model in Flax NNX, numerically matching transformers' Qwen3ForCausalLM."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from porch_jax.models.cache import KVCache
from porch_jax.models.config import ModelConfig, RopeScaling
from porch_jax.models.layers import MLP, Attention, RMSNorm, dense, param, rope_tables
from porch_jax.models.sharding import constrain

ACTIVATION_AXES = ("batch", None, None)  # [B, T, H] between layers

# Names of jax.checkpoint_policies accepted as `remat_policy`.
REMAT_POLICIES = (
    "nothing_saveable",
    "dots_saveable",
    "dots_with_no_batch_dims_saveable",
    "everything_saveable",
)


class DecoderLayer(nnx.Module):
    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, param_dtype=param_dtype)
        self.self_attn = Attention(config, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, param_dtype=param_dtype)
        self.mlp = MLP(config, rngs=rngs, dtype=dtype, param_dtype=param_dtype)

    def __call__(self, x, rope, *, attention_mask=None, segment_ids=None, kv_cache=None):
        h, new_kv = self.self_attn(
            self.input_layernorm(x), rope, attention_mask=attention_mask, segment_ids=segment_ids, kv_cache=kv_cache
        )
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x)), new_kv


def _run_layer(layer: DecoderLayer, x, rope, attention_mask, segment_ids):
    return layer(x, rope, attention_mask=attention_mask, segment_ids=segment_ids)[0]


def default_positions(
    batch: int,
    length: int,
    *,
    attention_mask: jax.Array | None,
    segment_ids: jax.Array | None,
    cache: KVCache | None,
    cache_index,
) -> jax.Array:
    """Positions when the caller gives none: arange when nothing is padded.

    Packed segments restart at 0; with a mask, a token's position counts the real tokens before it
    (including those already in the cache), so left padding does not shift positions.
    """
    idx = jnp.arange(length, dtype=jnp.int32)[None]
    if segment_ids is not None:
        starts = jnp.concatenate([jnp.ones((batch, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
        return idx - jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
    if cache is None and attention_mask is None:
        return jnp.broadcast_to(idx, (batch, length))
    mask = jnp.ones((batch, length), bool) if attention_mask is None else attention_mask
    before = 0
    if cache is not None:
        filled = jnp.arange(cache.max_len)[None] < cache_index
        before = jnp.sum(cache.mask & filled, axis=1, dtype=jnp.int32)[:, None]
    return jnp.maximum(before + jnp.cumsum(mask, axis=1, dtype=jnp.int32) - 1, 0)


def forward_rope(
    positions: jax.Array | None,
    batch: int,
    length: int,
    rotary_dim: int,
    theta: float,
    *,
    attention_mask: jax.Array | None,
    segment_ids: jax.Array | None,
    cache,
    cache_index,
    scaling: RopeScaling | None = None,
) -> tuple[jax.Array, jax.Array]:
    """RoPE tables of a forward pass: at the given positions, else at default_positions.

    Derived positions without a cache (training, scoring) are all < length, a static bound, so
    rope_tables gathers. With a cache, tables over every slot would cost a decode step more than they save.
    """
    if positions is not None:
        return rope_tables(positions, rotary_dim, theta, scaling=scaling)
    positions = default_positions(
        batch, length, attention_mask=attention_mask, segment_ids=segment_ids, cache=cache, cache_index=cache_index
    )
    return rope_tables(positions, rotary_dim, theta, length if cache is None else None, scaling)


class CausalLM(nnx.Module):
    """Logits from a subclass's `hidden_states` and `lm_head_kernel`: the one forward every model shares
    (trainers call the two halves directly so full [tokens, vocab] logits never need to exist)."""

    norm_class: type[nnx.Module]  # the final norm, built as norm_class(hidden_size, eps, param_dtype=...)

    def __init__(
        self,
        config: ModelConfig,
        *,
        rngs: nnx.Rngs,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        remat: bool = False,
        remat_policy: str = "nothing_saveable",
    ):
        """dtype is the compute dtype, param_dtype the storage dtype; norms, softmax and logits are float32
        regardless. remat recomputes each layer in the backward pass (`remat_policy` names a
        jax.checkpoint_policies member). Parameters are drawn in a fixed order (embedding, layers, head), so a
        seed always gives the same model."""
        if remat_policy not in REMAT_POLICIES:
            raise ValueError(f"remat_policy {remat_policy!r} not in {REMAT_POLICIES}")
        h, std = config.hidden_size, config.initializer_range
        self.config = config
        self.dtype, self.param_dtype = dtype, param_dtype
        self.remat, self.remat_policy = remat, remat_policy
        self.embed_tokens = param(rngs, (config.vocab_size, h), ("vocab", "embed"), param_dtype, std)
        self.layers = nnx.List(self.make_layer(i, rngs=rngs) for i in range(config.num_hidden_layers))
        self.norm = self.norm_class(h, config.rms_norm_eps, param_dtype=param_dtype)
        if not config.tie_word_embeddings:
            self.lm_head = param(rngs, (h, config.vocab_size), ("embed", "vocab"), param_dtype, std)

    def make_layer(self, index: int, *, rngs: nnx.Rngs) -> nnx.Module:
        """Decoder layer `index` (config, dtype and param_dtype are set when this is called)."""
        raise NotImplementedError

    def __call__(
        self,
        input_ids: jax.Array,
        *,
        positions: jax.Array | None = None,
        attention_mask: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        cache: Any = None,
        cache_index=None,
    ) -> jax.Array | tuple[jax.Array, Any]:
        """Logits [B, T, V] in float32 (and the updated cache when one is given)."""
        out = self.hidden_states(
            input_ids,
            positions=positions,
            attention_mask=attention_mask,
            segment_ids=segment_ids,
            cache=cache,
            cache_index=cache_index,
        )
        hidden, new_cache = out if cache is not None else (out, None)
        logits = dense(hidden, self.lm_head_kernel().astype(self.dtype), jnp.float32)
        return logits if cache is None else (logits, new_cache)

    # FSDP layouts: a weight split over 'fsdp' along the hidden dim is gathered over it where it is used, as
    # the layers' matrices are. Used as stored, a lookup in the table (or a product with the head) leaves
    # activations split along the hidden dim, and moving them back to rows split over the batch axes is a
    # reshard GSPMD and Shardy can only do by replicating the whole activation ("Involuntary full
    # rematerialization"; tests/train/test_step.py counts them).

    def embed(self, input_ids: jax.Array) -> jax.Array:
        """Token embeddings [B, T, H] in the compute dtype, rows over the batch axes."""
        table = constrain(self.embed_tokens[...], ("vocab", None))
        return constrain(jnp.take(table, input_ids, axis=0).astype(self.dtype), ACTIVATION_AXES)

    def lm_head_kernel(self) -> jax.Array:
        """The output projection [H, V] (the embedding transposed when tied)."""
        w = self.embed_tokens[...].T if self.config.tie_word_embeddings else self.lm_head[...]
        return constrain(w, (None, "vocab"))


class Qwen3ForCausalLM(CausalLM):
    """Decoder-only Qwen3, and through the config's `qk_norm` / `qkv_bias` / `rope_scaling` also Llama
    (Llama 3.x scaled RoPE included) and Qwen2. See docs/CONTRACTS.md for the call signature."""

    norm_class = RMSNorm

    def make_layer(self, index: int, *, rngs: nnx.Rngs) -> nnx.Module:
        return DecoderLayer(self.config, rngs=rngs, dtype=self.dtype, param_dtype=self.param_dtype)

    def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> KVCache:
        """An empty cache of max_len slots per row (what `cache=` takes)."""
        return KVCache.init(self.config, batch, max_len, dtype)

    def hidden_states(
        self,
        input_ids: jax.Array,
        *,
        positions: jax.Array | None = None,
        attention_mask: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        cache: KVCache | None = None,
        cache_index=None,
    ) -> jax.Array | tuple[jax.Array, KVCache]:
        """Final-normed hidden states [B, T, H] (and the updated cache when one is given)."""
        b, t = input_ids.shape
        if cache is not None:
            if cache_index is None:
                raise ValueError("cache_index is required with a cache")
            if segment_ids is not None:
                raise ValueError("segment_ids (packing) cannot be combined with a KV cache")
        rope = forward_rope(
            positions,
            b,
            t,
            self.config.head_dim,
            self.config.rope_theta,
            attention_mask=attention_mask,
            segment_ids=segment_ids,
            cache=cache,
            cache_index=cache_index,
            scaling=self.config.rope_scaling,
        )
        x = self.embed(input_ids)

        if cache is None:
            run = _run_layer
            if self.remat:
                run = nnx.remat(run, policy=getattr(jax.checkpoint_policies, self.remat_policy))
            for layer in self.layers:
                x = constrain(run(layer, x, rope, attention_mask, segment_ids), ACTIVATION_AXES)
            return self.norm(x)

        new_mask = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
        key_mask = jax.lax.dynamic_update_slice(cache.mask, new_mask, (0, cache_index))
        k, v = cache.k, cache.v
        for i, layer in enumerate(self.layers):
            x, (k, v) = layer(x, rope, kv_cache=(k, v, i, key_mask, cache_index))
            x = constrain(x, ACTIVATION_AXES)
        return self.norm(x), KVCache(k=k, v=v, mask=key_mask)
