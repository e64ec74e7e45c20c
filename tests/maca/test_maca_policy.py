"""Eq. 11 (masked policy) and Eq. 12 (reward with the KL to pi_mix) against NumPy transcriptions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from porch_jax.maca.policy import (
    kl_to_mix,
    masked_log_probs,
    mix_log_probs,
    prior_action_probs,
    step_rewards,
    structural_mask,
    trajectory_return,
)

N = 5  # agents; action N is STOP


def _case(seed=0):
    rng = np.random.default_rng(seed)
    z = np.array([0.7, 0.0, 0.5, 0.9, 0.0])
    p_prior = rng.uniform(0, 0.6, size=(N, N))
    p_prior[0, 2] = 0.01  # below the threshold used below
    prev = np.array([-1, 0, 2, 3])
    return rng, z, p_prior, prev


def _mask_numpy(z, p_prior, prev, threshold):
    rows = []
    for i in prev:
        agents = [z[j] > 0 and (i < 0 or p_prior[i, j] > threshold) for j in range(N)]
        rows.append(agents + [True])
    return np.array(rows)


def test_structural_mask():
    _, z, p_prior, prev = _case()
    mask = structural_mask(jnp.asarray(z), jnp.asarray(p_prior), jnp.asarray(prev), edge_threshold=0.05)
    np.testing.assert_array_equal(mask, _mask_numpy(z, p_prior, prev, 0.05))
    assert not mask[1, 2] and mask[:, N].all()


def test_conditional_structural_mask():
    """`conditional`: after agent i, agent j is allowed iff P_prior[i, j] / sum over retained k of P_prior[i, k]
    exceeds the threshold. A row of uniformly tiny edges (an agent where successful trajectories ended) then
    still allows its relatively plausible successors; the absolute rule forbids them all."""
    _, z, p_prior, prev = _case()
    p_prior[2] = [0.004, 0.5, 0.0, 0.002, 0.001]  # agent 2: tiny edges to the retained agents 0 and 3
    mask = structural_mask(
        jnp.asarray(z), jnp.asarray(p_prior), jnp.asarray(prev), edge_threshold=0.05, conditional=True
    )
    retained = z > 0
    expected = []
    for i in prev:
        row = p_prior[i] * retained / (p_prior[i] * retained).sum() if i >= 0 else None
        expected.append([retained[j] and (i < 0 or row[j] > 0.05) for j in range(N)] + [True])
    np.testing.assert_array_equal(mask, np.array(expected))
    assert mask[2].tolist() == [True, False, False, True, False, True]  # 0.004 / 0.006 and 0.002 / 0.006
    absolute = structural_mask(jnp.asarray(z), jnp.asarray(p_prior), jnp.asarray(prev), edge_threshold=0.05)
    assert absolute[2].tolist() == [False] * N + [True]


def test_masked_policy_matches_eq11():
    rng, z, p_prior, prev = _case()
    logits = rng.normal(size=(len(prev), N + 1))
    mask = _mask_numpy(z, p_prior, prev, 0.05)
    expected = np.exp(logits) * mask / (np.exp(logits) * mask).sum(-1, keepdims=True)
    log_probs = masked_log_probs(jnp.asarray(logits), jnp.asarray(mask))
    np.testing.assert_allclose(np.exp(log_probs), expected, rtol=1e-5, atol=1e-7)
    assert np.all(np.isneginf(np.asarray(log_probs)[~mask]))


def _prior_numpy(z, p_prior, prev, mask, stop_floor, start=None, visited=None):
    """pi_prior written out: the START row (or z) opens; after agent i the allowed, not yet called agents
    weigh P_prior[i, j] and STOP takes what their weights leave (at least stop_floor)."""
    out = []
    for r, (i, m) in enumerate(zip(prev, mask, strict=False)):
        free = [m[j] and (visited is None or not visited[r][j]) for j in range(N)]
        if i < 0:
            agents = [(z if start is None else start)[j] * free[j] for j in range(N)]
            w = [(1 - stop_floor) * a / sum(agents) for a in agents] + [stop_floor]
        else:
            agents = [p_prior[i, j] * free[j] for j in range(N)]
            w = agents + [min(1.0, max(stop_floor, 1 - sum(agents)))]
        w = np.array(w) * m
        out.append(w / w.sum())
    return np.array(out)


def test_prior_action_distribution():
    _, z, p_prior, prev = _case()
    p_prior[3] *= 0.1  # leaves mass for STOP after agent 3
    mask = _mask_numpy(z, p_prior, prev, 0.05)
    probs = prior_action_probs(
        jnp.asarray(z), jnp.asarray(p_prior), jnp.asarray(prev), jnp.asarray(mask), stop_floor=0.05
    )
    expected = _prior_numpy(z, p_prior, prev, mask, 0.05)
    np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-7)
    assert expected[3, N] > 0.3 and np.isclose(expected[0, N], 0.05)
    # STOP is what the row leaves over the agents the walk can still take: mass on masked agents does not
    # count (the earlier reading, 1 - full row sum, left agent 0's row almost no STOP)
    free = mask[1, :N]
    assert p_prior[0].sum() > 1 and p_prior[0, free].sum() < 0.9
    np.testing.assert_allclose(probs[1, N], 1 - p_prior[0, free].sum(), rtol=1e-5)


def test_prior_opens_by_the_start_row_and_never_revisits():
    _, z, p_prior, prev = _case(2)
    mask = _mask_numpy(z, p_prior, prev, 0.0)
    start = np.array([0.05, 0.0, 0.9, 0.1, 0.0])
    visited = np.zeros((len(prev), N), bool)
    visited[2, [0, 2]] = True  # a walk 0 -> 2: agent 0 is not proposed again after 2
    probs = np.asarray(
        prior_action_probs(
            jnp.asarray(z),
            jnp.asarray(p_prior),
            jnp.asarray(prev),
            jnp.asarray(mask),
            start=jnp.asarray(start),
            visited=jnp.asarray(visited),
            stop_floor=0.05,
        )
    )
    np.testing.assert_allclose(probs, _prior_numpy(z, p_prior, prev, mask, 0.05, start, visited), rtol=1e-5, atol=1e-7)
    assert np.argmax(probs[0]) == 2  # the START row decides the opening (z alone would pick agent 3)
    # a START row with little mass still opens with an agent: STOP before any call keeps only stop_floor
    tiny = np.asarray(
        prior_action_probs(
            jnp.asarray(z),
            jnp.asarray(p_prior),
            jnp.asarray(prev),
            jnp.asarray(mask),
            start=jnp.asarray(start * 1e-3),
            stop_floor=0.05,
        )
    )
    np.testing.assert_allclose(tiny[0], probs[0], rtol=1e-5)
    assert probs[2, 0] == 0 and probs[2, 2] == 0 and probs[2, 3] > 0
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)


def test_kl_to_mix_and_rewards_match_eq12():
    rng, z, p_prior, prev = _case(1)
    mask = _mask_numpy(z, p_prior, prev, 0.05)
    policy_logits, ref_logits = rng.normal(size=(2, len(prev), N + 1))
    pi = np.exp(policy_logits) * mask
    pi /= pi.sum(-1, keepdims=True)
    ref = np.exp(ref_logits) * mask
    ref /= ref.sum(-1, keepdims=True)
    prior = _prior_numpy(z, p_prior, prev, mask, 0.05)
    mix = 0.5 * (ref + prior)
    kl_np = np.array(
        [sum(pi[t, a] * np.log(pi[t, a] / mix[t, a]) for a in range(N + 1) if pi[t, a] > 0) for t in range(len(prev))]
    )

    log_pi = masked_log_probs(jnp.asarray(policy_logits), jnp.asarray(mask))
    log_mix = mix_log_probs(masked_log_probs(jnp.asarray(ref_logits), jnp.asarray(mask)), jnp.asarray(prior))
    kl = kl_to_mix(log_pi, log_mix)
    np.testing.assert_allclose(kl, kl_np, rtol=1e-4, atol=1e-6)

    # One trajectory of 4 steps (a padded 5th), correct; r'_t = [t last] R_acc - beta C_t / 1000 - lambda KL_t.
    tokens = np.array([300.0, 450.0, 700.0, 900.0, 0.0])
    kl_t = np.append(kl_np, 0.0)
    step_mask = np.array([1, 1, 1, 1, 0])
    expected = [(1.0 if t == 3 else 0.0) - 0.02 * tokens[t] / 1000 - 0.7 * kl_t[t] for t in range(4)] + [0.0]
    rewards = step_rewards(jnp.array(1.0), jnp.asarray(tokens), jnp.asarray(kl_t), jnp.asarray(step_mask))
    np.testing.assert_allclose(rewards, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(trajectory_return(rewards), sum(expected), rtol=1e-5)
    wrong = step_rewards(jnp.array(0.0), jnp.asarray(tokens), jnp.asarray(kl_t), jnp.asarray(step_mask))
    np.testing.assert_allclose(trajectory_return(rewards) - trajectory_return(wrong), 1.0, rtol=1e-5)


def test_kl_gradient_is_finite_with_masked_actions():
    _, z, p_prior, prev = _case()
    mask = jnp.asarray(_mask_numpy(z, p_prior, prev, 0.05))
    prior = prior_action_probs(jnp.asarray(z), jnp.asarray(p_prior), jnp.asarray(prev), mask)
    ref = masked_log_probs(jnp.zeros((len(prev), N + 1)), mask)

    def loss(logits):
        return kl_to_mix(masked_log_probs(logits, mask), mix_log_probs(ref, prior)).sum()

    grad = jax.grad(loss)(jnp.ones((len(prev), N + 1)))
    assert np.isfinite(np.asarray(grad)).all() and np.all(np.asarray(grad)[~np.asarray(mask)] == 0)
