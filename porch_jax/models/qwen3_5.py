"""Qwen3.5 hybrid text model in Flax NNX, numerically matching transformers' Qwen3_5ForCausalLM.

Layer i is full (gated) attention when config.layer_types says so (every 4th by default), else a
Gated DeltaNet. Differences from Qwen3 that matter numerically: zero-centred RMSNorms (scale
1 + w), a sigmoid output gate packed per head into q_proj ([query | gate]), RoPE on the first
quarter of each head only, and the DeltaNet core in float32 (see deltanet.py).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx, struct

from porch_jax.models import deltanet
from porch_jax.models.config import ModelConfig
from porch_jax.models.layers import (
    MLP,
    apply_rope,
    cached_attention,
    causal_attention,
    dense,
    fresh_prefill,
    param,
    rms_norm,
)
from porch_jax.models.qwen3 import (
    ACTIVATION_AXES,
    CausalLM,
    forward_rope,
)
from porch_jax.models.sharding import constrain

FULL_ATTENTION, LINEAR_ATTENTION = "full_attention", "linear_attention"


@struct.dataclass
class HybridCache:
    """Decoding state: KV for the attention layers, conv inputs and delta-rule state for the DeltaNets.

    k/v/mask follow KVCache (one shared write index, left-padded prompts). The DeltaNet state is
    position-free: it has absorbed every real token so far, so only the attention layers use slots.
    """

    k: jax.Array  # [attention layers, batch, kv_heads, max_len, head_dim] (heads-major, as KVCache)
    v: jax.Array  # [attention layers, batch, kv_heads, max_len, head_dim]
    mask: jax.Array  # bool [batch, max_len]: True where the slot holds a real token
    conv: jax.Array  # [deltanet layers, batch, kernel - 1, conv channels]: the last inputs
    state: jax.Array  # float32 [deltanet layers, batch, value heads, key dim, value dim]

    @property
    def max_len(self) -> int:
        return self.mask.shape[1]


class ZeroCenteredRMSNorm(nnx.Module):
    """RMSNorm scaled by (1 + w), w initialised to 0; computed in float32."""

    def __init__(self, dim: int, eps: float, *, param_dtype=jnp.float32):
        self.weight = nnx.Param(jnp.zeros((dim,), param_dtype), out_sharding=("norm",), eager_sharding=False)
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, 1.0 + self.weight[...].astype(jnp.float32), self.eps)


class GatedRMSNorm(nnx.Module):
    """RMSNorm(x) * w * silu(gate): the DeltaNet output norm (plain scale w, initialised to 1)."""

    def __init__(self, dim: int, eps: float, *, param_dtype=jnp.float32):
        self.weight = param(None, (dim,), ("norm",), param_dtype, 0.0)
        self.eps = eps

    def __call__(self, x: jax.Array, gate: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)).astype(x.dtype)
        out = self.weight[...].astype(jnp.float32) * normed.astype(jnp.float32) * jax.nn.silu(gate.astype(jnp.float32))
        return out.astype(x.dtype)


def _partial_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """RoPE on the first cos.shape[-1] features of each head; the rest pass through."""
    rotary = cos.shape[-1]
    return jnp.concatenate([apply_rope(x[..., :rotary], cos, sin), x[..., rotary:]], axis=-1)


class GatedAttention(nnx.Module):
    """GQA attention with zero-centred q/k norms, partial RoPE and a sigmoid output gate."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        h, n, kv, d = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
        std = config.initializer_range
        # Per head: d query features, then d gate features (HF's q_proj layout).
        self.q_proj = param(rngs, (h, n, 2 * d), ("embed", "heads", "head_dim"), param_dtype, std)
        self.k_proj = param(rngs, (h, kv, d), ("embed", "kv_heads", "head_dim"), param_dtype, std)
        self.v_proj = param(rngs, (h, kv, d), ("embed", "kv_heads", "head_dim"), param_dtype, std)
        self.o_proj = param(rngs, (n, d, h), ("heads", "head_dim", "embed"), param_dtype, std)
        self.q_norm = ZeroCenteredRMSNorm(d, config.rms_norm_eps, param_dtype=param_dtype)
        self.k_norm = ZeroCenteredRMSNorm(d, config.rms_norm_eps, param_dtype=param_dtype)
        self.num_kv_heads, self.num_groups, self.head_dim = kv, config.num_groups, d
        self.dtype = dtype

    def __call__(self, x, rope, *, attention_mask, segment_ids, kv_cache=None):
        """As layers.Attention: kv_cache is (k, v of all attention layers, slot, key_mask, index)."""
        b, t, h = x.shape
        cos, sin = rope
        query_gate, k, v = (
            dense(x, w[...].astype(self.dtype).reshape(h, -1)).reshape(b, t, -1, d)
            for w, d in ((self.q_proj, 2 * self.head_dim), (self.k_proj, self.head_dim), (self.v_proj, self.head_dim))
        )
        q, gate = query_gate[..., : self.head_dim], query_gate[..., self.head_dim :]
        q = _partial_rope(self.q_norm(q), cos, sin) * jnp.asarray(1.0 / math.sqrt(self.head_dim), self.dtype)
        k = _partial_rope(self.k_norm(k), cos, sin)
        q = q.reshape(b, t, self.num_kv_heads, self.num_groups, self.head_dim)
        if kv_cache is None:
            out = causal_attention(q, k, v, attention_mask=attention_mask, segment_ids=segment_ids)
            new_kv = None
        else:
            k_cache, v_cache, slot, key_mask, index = kv_cache
            start = (slot, 0, 0, index, 0)
            k_cache = jax.lax.dynamic_update_slice(k_cache, jnp.swapaxes(k, 1, 2).astype(k_cache.dtype)[None], start)
            v_cache = jax.lax.dynamic_update_slice(v_cache, jnp.swapaxes(v, 1, 2).astype(v_cache.dtype)[None], start)
            if fresh_prefill(t, index):  # nothing cached before this chunk: blockwise causal within it
                out = causal_attention(q, k, v, attention_mask=key_mask[:, :t], segment_ids=None)
            else:
                out = cached_attention(
                    q, k_cache[slot].astype(self.dtype), v_cache[slot].astype(self.dtype), key_mask, index
                )
            new_kv = (k_cache, v_cache)
        out = (out.reshape(b, t, -1, self.head_dim) * jax.nn.sigmoid(gate)).reshape(b, t, -1)
        return dense(out, self.o_proj[...].astype(self.dtype).reshape(-1, h)), new_kv


class GatedDeltaNet(nnx.Module):
    """Linear-attention token mixer: conv -> gated delta rule -> gated RMSNorm -> out_proj.

    Key heads are shared by consecutive value heads (value head j reads key head j // ratio).
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        h, std = config.hidden_size, config.initializer_range
        nk, nv = config.linear_num_key_heads, config.linear_num_value_heads
        dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
        channels = 2 * nk * dk + nv * dv  # [q | k | v] before the convolution
        # The fused projection and conv stay replicated on 'tensor': q, k and v boundaries do not
        # fall on shard boundaries. Everything per value head shards like attention heads.
        self.in_proj_qkv = param(rngs, (h, channels), ("embed", "linear_conv"), param_dtype, std)
        self.in_proj_z = param(rngs, (h, nv, dv), ("embed", "linear_heads", "head_dim"), param_dtype, std)
        self.in_proj_b = param(rngs, (h, nv), ("embed", "linear_heads"), param_dtype, std)
        self.in_proj_a = param(rngs, (h, nv), ("embed", "linear_heads"), param_dtype, std)
        self.conv1d = param(  # HF's Conv1d weight layout [channels, 1, kernel]
            rngs, (channels, 1, config.linear_conv_kernel_dim), ("linear_conv", None, None), param_dtype, std
        )
        self.dt_bias = nnx.Param(jnp.ones((nv,), param_dtype), out_sharding=("linear_heads",), eager_sharding=False)
        a = jax.random.uniform(rngs.params(), (nv,), jnp.float32, 0.01, 16.0)  # HF's A init
        self.A_log = nnx.Param(jnp.log(a).astype(param_dtype), out_sharding=("linear_heads",), eager_sharding=False)
        self.norm = GatedRMSNorm(dv, config.rms_norm_eps, param_dtype=param_dtype)
        self.out_proj = param(rngs, (nv, dv, h), ("linear_heads", "head_dim", "embed"), param_dtype, std)
        self.num_k_heads, self.num_v_heads, self.key_dim, self.value_dim = nk, nv, dk, dv
        self.dtype = dtype

    def __call__(
        self,
        x: jax.Array,
        *,
        mask: jax.Array | None,
        segment_ids: jax.Array | None,
        state: tuple[jax.Array, jax.Array] | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """x [B, T, H]; mask bool [B, T] (False = pad: contributes nothing, state passes through);
        state (conv inputs [B, K-1, C], delta-rule state [B, Hv, Dk, Dv]) or None.

        Returns the output and, with a state, the updated state. T = 1 with a state runs the
        recurrent form (decoding), anything else `deltanet.gated_delta_rule`.
        """
        b, t, h = x.shape
        nk, nv, dk, dv = self.num_k_heads, self.num_v_heads, self.key_dim, self.value_dim
        if mask is not None:
            x = x * mask[..., None].astype(x.dtype)  # as HF: pads project (and convolve) to zero
        mixed, z, b_logits, a_logits = (
            dense(x, w[...].astype(self.dtype).reshape(h, -1))
            for w in (self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)
        )
        z = z.reshape(b, t, nv, dv)

        conv_state, rule_state = (None, None) if state is None else state
        mixed, conv_state = deltanet.causal_conv1d(
            mixed, self.conv1d[...][:, 0].astype(self.dtype), state=conv_state, segment_ids=segment_ids
        )
        q = mixed[..., : nk * dk].reshape(b, t, nk, dk)
        k = mixed[..., nk * dk : 2 * nk * dk].reshape(b, t, nk, dk)
        v = mixed[..., 2 * nk * dk :].reshape(b, t, nv, dv)
        q = deltanet.l2norm(q.astype(jnp.float32)) * (dk**-0.5)  # per key head: the rule groups value heads
        k = deltanet.l2norm(k.astype(jnp.float32))
        beta = jax.nn.sigmoid(b_logits)
        decay = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(
            a_logits.astype(jnp.float32) + self.dt_bias[...].astype(jnp.float32)
        )
        if mask is not None:  # a pad neither decays nor writes the state
            beta = jnp.where(mask[..., None], beta, 0)
            decay = jnp.where(mask[..., None], decay, 0)
        rule = deltanet.recurrent_gated_delta_rule if state is not None and t == 1 else deltanet.gated_delta_rule
        out, rule_state = rule(q, k, v, decay, beta, initial_state=rule_state, segment_ids=segment_ids)
        out = self.norm(out.astype(self.dtype), z).reshape(b, t, -1)
        out = dense(out, self.out_proj[...].astype(self.dtype).reshape(-1, h))
        return out, None if state is None else (conv_state, rule_state)


class DecoderLayer(nnx.Module):
    def __init__(self, config: ModelConfig, layer_type: str, *, rngs: nnx.Rngs, dtype, param_dtype):
        eps, h = config.rms_norm_eps, config.hidden_size
        self.layer_type = layer_type
        self.input_layernorm = ZeroCenteredRMSNorm(h, eps, param_dtype=param_dtype)
        if layer_type == FULL_ATTENTION:
            self.self_attn = GatedAttention(config, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        else:
            self.linear_attn = GatedDeltaNet(config, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(h, eps, param_dtype=param_dtype)
        self.mlp = MLP(config, rngs=rngs, dtype=dtype, param_dtype=param_dtype)

    def __call__(self, x, rope, *, attention_mask=None, segment_ids=None, cache=None):
        """cache: the attention layer's kv_cache tuple, or the DeltaNet's (conv, state) pair."""
        normed = self.input_layernorm(x)
        if self.layer_type == FULL_ATTENTION:
            h, new_cache = self.self_attn(
                normed, rope, attention_mask=attention_mask, segment_ids=segment_ids, kv_cache=cache
            )
        else:
            mask = attention_mask
            if segment_ids is not None:
                mask = (segment_ids != 0) if mask is None else mask & (segment_ids != 0)
            h, new_cache = self.linear_attn(normed, mask=mask, segment_ids=segment_ids, state=cache)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x)), new_cache


def _run_layer(layer: DecoderLayer, x, rope, attention_mask, segment_ids):
    return layer(x, rope, attention_mask=attention_mask, segment_ids=segment_ids)[0]


class Qwen3_5ForCausalLM(CausalLM):
    """Decoder-only Qwen3.5 (text). Same constructor and call signature as Qwen3ForCausalLM
    (docs/CONTRACTS.md); its cache is a `HybridCache` from `init_cache`."""

    norm_class = ZeroCenteredRMSNorm

    def __init__(self, config: ModelConfig, **kwargs):
        super().__init__(config, **kwargs)
        # Each layer's index among the layers of its kind: its slot in the cache arrays.
        kinds = config.layer_types
        self.cache_slots = tuple(kinds[:i].count(kind) for i, kind in enumerate(kinds))

    def make_layer(self, index: int, *, rngs: nnx.Rngs) -> nnx.Module:
        return DecoderLayer(
            self.config, self.config.layer_types[index], rngs=rngs, dtype=self.dtype, param_dtype=self.param_dtype
        )

    def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> HybridCache:
        """An empty cache; the delta-rule state is float32 whatever `dtype` (as in transformers)."""
        c = self.config
        attention = c.layer_types.count(FULL_ATTENTION)
        linear = len(c.layer_types) - attention
        kv_shape = (attention, batch, c.num_key_value_heads, max_len, c.head_dim)
        channels = (
            2 * c.linear_num_key_heads * c.linear_key_head_dim + c.linear_num_value_heads * c.linear_value_head_dim
        )
        return HybridCache(
            k=jnp.zeros(kv_shape, dtype),
            v=jnp.zeros(kv_shape, dtype),
            mask=jnp.zeros((batch, max_len), bool),
            conv=jnp.zeros((linear, batch, c.linear_conv_kernel_dim - 1, channels), dtype),
            state=jnp.zeros(
                (linear, batch, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim), jnp.float32
            ),
        )

    def hidden_states(
        self,
        input_ids: jax.Array,
        *,
        positions: jax.Array | None = None,
        attention_mask: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        cache: HybridCache | None = None,
        cache_index=None,
    ) -> jax.Array | tuple[jax.Array, HybridCache]:
        """Final-normed hidden states [B, T, H] (and the updated cache when one is given)."""
        b, t = input_ids.shape
        if cache is not None:
            if cache_index is None:
                raise ValueError("cache_index is required with a cache")
            if segment_ids is not None:
                raise ValueError("segment_ids (packing) cannot be combined with a cache")
        rotary = int(self.config.head_dim * self.config.partial_rotary_factor)
        rope = forward_rope(
            positions,
            b,
            t,
            rotary,
            self.config.rope_theta,
            attention_mask=attention_mask,
            segment_ids=segment_ids,
            cache=cache,
            cache_index=cache_index,
        )
        x = self.embed(input_ids)
        if attention_mask is not None:
            attention_mask = attention_mask.astype(bool)

        if cache is None:
            run = _run_layer
            if self.remat:
                run = nnx.remat(run, policy=getattr(jax.checkpoint_policies, self.remat_policy))
            for layer in self.layers:
                x = constrain(run(layer, x, rope, attention_mask, segment_ids), ACTIVATION_AXES)
            return self.norm(x)

        new_mask = jnp.ones((b, t), bool) if attention_mask is None else attention_mask
        key_mask = jax.lax.dynamic_update_slice(cache.mask, new_mask, (0, cache_index))
        k, v, conv, state = cache.k, cache.v, cache.conv, cache.state
        for layer, slot in zip(self.layers, self.cache_slots, strict=False):
            if layer.layer_type == FULL_ATTENTION:
                x, (k, v) = layer(x, rope, cache=(k, v, slot, key_mask, cache_index))
            else:
                x, (conv_n, state_n) = layer(x, rope, attention_mask=attention_mask, cache=(conv[slot], state[slot]))
                conv, state = conv.at[slot].set(conv_n.astype(conv.dtype)), state.at[slot].set(state_n)
            x = constrain(x, ACTIVATION_AXES)
        return self.norm(x), HybridCache(k=k, v=v, mask=key_mask, conv=conv, state=state)
