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
