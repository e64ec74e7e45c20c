"""Qwen3 numerics against transformers' PyTorch model, padding, packing, KV cache, remat."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is in the test extra (torch==2.13.0); scripts/test.sh installs it")
from transformers import Qwen3Config
from transformers import Qwen3ForCausalLM as TorchQwen3

from porch_jax.models import (
    MODEL_SPECS,
    KVCache,
    ModelConfig,
    from_pretrained,
    init_model,
)
from porch_jax.models.layers import causal_attention, dense, rope_tables

# tied/untied embeddings, 1 and 2 kv heads with different q-head counts, head_dim not a power of 2.
CONFIGS = {
    "untied_gqa2_hd24": {
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 24,
        "tie_word_embeddings": False,
    },
    "tied_mqa_hd40": {"num_attention_heads": 6, "num_key_value_heads": 1, "head_dim": 40, "tie_word_embeddings": True},
    "tied_gqa2_hd16": {"num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16, "tie_word_embeddings": True},
}
VOCAB = 97


def torch_folder(tmp_path_factory, name: str, **overrides) -> tuple:
    """A random transformers Qwen3 saved to a folder; returns (folder, torch model)."""
    torch.manual_seed(0)
    kwargs = {
        "vocab_size": VOCAB,
        "hidden_size": 48,
        "intermediate_size": 80,
        "num_hidden_layers": 2,
        "rope_theta": 10_000.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 512,
    }
    hf = TorchQwen3(Qwen3Config(**(kwargs | overrides))).eval()
    with torch.no_grad():  # non-trivial norm weights, so a mis-mapped norm shows
        for name_, p in hf.named_parameters():
            if "norm" in name_:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp(name)
    hf.save_pretrained(folder)
    return folder, hf


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request, tmp_path_factory):
    folder, hf = torch_folder(tmp_path_factory, request.param, **CONFIGS[request.param])
    return from_pretrained(folder), hf


_forward = jax.jit(lambda model, ids, kwargs: model(ids, **kwargs))


def forward(model, ids, **kwargs) -> np.ndarray:
    """Jitted logits: one compile per shape is cheaper than op-by-op dispatch."""
    return np.asarray(_forward(model, jnp.asarray(ids, jnp.int32), {k: jnp.asarray(v) for k, v in kwargs.items()}))


def torch_logits(hf, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor(np.asarray(ids), dtype=torch.long)).logits.numpy()


def test_logits_match_transformers(pair):
    model, hf = pair
    ids = np.random.RandomState(1).randint(0, VOCAB, (2, 150))  # > one attention block, not a multiple
    logits = forward(model, ids)
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits, torch_logits(hf, ids), atol=1e-4, rtol=0)


def test_gradients_match_transformers(pair):
    """Every parameter's gradient, so the hand-written backward passes are checked end to end."""
    from flax import nnx

    model, hf = pair
    rng = np.random.RandomState(7)
    ids = rng.randint(0, VOCAB, (2, 70))
    weights = rng.randn(2, 70, VOCAB).astype(np.float32)
    grads = jax.jit(nnx.grad(lambda m: jnp.sum(m(jnp.asarray(ids)) * weights)))(model)
    hf.zero_grad()
    (hf(torch.tensor(ids)).logits * torch.tensor(weights)).sum().backward()
    expected = {name: p.grad.numpy() for name, p in hf.named_parameters()}
    for path, grad in nnx.to_flat_state(grads):
        name = ".".join(map(str, path))
        hf_name, rule = next(
            (r.match(name, hf=False), r) for r in MODEL_SPECS["qwen3"].weights if r.match(name, hf=False)
        )
        want = expected[hf_name]
        np.testing.assert_allclose(
            rule.to_hf(np.asarray(grad[...])), want, atol=1e-4 * np.abs(want).max(), err_msg=name
        )


def test_padding_matches_unpadded_rows(pair):
    model, hf = pair
    rng = np.random.RandomState(2)
    lengths, t = [9, 4, 7], 9
    ids = rng.randint(0, VOCAB, (3, t))
    mask = np.arange(t)[None] < np.array(lengths)[:, None]  # right padding
    ids_left = np.stack([np.roll(r, t - n) for r, n in zip(ids, lengths, strict=False)])
    mask_left = np.stack([np.roll(m, t - n) for m, n in zip(mask, lengths, strict=False)])
    right = forward(model, ids, attention_mask=mask)
    left = forward(model, ids_left, attention_mask=mask_left)
    for row, n in enumerate(lengths):
        want = torch_logits(hf, ids[row : row + 1, :n])[0]
        np.testing.assert_allclose(right[row, :n], want, atol=1e-4, rtol=0)
        np.testing.assert_allclose(left[row, t - n :], want, atol=1e-4, rtol=0)


def test_packed_segments_match_separate_sequences(pair):
    model, hf = pair
    rng = np.random.RandomState(3)
    lengths = [5, 8, 3]
    seqs = [rng.randint(0, VOCAB, n) for n in lengths]
    ids = np.concatenate(seqs + [np.zeros(2, int)])[None]  # two pad tokens (segment 0) at the end
    segments = np.concatenate([np.full(n, i + 1) for i, n in enumerate(lengths)] + [np.zeros(2, int)])[None]
    positions = np.concatenate([np.arange(n) for n in lengths] + [np.zeros(2, int)])[None]
    explicit = forward(model, ids, positions=positions, segment_ids=segments)
    default = forward(model, ids, segment_ids=segments)
    start = 0
    for seq in seqs:
        want = torch_logits(hf, seq[None])[0]
        np.testing.assert_allclose(explicit[0, start : start + len(seq)], want, atol=1e-4, rtol=0)
        np.testing.assert_allclose(default[0, start : start + len(seq)], want, atol=1e-4, rtol=0)
        start += len(seq)


def test_cached_decode_matches_full_forward_with_left_padding(pair):
    model, _ = pair
    rng = np.random.RandomState(4)
    prompt_lens, prompt_t, steps = [6, 3], 6, 5
    rows = rng.randint(0, VOCAB, (2, prompt_t + steps))  # row i uses its first n_i + steps tokens
    full = forward(model, rows)  # causal: the unused tail of a row changes nothing before it

    prompt = np.zeros((2, prompt_t), int)
    mask = np.zeros((2, prompt_t), bool)
    for i, (r, n) in enumerate(zip(rows, prompt_lens, strict=False)):
        prompt[i, prompt_t - n :], mask[i, prompt_t - n :] = r[:n], True
    step = jax.jit(lambda m, ids, c, i, am: m(ids, attention_mask=am, cache=c, cache_index=i))
    cache = KVCache.init(model.config, batch=2, max_len=16)
    logits, cache = step(model, jnp.asarray(prompt), cache, 0, jnp.asarray(mask))
    for i, n in enumerate(prompt_lens):
        np.testing.assert_allclose(np.asarray(logits)[i, prompt_t - n :], full[i][:n], atol=1e-4, rtol=0)
    for s in range(steps):
        tok = np.array([[r[n + s]] for r, n in zip(rows, prompt_lens, strict=False)])
        logits, cache = step(model, jnp.asarray(tok), cache, prompt_t + s, jnp.ones((2, 1), bool))
        for i, n in enumerate(prompt_lens):
            np.testing.assert_allclose(np.asarray(logits)[i, 0], full[i][n + s], atol=1e-4, rtol=0)
    assert cache.mask.sum() == sum(prompt_lens) + 2 * steps


TINY = ModelConfig(
    model_type="qwen3",
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
)


def loss_and_grads(model, ids):
    from flax import nnx

    def loss(m):
        logp = jax.nn.log_softmax(m(ids[:, :-1]))
        return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1))

    return jax.jit(nnx.value_and_grad(loss))(model)


def test_remat_gives_same_gradients():
    ids = jnp.asarray(np.random.RandomState(5).randint(0, 64, (2, 20)))
    plain_loss, plain = loss_and_grads(init_model(TINY, seed=3), ids)
    remat_loss, remat = loss_and_grads(init_model(TINY, seed=3, remat=True, remat_policy="dots_saveable"), ids)
    np.testing.assert_allclose(plain_loss, remat_loss, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), plain, remat)


def test_embedding_gradient_is_a_scatter_not_a_one_hot_matmul():
    from flax import nnx

    ids = jnp.zeros((1, 8), jnp.int32)
    weights = jnp.ones((1, 8, TINY.vocab_size))  # a loss with no gather of its own
    grad = nnx.grad(lambda m: jnp.sum(m(ids) * weights))
    jaxpr = str(jax.make_jaxpr(grad)(init_model(TINY)))
    assert "scatter-add" in jaxpr  # the transpose of the embedding gather


def test_bf16_params_and_compute_stay_close_to_fp32():
    ids = jnp.asarray(np.random.RandomState(6).randint(0, 64, (2, 12)))
    f32 = forward(init_model(TINY, seed=1), ids)
    bf16 = forward(init_model(TINY, seed=1, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16), ids)
    assert bf16.dtype == np.float32
    np.testing.assert_allclose(bf16, f32, atol=2e-2)


def dense_attention(q, k, v, mask, segments):
    """Reference: a plain dense masked softmax over all keys, differentiated by JAX."""
    t = q.shape[1]
    scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k, precision="highest")
    visible = jnp.tril(jnp.ones((t, t), bool))[None] & mask[:, None, :] & (segments[:, :, None] == segments[:, None, :])
    probs = jax.nn.softmax(jnp.where(visible[:, None, None], scores, -1e30), axis=-1)
    return jnp.einsum("bkgqs,bskd->bqkgd", probs, v, precision="highest")


@pytest.mark.parametrize("t,block", [(37, 8), (16, 16), (5, 64)])
def test_blockwise_attention_and_its_gradients_equal_dense(t, block):
    rng = np.random.RandomState(t)
    q = jnp.asarray(rng.randn(2, t, 2, 3, 8), jnp.float32)
    k, v = jnp.asarray(rng.randn(2, 2, t, 2, 8), jnp.float32)
    mask = jnp.asarray(rng.rand(2, t) > 0.2)
    segments = jnp.asarray(np.sort(rng.randint(1, 4, (2, t)), axis=1))
    # Loss weights vanish on pad queries: their outputs are undefined (they may see no key at all).
    weights = jnp.asarray(rng.randn(2, t, 2, 3, 8), jnp.float32) * mask[:, :, None, None, None]

    def loss(attend, *qkv):
        return jnp.sum(attend(*qkv) * weights)

    def ours(q, k, v):
        return causal_attention(q, k, v, attention_mask=mask, segment_ids=segments, block=block)

    def ref(q, k, v):
        return dense_attention(q, k, v, mask, segments)

    got = jax.jit(jax.value_and_grad(functools.partial(loss, ours), argnums=(0, 1, 2)))(q, k, v)
    want = jax.jit(jax.value_and_grad(functools.partial(loss, ref), argnums=(0, 1, 2)))(q, k, v)
    np.testing.assert_allclose(np.asarray(ours(q, k, v))[mask], np.asarray(ref(q, k, v))[mask], atol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4), got, want)


@pytest.mark.parametrize("shape", [(16, 24), (24, 16)])  # both backward layouts of `dense`
def test_dense_gradients_equal_plain_matmul(shape):
    rng = np.random.RandomState(0)
    x = jnp.asarray(rng.randn(2, 5, shape[0]), jnp.float32)
    w = jnp.asarray(rng.randn(*shape), jnp.float32)
    dy = jnp.asarray(rng.randn(2, 5, shape[1]), jnp.float32)
    got = jax.vjp(dense, x, w)[1](dy)
    want = jax.vjp(lambda x, w: jnp.matmul(x, w, precision="highest"), x, w)[1](dy)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4), got, want)


@pytest.mark.parametrize("theta", [10_000.0, 10_000_000.0])
def test_rope_tables_gathered_per_position_equal_direct(theta):
    """The model's own positions take the gathered tables (rope_tables' num_positions); given positions, the direct."""
    positions = jnp.asarray(
        [[0, 1, 2, 3, 0, 1, 2, 0], [5, 6, 7, 7, 7, 8, 9, 10]], jnp.int32
    )  # packing, padding, offset
    gathered = rope_tables(positions, 24, theta, num_positions=11)
    direct = rope_tables(positions, 24, theta)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6), gathered, direct)


def test_default_positions_equal_explicit_ones(pair):
    model, _ = pair
    ids = np.random.RandomState(2).randint(0, VOCAB, (2, 9))
    explicit = np.broadcast_to(np.arange(9, dtype=np.int32), (2, 9))
    np.testing.assert_allclose(forward(model, ids), forward(model, ids, positions=explicit), atol=1e-6)
