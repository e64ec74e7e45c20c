"""Analytic FLOPs of a Qwen3 training step and this machine's matmul rate (f32 or bf16 operands): the yardstick the
train-step benchmarks report against (fraction of peak, and the best speed-up any framework could
show over a baseline running at a known fraction of that peak).

Per step (forward + backward = 3 x forward):
  6 * N * tokens, N = matmul parameters = layers * (q, k, v, o, gate, up, down) + LM head
                  (the embedding lookup is a gather, not a matmul)
  + attention: 3 * 2 * 2 * batch * layers * heads * head_dim * T(T+1)/2 (scores and weighted sum
                over the causal half only: the work a causal kernel has to do)
"""

from __future__ import annotations

import functools

DTYPES = {"f32": "float32", "bf16": "bfloat16"}  # the benchmarks' --dtype -> numpy dtype names (jax is imported lazily)


def qwen3_step_flops(hf: dict, batch: int, seq: int) -> tuple[float, float]:
    """(matmul parameter count N, FLOPs of one training step) for a Qwen3 config dict."""
    h, i, v, layers = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"], hf["num_hidden_layers"]
    q, kv, d = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]
    per_layer = h * q * d + 2 * h * kv * d + q * d * h + 3 * h * i
    n = layers * per_layer + h * v
    attention = 3 * 2 * 2 * batch * layers * q * d * seq * (seq + 1) / 2
    return n, 6 * n * batch * seq + attention


def forward_flops(hf: dict, seq: int, head_tokens: int) -> float:
    """FLOPs of one forward pass over one sequence of ``seq`` tokens whose LM head runs at ``head_tokens`` of them
    (the fused head only scores target positions), for any decoder we build (llama, qwen2, qwen3, qwen3_5).

    Counted: every projection and MLP matmul (2 * in * out per token); causal attention's scores and weighted sum
    over the causal half, 2 * 2 * heads * head_dim * seq(seq+1)/2 per layer; a Gated DeltaNet layer's delta rule in
    its recurrent form, 6 * key_dim * value_dim per value head per token (read the state at k, write the outer
    product, read it at q); the LM head, 2 * hidden * vocab per scored token. Not counted: norms, activations,
    RoPE, softmax, the depthwise conv (under 1% at every shape here): the usual "model FLOPs" of MFU."""
    h, i, v = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
    layers = hf["num_hidden_layers"]
    q, kv, d = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]
    types = hf.get("layer_types") or (
        [("full_attention" if (j + 1) % 4 == 0 else "linear_attention") for j in range(layers)]
        if hf["model_type"] in ("qwen3_5_text", "qwen3_5")
        else ["full_attention"] * layers
    )
    gate = 2 if hf.get("attn_output_gate") else 1  # Qwen3.5's q_proj also writes the output gate
    attention_params = h * q * d * gate + 2 * h * kv * d + q * d * h
    attention_mix = 2 * 2 * q * d * seq * (seq + 1) / 2
    per_token = 0.0
    mixing = 0.0
    for kind in types:
        per_token += 2 * 3 * h * i  # gate, up, down
        if kind == "full_attention":
            per_token += 2 * attention_params
            mixing += attention_mix
        else:
            nk, nv = hf["linear_num_key_heads"], hf["linear_num_value_heads"]
            dk, dv = hf["linear_key_head_dim"], hf["linear_value_head_dim"]
            projections = h * (2 * nk * dk + nv * dv) + h * nv * dv + 2 * h * nv + nv * dv * h  # qkv, z, b, a, out
            per_token += 2 * projections + 6 * nv * dk * dv
    return per_token * seq + mixing + 2 * h * v * head_tokens


def train_flops(hf: dict, seq: int, head_tokens: int) -> float:
    """A training step's FLOPs per sequence: forward and backward, 3 x the forward."""
    return 3 * forward_flops(hf, seq, head_tokens)


def matmul_runner(n: int = 2048, dtype: str = "f32"):
    """A blocking callable doing one jitted n^3 matmul (operands in dtype, f32 result), and its FLOPs."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(DTYPES[dtype])
    dot = jax.jit(functools.partial(jnp.dot, preferred_element_type=jnp.float32))
    dot(a, a).block_until_ready()
    return (lambda: dot(a, a).block_until_ready()), 2 * n**3


def qwen3_matmul_shapes(hf: dict, batch: int, seq: int) -> list[tuple[int, int, int]]:
    """(m, k, n) of every dense matmul in one training step, backward included: for each forward
    x[m,k] @ w[k,n], the backward's dx = dy[m,n] @ w^T and dw = x^T[k,m] @ dy. Projections and the
    LM head only: attention's batched products are left out, so timing these is a lower bound on
    any implementation's step time."""
    h, i, v, layers = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"], hf["num_hidden_layers"]
    q, kv, d = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]
    m = batch * seq
    forward = layers * [(m, h, q * d), (m, h, kv * d), (m, h, kv * d), (m, q * d, h), (m, h, i), (m, h, i), (m, i, h)]
    forward.append((m, h, v))
    return [s for m_, k, n in forward for s in ((m_, k, n), (m_, n, k), (k, m_, n))]


def matmul_floor_runner(shapes: list[tuple[int, int, int]], dtype: str = "f32"):
    """A blocking callable doing the given matmuls (operands in dtype, f32 results; one jitted program,
    every product kept), and their FLOPs: how fast this machine's XLA runs just the step's GEMMs at
    their own shapes."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.key(1), 2 * len(shapes))

    def normal(key, shape):
        return jax.random.normal(key, shape, jnp.float32).astype(DTYPES[dtype])

    operands = [(normal(keys[2 * j], (m, k)), normal(keys[2 * j + 1], (k, n))) for j, (m, k, n) in enumerate(shapes)]
    run = jax.jit(lambda ops: [jnp.matmul(a, b, preferred_element_type=jnp.float32) for a, b in ops])
    jax.block_until_ready(run(operands))
    return (lambda: jax.block_until_ready(run(operands))), sum(2 * m * k * n for m, k, n in shapes)
