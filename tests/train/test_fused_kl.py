"""Chunked fused LM-head kernels equal the unchunked losses, in value and gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from porch_jax.train import fused_kl, losses

TOL = {"rtol": 1e-5, "atol": 1e-5}
N, H, V = 37, 8, 29  # 37 is prime: no chunk size below it divides it


def make(seed: int = 0, n: int = N, h: int = H, v: int = V, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    sh = rng.normal(size=(n, h))
    th = rng.normal(size=(n, h))
    sw = rng.normal(size=(h, v)) * 0.7
    tw = rng.normal(size=(h, v)) * 0.7
    mask = (rng.random(n) < 0.7).astype(np.float32)
    mask[:3] = 0.0
    targets = rng.integers(0, v, n)
    arrays = [jnp.asarray(x, dtype) for x in (sh, sw, th, tw)]
    return arrays + [jnp.asarray(mask), jnp.asarray(targets)]


def unchunked_kl(sh, sw, th, tw, mask):
    kl = losses.token_reverse_kl(sh @ sw, th @ tw)
    return jnp.sum(mask * kl), jnp.sum(mask)


def vg(fn, argnums=(0, 1)):
    """jit(value_and_grad) of a function returning (sum, count): one compile, no eager dispatch."""
    return jax.jit(jax.value_and_grad(fn, argnums=argnums, has_aux=True))


def close(a, b, tol=TOL):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), **tol)


# ------------------------------------------------------------------------------- reverse KL


@pytest.mark.parametrize("grad_in_forward", [True, False])
@pytest.mark.parametrize("chunk_size", [1, 5, N, 64, None])
def test_chunked_reverse_kl_equals_unchunked(chunk_size, grad_in_forward):
    sh, sw, th, tw, mask, _ = make()

    def chunked(sh, sw, th, tw):
        return fused_kl.chunked_reverse_kl(sh, sw, th, tw, mask, chunk_size=chunk_size, grad_in_forward=grad_in_forward)

    (s, c), g_got = vg(chunked, (0, 1, 2, 3))(sh, sw, th, tw)
    (s_want, c_want), g_want = vg(lambda *a: unchunked_kl(*a, mask))(sh, sw, th, tw)
    close(s, s_want)
    assert float(c) == float(c_want) == float(mask.sum())
    close(g_got[0], g_want[0])
    close(g_got[1], g_want[1])
    assert not np.any(np.asarray(g_got[2])) and not np.any(np.asarray(g_got[3]))
    assert not np.any(np.asarray(g_got[0])[np.asarray(mask) == 0])  # masked rows get no gradient
    close(chunked(sh, sw, th, tw)[0], s_want)  # the value-only path (no residuals, no gradients)


@pytest.mark.parametrize("grad_in_forward", [True, False])
def test_chunked_reverse_kl_weights_jit_and_cotangent(grad_in_forward):
    """Float per-token weights, under jit, with a non-unit cotangent (e.g. 1 / global count)."""
    sh, sw, th, tw, _, _ = make(1)
    weights = jnp.asarray(np.random.default_rng(1).random(N), jnp.float32)

    @jax.jit
    def loss(sh, sw):
        s, c = fused_kl.chunked_reverse_kl(sh, sw, th, tw, weights, chunk_size=8, grad_in_forward=grad_in_forward)
        return 0.37 * s / c

    def ref(sh, sw):
        s, c = unchunked_kl(sh, sw, th, tw, weights)
        return 0.37 * s / c

    close(loss(sh, sw), ref(sh, sw))
    grads = jax.jit(jax.grad(loss, (0, 1)))(sh, sw)
    for a, b in zip(grads, jax.jit(jax.grad(ref, (0, 1)))(sh, sw), strict=False):
        close(a, b)


def test_chunked_reverse_kl_is_zero_for_identical_models_and_empty_mask():
    sh, sw, _, _, mask, _ = make(2)
    s, c = fused_kl.chunked_reverse_kl(sh, sw, sh, sw, mask, chunk_size=7)
    assert abs(float(s)) < 1e-5 and float(c) == float(mask.sum())
    zero = jnp.zeros_like(mask)
    grads = jax.jit(
        jax.grad(lambda h, w: fused_kl.chunked_reverse_kl(h, w, h + 1.0, w, zero, chunk_size=7)[0], (0, 1))
    )(sh, sw)
    assert all(not np.any(np.asarray(g)) for g in grads)
    assert float(fused_kl.chunked_reverse_kl(sh, sw, sh + 1.0, sw, zero)[1]) == 0.0


def test_chunked_reverse_kl_bf16_computes_in_fp32():
    sh, sw, th, tw, mask, _ = make(3, dtype=jnp.bfloat16)
    got = fused_kl.chunked_reverse_kl(sh, sw, th, tw, mask, chunk_size=8)[0]
    f32 = [x.astype(jnp.float32) for x in (sh, sw, th, tw)]  # the same bf16 values, upcast
    want = unchunked_kl(*f32, mask)[0]
    assert got.dtype == jnp.float32
    close(got, want, {"rtol": 1e-4, "atol": 1e-4})  # only the fp32-accumulated matmul differs
    g = vg(lambda h, w: fused_kl.chunked_reverse_kl(h, w, th, tw, mask, chunk_size=8))(sh, sw)[1]
    gw = vg(lambda h, w: unchunked_kl(h, w, *f32[2:], mask))(*f32[:2])[1]
    assert g[0].dtype == g[1].dtype == jnp.bfloat16
    for a, b in zip(g, gw, strict=False):
        close(a, b, {"rtol": 2e-2, "atol": 2e-2})  # bf16 rounding of the returned gradient


def test_chunked_reverse_kl_rejects_mismatched_inputs():
    sh, sw, th, tw, mask, _ = make()
    with pytest.raises(ValueError, match="same tokens"):
        fused_kl.chunked_reverse_kl(sh, sw, th[:-1], tw, mask)
    with pytest.raises(ValueError, match="hidden"):
        fused_kl.chunked_reverse_kl(sh, sw.T, th, tw, mask)
    with pytest.raises(ValueError, match="mask"):
        fused_kl.chunked_reverse_kl(sh, sw, th, tw, mask[:-1])
    with pytest.raises(ValueError, match="chunk_size"):
        fused_kl.chunked_reverse_kl(sh, sw, th, tw, mask, chunk_size=0)


def test_chunked_never_holds_all_logits():
    """XLA's own buffer accounting: the chunked step's live temporaries stay below one
    [tokens, vocab] fp32 array, the unfused step's exceed two."""
    n, h, v = 512, 16, 2048
    sh, sw, th, tw, mask, _ = make(4, n=n, h=h, v=v)
    one_logits = n * v * 4

    def temp_bytes(fn):
        step = jax.jit(jax.value_and_grad(fn, argnums=(0, 1)))
        return step.lower(sh, sw, th, tw, mask).compile().memory_analysis().temp_size_in_bytes

    naive = temp_bytes(lambda *a: unchunked_kl(*a)[0])
    for gif in (True, False):
        chunked = temp_bytes(lambda *a, g=gif: fused_kl.chunked_reverse_kl(*a, chunk_size=64, grad_in_forward=g)[0])
        assert chunked < one_logits < 2 * one_logits < naive, (chunked, naive)


def test_chunked_reverse_kl_sharded_equals_unsharded():
    """Tokens over 'data' and vocabulary over 'tensor' on 8 fake CPU devices."""
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 (fake) devices; tests/conftest.py sets them")
    sh, sw, th, tw, mask, _ = make(5, n=64, h=8, v=32)
    mesh = jax.make_mesh((4, 2), ("data", "tensor"), axis_types=(AxisType.Auto,) * 2)

    def loss(sh, sw, th, tw, mask):
        s, c = fused_kl.chunked_reverse_kl(sh, sw, th, tw, mask, chunk_size=16)
        return s / c

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    want = step(sh, sw, th, tw, mask)
    with jax.set_mesh(mesh):

        def put(x, spec):
            return jax.device_put(x, NamedSharding(mesh, spec))

        args = (
            put(sh, P("data")),
            put(sw, P(None, "tensor")),
            put(th, P("data")),
            put(tw, P(None, "tensor")),
            put(mask, P("data")),
        )
        got = step(*args)
    close(got[0], want[0])
    for a, b in zip(got[1], want[1], strict=False):
        close(a, b)


# ------------------------------------------------------------------------------- cross-entropy


@pytest.mark.parametrize("grad_in_forward", [True, False])
@pytest.mark.parametrize("chunk_size", [1, 6, None])
def test_chunked_cross_entropy_equals_unchunked(chunk_size, grad_in_forward):
    sh, sw, _, _, mask, targets = make(6)
    targets = jnp.where(mask > 0, targets, -100)  # ignored ids at unscored positions

    def chunked(h, w):
        return fused_kl.chunked_token_cross_entropy(
            h, w, targets, mask, chunk_size=chunk_size, grad_in_forward=grad_in_forward
        )

    def ref(h, w):
        lp = losses.token_logprobs(h @ w, jnp.where(mask > 0, targets, 0))
        return jnp.sum(mask * -lp), jnp.sum(mask)

    (s, c), g = vg(chunked)(sh, sw)
    (s_want, c_want), g_want = vg(ref)(sh, sw)
    close(s, s_want)
    assert float(c) == float(c_want)
    for a, b in zip(g, g_want, strict=False):
        close(a, b)


def test_chunked_cross_entropy_flags_out_of_range_scored_target():
    sh, sw, _, _, mask, targets = make(7)
    i = int(np.flatnonzero(np.asarray(mask))[0])
    bad = targets.at[i].set(V)
    assert np.isnan(float(fused_kl.chunked_token_cross_entropy(sh, sw, bad, mask, chunk_size=4)[0]))


@pytest.mark.parametrize("chunk_size", [1, 9, None])
def test_chunked_token_logprobs_equal_unchunked(chunk_size):
    sh, sw, _, _, _, targets = make(8)
    cot = jnp.asarray(np.random.default_rng(8).normal(size=N), jnp.float32)

    def chunked(h, w):
        return fused_kl.chunked_token_logprobs(h, w, targets, chunk_size=chunk_size)

    def ref(h, w):
        return losses.token_logprobs(h @ w, targets)

    (_, lp), g = vg(lambda *x: (jnp.sum(cot * chunked(*x)), chunked(*x)))(sh, sw)
    (_, lp_want), g_want = vg(lambda *x: (jnp.sum(cot * ref(*x)), ref(*x)))(sh, sw)
    close(lp, lp_want)
    for a, b in zip(g, g_want, strict=False):
        close(a, b)


def test_auto_chunk_size():
    assert fused_kl.auto_chunk_size(4096, 151_936) == 256
    assert fused_kl.auto_chunk_size(10, 50) == 10
    assert fused_kl.auto_chunk_size(1 << 20, 1 << 30) == 8


# ------------------------------------------------------------------------------- [B, T] wrappers


def _bt(seed: int = 9, b: int = 3, t: int = 5):
    rng = np.random.default_rng(seed)
    sh = jnp.asarray(rng.normal(size=(b, t, H)), jnp.float32)
    th = jnp.asarray(rng.normal(size=(b, t, H)), jnp.float32)
    sw = jnp.asarray(rng.normal(size=(H, V)) * 0.7, jnp.float32)
    tw = jnp.asarray(rng.normal(size=(H, V)) * 0.7, jnp.float32)
    mask = jnp.asarray(rng.random((b, t)) < 0.7).at[0, 0].set(True)
    targets = jnp.asarray(rng.integers(0, V, (b, t)))
    return sh, sw, th, tw, mask, targets


@pytest.mark.parametrize("aggregation", ["token", "decision"])
def test_opd_from_hidden_equals_opd_on_logits(aggregation):
    sh, sw, th, tw, mask, _ = _bt()
    flag = jnp.asarray([1.0, 0.0, 1.0])

    def f(h, w):
        return losses.opd_loss_from_hidden(h, w, th, tw, mask, flag, aggregation=aggregation, chunk_size=4)

    def r(h, w):
        return losses.reverse_kl(h @ w, th @ tw, mask, flag, aggregation=aggregation)

    (s, c), g = vg(f)(sh, sw)
    (s_want, c_want), g_want = vg(r)(sh, sw)
    close(s, s_want)
    assert float(c) == float(c_want)
    for a, b in zip(g, g_want, strict=False):
        close(a, b)


def test_rwr_ce_and_logprobs_from_hidden_equal_logits_versions():
    sh, sw, _, _, mask, targets = _bt(10)
    rewards = jnp.asarray([1.0, 0.0, 1.0])

    def f(h, w):
        return losses.reward_weighted_regression_from_hidden(h, w, targets, mask, rewards, chunk_size=4)

    def r(h, w):
        return losses.reward_weighted_regression(h @ w, targets, mask, rewards)

    (s, c), g = vg(f)(sh, sw)
    (s_want, c_want), g_want = vg(r)(sh, sw)
    close(s, s_want)
    assert float(c) == float(c_want)
    for a, b in zip(g, g_want, strict=False):
        close(a, b)

    @jax.jit
    def pairs(sh, sw):
        return (
            losses.token_cross_entropy_from_hidden(sh, sw, targets, mask, chunk_size=3),
            losses.token_cross_entropy(sh @ sw, targets, mask),
            losses.token_logprobs_from_hidden(sh, sw, targets, chunk_size=4),
            losses.token_logprobs(sh @ sw, targets),
        )

    ce, ce_ref, lp, lp_ref = pairs(sh, sw)
    close(ce[0], ce_ref[0])
    assert float(ce[1]) == float(ce_ref[1])
    close(lp, lp_ref)
