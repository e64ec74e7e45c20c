"""Losses against independent float64 NumPy implementations: values and gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from porch_jax.train import losses

TOL = {"rtol": 1e-5, "atol": 1e-5}


def vg(fn, argnums=0):
    """jit(value_and_grad) of a function returning (loss, aux): one compile per test."""
    return jax.jit(jax.value_and_grad(fn, argnums=argnums, has_aux=True))


# ------------------------------------------------------------------------------- references


def np_log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def np_aggregate(tok: np.ndarray, mask: np.ndarray, weights, aggregation: str):
    """Loops over decisions, so it shares no code or vectorization trick with the library.

    Returns (sum, count, per-token d sum / d token loss)."""
    b, t = mask.shape
    if weights is None:
        w = np.ones((b, t))
    else:
        w = np.asarray(weights, np.float64)
        w = np.repeat(w[:, None], t, 1) if w.ndim == 1 else w
    total, count, dtok = 0.0, 0.0, np.zeros((b, t))
    for i in range(b):
        scored = [j for j in range(t) if mask[i, j]]
        supervised = [j for j in scored if w[i, j] != 0]
        if aggregation == "token":
            for j in scored:
                total += w[i, j] * tok[i, j]
                dtok[i, j] = w[i, j]
            count += len(supervised)
        else:
            for j in scored:
                total += w[i, j] * tok[i, j] / len(scored)
                dtok[i, j] = w[i, j] / len(scored)
            count += 1 if supervised else 0
    return total, count, dtok


def np_reverse_kl_and_grad(zs: np.ndarray, zt: np.ndarray):
    lps, lpt = np_log_softmax(zs), np_log_softmax(zt)
    ps = np.exp(lps)
    kl = (ps * (lps - lpt)).sum(-1)
    return kl, ps * ((lps - lpt) - kl[..., None])  # d KL / d z_s


def np_ce_and_grad(z: np.ndarray, targets: np.ndarray):
    lp = np_log_softmax(z)
    onehot = np.eye(z.shape[-1])[targets]
    ce = -(lp * onehot).sum(-1)
    return ce, np.exp(lp) - onehot


def rand_case(seed: int, b: int = 4, t: int = 6, v: int = 11, scale: float = 2.0):
    rng = np.random.default_rng(seed)
    zs = (rng.normal(size=(b, t, v)) * scale).astype(np.float32)
    zt = (rng.normal(size=(b, t, v)) * scale).astype(np.float32)
    targets = rng.integers(0, v, size=(b, t))
    mask = rng.random((b, t)) < 0.7
    mask[0] = False  # a decision with no scored token
    mask[1, :2] = True
    return rng, zs, zt, targets, mask


# ------------------------------------------------------------------------------- aggregation


@pytest.mark.parametrize("aggregation", ["token", "decision"])
@pytest.mark.parametrize("weight_kind", ["none", "decision", "token"])
def test_token_cross_entropy_value_and_grad(aggregation, weight_kind):
    rng, z, _, targets, mask = rand_case(0)
    targets = np.where(mask, targets, -100)  # unscored positions may hold any id
    weights = {
        "none": None,
        "decision": np.array([1.0, 0.0, 0.5, 2.0], np.float32),
        "token": (rng.random(mask.shape) * (rng.random(mask.shape) < 0.8)).astype(np.float32),
    }[weight_kind]

    ce, dce_dz = np_ce_and_grad(z, np.where(mask, targets, 0))
    want_sum, want_count, dtok = np_aggregate(ce, mask, weights, aggregation)

    def f(logits):
        return losses.token_cross_entropy(
            logits,
            jnp.asarray(targets),
            jnp.asarray(mask),
            None if weights is None else jnp.asarray(weights),
            aggregation=aggregation,
        )

    (got_sum, got_count), grad = vg(f)(z)
    np.testing.assert_allclose(got_sum, want_sum, **TOL)
    assert float(got_count) == want_count
    assert got_sum.dtype == got_count.dtype == jnp.float32
    np.testing.assert_allclose(grad, dtok[..., None] * dce_dz, **TOL)


def test_token_logprobs_matches_numpy_and_flags_bad_ids():
    _, z, _, targets, _ = rand_case(1)
    want = np.take_along_axis(np_log_softmax(z), targets[..., None], -1)[..., 0]
    got = losses.token_logprobs(jnp.asarray(z), jnp.asarray(targets))
    np.testing.assert_allclose(got, want, **TOL)
    bad = targets.copy()
    bad[0, 0], bad[1, 1] = -1, z.shape[-1]
    got = np.asarray(losses.token_logprobs(jnp.asarray(z), jnp.asarray(bad)))
    assert np.isnan(got[0, 0]) and np.isnan(got[1, 1]) and np.isfinite(got[2]).all()


def test_aggregation_rejects_bad_arguments():
    mask = jnp.ones((2, 3))
    with pytest.raises(ValueError, match="aggregation"):
        losses.aggregation_weights(mask, None, "batch")
    with pytest.raises(ValueError, match="weights"):
        losses.aggregation_weights(mask, jnp.ones(3))
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        losses.aggregation_weights(jnp.ones(3))


def test_safe_mean():
    assert float(losses.safe_mean(jnp.float32(3.0), jnp.float32(2.0))) == 1.5
    assert float(losses.safe_mean(jnp.float32(0.0), jnp.float32(0.0))) == 0.0


# ------------------------------------------------------------------------------- RWR


def test_rwr_binary_rewards_is_per_decision_ce_on_successes():
    _, z, _, targets, mask = rand_case(2)
    rewards = np.array([1.0, 1.0, 0.0, 1.0], np.float32)  # decision 0 has no tokens
    ce, dce = np_ce_and_grad(z, targets)
    means = {i: ce[i][mask[i]].mean() for i in (1, 3)}
    want = means[1] + means[3]

    def f(x):
        return losses.reward_weighted_regression(x, targets, mask, rewards)

    (got_sum, got_count), grad = vg(f)(z)
    np.testing.assert_allclose(got_sum, want, **TOL)
    assert float(got_count) == 2.0  # successful decisions with tokens
    _, _, dtok = np_aggregate(ce, mask, rewards, "decision")
    np.testing.assert_allclose(grad, dtok[..., None] * dce, **TOL)


def test_rwr_exp_weights_and_token_aggregation():
    _, z, _, targets, mask = rand_case(3)
    rewards = np.array([0.3, -1.0, 2.0, 0.5], np.float32)
    e = np.exp(rewards.astype(np.float64) / 0.5)
    w = e / e.mean()
    np.testing.assert_allclose(losses.rwr_weights(rewards, weighting="exp", temperature=0.5), w, **TOL)
    ce, _ = np_ce_and_grad(z, targets)
    want_sum, want_count, _ = np_aggregate(ce, mask, w, "token")
    got_sum, got_count = losses.reward_weighted_regression(
        z, targets, mask, rewards, weighting="exp", temperature=0.5, aggregation="token"
    )
    np.testing.assert_allclose(got_sum, want_sum, **TOL)
    assert float(got_count) == want_count
    with pytest.raises(ValueError, match="weighting"):
        losses.rwr_weights(rewards, weighting="softmax")
    with pytest.raises(ValueError, match="temperature"):
        losses.rwr_weights(rewards, weighting="exp", temperature=0.0)


# ------------------------------------------------------------------------------- reverse KL / OPD


@pytest.mark.parametrize("aggregation", ["token", "decision"])
def test_reverse_kl_value_and_grad(aggregation):
    _, zs, zt, _, mask = rand_case(4)
    kl, dkl = np_reverse_kl_and_grad(zs, zt)
    want_sum, want_count, dtok = np_aggregate(kl, mask, None, aggregation)

    def f(a, b):
        return losses.reverse_kl(a, b, mask, aggregation=aggregation)

    (got_sum, got_count), (gs, gt) = vg(f, (0, 1))(zs, zt)
    np.testing.assert_allclose(got_sum, want_sum, **TOL)
    assert float(got_count) == want_count
    np.testing.assert_allclose(gs, dtok[..., None] * dkl, **TOL)
    assert not np.any(np.asarray(gt))  # the teacher is behind a stop-gradient


def test_opd_loss_is_mean_over_tokens_then_sum_over_attributable_decisions():
    _, zs, zt, _, mask = rand_case(5)
    flag = np.array([1.0, 1.0, 0.0, 1.0], np.float32)
    kl, _ = np_reverse_kl_and_grad(zs, zt)
    want = sum(kl[i][mask[i]].mean() for i in (1, 3))  # decision 0 has no tokens, 2 no FLAG
    got_sum, got_count = losses.opd_loss(zs, zt, mask, flag)
    np.testing.assert_allclose(got_sum, want, **TOL)
    assert float(got_count) == 2.0


def test_opod_method_combines_parts_with_their_own_counts():
    """OPOD's loss is RWR + opd_weight * OPD, each part over its own count; an empty part adds 0."""
    from porch_jax.train.methods import MethodConfig, make_method

    method = make_method(MethodConfig(name="opod", opd_weight=0.5))
    rwr = (jnp.float32(6.0), jnp.float32(3.0))
    opd = (jnp.float32(1.0), jnp.float32(4.0))
    counts = {"rwr": rwr[1], "opd": opd[1]}
    np.testing.assert_allclose(method.loss({"rwr": rwr, "opd": opd}, counts), 2.0 + 0.5 * 0.25, rtol=1e-7)
    assert float(method.loss({"rwr": rwr, "opd": (jnp.float32(0.0), jnp.float32(0.0))}, counts | {"opd": 0.0})) == 2.0
    assert float(method.loss({"opd": opd}, counts)) == 0.125  # a batch without RWR rows: OPD alone
    g = jax.grad(lambda s: method.loss({"rwr": (s, rwr[1]), "opd": opd}, counts))(rwr[0])
    np.testing.assert_allclose(g, 1.0 / 3.0, rtol=1e-7)


# One shape, so hypothesis explores values without a compile per example.
logit_rows = hnp.arrays(np.float32, (4, 9), elements=st.floats(-20, 20, width=32))
_token_kl = jax.jit(losses.token_reverse_kl)


@settings(max_examples=40, deadline=None)
@given(zs=logit_rows, zt=logit_rows, shift=st.floats(-50, 50, width=32))
def test_reverse_kl_properties(zs, zt, shift):
    kl = np.asarray(_token_kl(zs, zt))
    assert np.all(kl >= -1e-5)  # Gibbs' inequality, up to rounding
    np.testing.assert_allclose(kl, np_reverse_kl_and_grad(zs, zt)[0], rtol=1e-4, atol=1e-4)
    same = np.asarray(_token_kl(zs, zs + np.float32(shift)))
    np.testing.assert_allclose(same, 0.0, atol=1e-5)  # equal distributions (logits up to a shift)


# ------------------------------------------------------------------------------- GRPO


def np_group_advantages(r, eps, scale, ddof):
    r = r.astype(np.float64)
    c = r - r.mean(1, keepdims=True)
    return c / (r.std(1, ddof=ddof, keepdims=True) + eps) if scale else c


@pytest.mark.parametrize("scale,ddof", [(True, 1), (True, 0), (False, 1)])
def test_group_advantages(scale, ddof):
    r = np.random.default_rng(6).random((3, 5)).astype(np.float32)
    r[2] = 1.0  # a group whose samples all scored the same: advantage 0, not NaN
    got = losses.group_advantages(r, eps=1e-4, scale_by_std=scale, ddof=ddof)
    np.testing.assert_allclose(got, np_group_advantages(r, 1e-4, scale, ddof), **TOL)
    assert not np.any(np.asarray(got[2]))
    with pytest.raises(ValueError, match="samples"):
        losses.group_advantages(np.ones((2, 1)))


_advantages = jax.jit(losses.group_advantages)


@settings(max_examples=30, deadline=None)
@given(
    r=hnp.arrays(np.float32, (3, 6), elements=st.floats(-5, 5, width=32)),
    a=st.floats(0.5, 3),
    c=st.floats(-3, 3),
)
def test_group_advantages_are_centred_and_affine_invariant(r, a, c):
    adv = np.asarray(_advantages(r))
    np.testing.assert_allclose(adv.mean(1), 0.0, atol=1e-4)
    if np.all(r.std(1) > 0.2):  # away from the eps regime
        moved = np.asarray(_advantages(r * np.float32(a) + np.float32(c)))
        np.testing.assert_allclose(moved, adv, rtol=1e-2, atol=1e-2)


def np_grpo(new, old, ref, adv, mask, eps_lo, eps_hi, kl_coef, aggregation):
    new, old, ref = (x.astype(np.float64) for x in (new, old, ref))
    a = adv.astype(np.float64)[:, None]
    ratio = np.exp(new - old)
    unclipped = ratio * a
    clipped = np.clip(ratio, 1 - eps_lo, 1 + eps_hi) * a
    k3 = np.exp(ref - new) - (ref - new) - 1
    tok = -np.minimum(unclipped, clipped) + kl_coef * k3
    d_tok = np.where(unclipped <= clipped, -a * ratio, 0.0) + kl_coef * (1 - np.exp(ref - new))
    agg = "token" if aggregation == "token" else "decision"
    total, count, dw = np_aggregate(tok, mask, None, agg)
    is_clipped = ((ratio < 1 - eps_lo) & (a < 0)) | ((ratio > 1 + eps_hi) & (a > 0))
    m = mask.astype(bool)
    return total, count, dw * d_tok, is_clipped[m].mean(), k3[m].mean()


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
@pytest.mark.parametrize("eps_hi", [None, 0.28])
def test_grpo_loss_value_grad_and_metrics(aggregation, eps_hi):
    rng = np.random.default_rng(7)
    b, t = 5, 7
    old = rng.normal(-2.0, 1.0, (b, t)).astype(np.float32)
    new = (old + rng.normal(0.0, 0.3, (b, t))).astype(np.float32)  # ratios beyond both clips
    ref = (old + rng.normal(0.0, 0.3, (b, t))).astype(np.float32)
    adv = rng.normal(size=b).astype(np.float32)
    mask = rng.random((b, t)) < 0.75
    mask[0] = False
    kwargs = {"clip_eps": 0.2, "clip_eps_high": eps_hi, "kl_coef": 0.05, "aggregation": aggregation}

    want_sum, want_count, want_grad, want_clip, want_kl = np_grpo(
        new, old, ref, adv, mask, 0.2, eps_hi or 0.2, 0.05, aggregation
    )

    def f(x):
        total, count, metrics = losses.grpo_loss(x, old, ref, adv, mask, **kwargs)
        return total, (count, metrics)

    (got_sum, (got_count, metrics)), grad = vg(f)(new)
    np.testing.assert_allclose(got_sum, want_sum, **TOL)
    assert float(got_count) == want_count
    assert 0.0 < want_clip < 1.0  # the case exercises both branches
    np.testing.assert_allclose(metrics["clip_fraction"], want_clip, **TOL)
    np.testing.assert_allclose(metrics["kl"], want_kl, **TOL)
    assert float(metrics["tokens"]) == mask.sum()
    np.testing.assert_allclose(grad, want_grad, **TOL)


def test_grpo_on_policy_without_reference_is_the_policy_gradient():
    rng = np.random.default_rng(8)
    new = rng.normal(size=(3, 4)).astype(np.float32)
    adv = np.array([1.0, -2.0, 0.5], np.float32)
    mask = np.ones((3, 4), bool)

    def f(x):
        total, count, metrics = losses.grpo_loss(x, None, None, adv, mask)
        return total, (count, metrics)

    (total, (count, metrics)), grad = vg(f)(new)
    np.testing.assert_allclose(total, -adv.sum() * 4, **TOL)
    assert float(count) == 12 and float(metrics["clip_fraction"]) == 0.0
    np.testing.assert_allclose(grad, -np.repeat(adv[:, None], 4, 1), **TOL)
    with pytest.raises(ValueError, match="logp_ref"):
        losses.grpo_loss(new, None, None, adv, mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="aggregation"):
        losses.grpo_loss(new, None, None, adv, mask, aggregation="decision")


def test_grpo_ignores_garbage_at_unscored_positions():
    """NaN log-probs of padding ids behind the mask change neither the loss nor the gradient."""
    rng = np.random.default_rng(9)
    new = rng.normal(-1.0, 0.5, (2, 5)).astype(np.float32)
    old = (new + rng.normal(0, 0.3, (2, 5))).astype(np.float32)
    adv = np.array([1.0, -1.0], np.float32)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], bool)
    nan_new, nan_old = np.where(mask, new, np.nan), np.where(mask, old, np.nan)

    def f(x, o):
        total, count, _ = losses.grpo_loss(x, o, o, adv, mask, kl_coef=0.1)
        return total, count

    (clean, _), g_clean = vg(f)(new, old)
    (dirty, _), g_dirty = vg(f)(nan_new.astype(np.float32), nan_old.astype(np.float32))
    np.testing.assert_allclose(dirty, clean, **TOL)
    np.testing.assert_allclose(np.where(mask, g_dirty, 0.0), np.where(mask, g_clean, 0.0), **TOL)
    assert np.all(np.isfinite(g_dirty)) and not np.any(np.asarray(g_dirty)[~mask])
