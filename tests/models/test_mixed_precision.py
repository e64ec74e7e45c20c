"""Mixed precision (bf16 compute, f32 parameters) gradients: they run on XLA:CPU and follow f32's.

XLA:CPU runs bf16 dots only in some layouts and fails on others ("Unsupported element type for
DotThunk"), and which layout a dot gets depends on the shapes around it: one attention block or
several, an even or odd number of tokens. So each model is differentiated at such lengths.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from porch_jax.models import ModelConfig, init_model
from porch_jax.models.layers import causal_attention

QWEN3 = ModelConfig(
    model_type="qwen3",
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
)
QWEN3_5 = ModelConfig.from_hf(
    {
        "model_type": "qwen3_5_text",
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "layer_types": ["linear_attention", "full_attention"],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 4,
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.25},
    }
)
# (batch, length): one attention block and an odd token count; several blocks.
SHAPES = [(1, 13), (2, 150)]


def _assert_follows(f32: list, bf16: list) -> None:
    assert len(f32) == len(bf16)
    for a, b in zip(f32, bf16, strict=False):
        assert b.dtype == a.dtype
        a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
        assert np.all(np.isfinite(b))
        if np.linalg.norm(a) > 1e-6:
            cosine = a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
            assert cosine > 0.98, cosine


def _grads(config: ModelConfig, dtype, ids: jax.Array) -> dict:
    model = init_model(config, seed=3, dtype=dtype)

    def loss(m, ids):
        logp = jax.nn.log_softmax(m(ids[:, :-1]))
        return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1))

    return jax.tree.leaves(nnx.state(nnx.jit(nnx.grad(loss))(model, ids), nnx.Param))


@pytest.mark.parametrize("length", [32, 100], ids=["one_block", "two_blocks"])
def test_bf16_attention_gradients_run_and_follow_f32(length):
    rng = np.random.RandomState(1)
    q, k, v = (rng.randn(2, length, 2, *tail).astype(np.float32) for tail in ((2, 16), (16,), (16,)))
    weights = jnp.asarray(rng.randn(2, length, 2, 2, 16), jnp.float32)

    def grads(dtype):
        def loss(*qkv):
            return jnp.sum(causal_attention(*qkv).astype(jnp.float32) * weights)

        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*(jnp.asarray(x, dtype) for x in (q * 0.3, k, v)))

    _assert_follows(
        [g.astype(jnp.float32) for g in grads(jnp.float32)], [g.astype(jnp.float32) for g in grads(jnp.bfloat16)]
    )


@pytest.mark.parametrize("config", [QWEN3, QWEN3_5], ids=["qwen3", "qwen3_5"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_bf16_compute_gradients_run_and_follow_f32(config, shape):
    ids = jnp.asarray(np.random.RandomState(0).randint(0, config.vocab_size, shape), jnp.int32)
    f32, bf16 = _grads(config, jnp.float32, ids), _grads(config, jnp.bfloat16, ids)
    assert all(g.dtype == jnp.float32 for g in bf16)  # parameters (and so their gradients) stay f32
    _assert_follows(f32, bf16)


@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_5"])
def test_bf16_sampler_decodes_like_f32(tmp_path, model_type):
    """Prefill and decode in bf16 (another set of dot shapes, with the caches) run and mostly agree with f32."""
    from transformers import AutoTokenizer

    from porch_jax.models import from_pretrained
    from porch_jax.models.sampler import Sampler, SamplingParams
    from porch_jax.models.tiny import make_tiny_model

    folder = make_tiny_model(tmp_path, model_type, seed=3, vocab_size=320, initializer_range=0.3)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = [tokenizer(t)["input_ids"] for t in ("Find the invoice.", "Hi", "Delegate the search to a worker.")]
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    out = {}
    for name, dtype in (("f32", jnp.float32), ("bf16", jnp.bfloat16)):
        sampler = Sampler(
            from_pretrained(folder, dtype=dtype), tokenizer, max_len=64, prompt_buckets=(32,), batch_buckets=(4,)
        )
        out[name] = [c.token_ids for c in sampler.generate(prompts, params)]
    assert all(len(ids) == 12 for ids in out["bf16"])
    first = [a[0] == b[0] for a, b in zip(out["f32"], out["bf16"], strict=False)]
    assert sum(first) >= 2, out  # peaked logits: bf16 rounding rarely flips the first greedy token
