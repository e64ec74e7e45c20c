"""Reference objectives the tests hold the trainer's loss parts against: one pure function each, written from
the paper's equations, not from the parts they check."""

from __future__ import annotations

import jax

from porch_jax.train.losses import action_kl_sum, action_policy_gradient, safe_mean


def maca_loss(
    log_probs: jax.Array,
    actions: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    valid: jax.Array,
    mix: jax.Array,
    *,
    clip_eps: float,
    prior_kl_weight: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """MACA's GRPO objective: Eq. 10 over decisions [D] plus lambda * KL(pi_theta || pi_mix) (porch_jax/maca/train.py's
    docstring). The one trainer's "maca_grpo" method (parts "pg" and "kl_mix" of train/methods.py) computes the
    same from the same pieces of train/losses.py, with each part's count taken over the whole batch.

    log_probs [D, A] (Eq. 11), actions/old_logp/advantages/valid [D], mix [D, A] = log pi_mix.
    """
    total, count, metrics = action_policy_gradient(log_probs, actions, old_logp, advantages, valid, clip_eps=clip_eps)
    pg = safe_mean(total, count)
    kl = safe_mean(action_kl_sum(log_probs, mix, valid), count)
    return pg + prior_kl_weight * kl, {"pg": pg, "kl_mix": kl, "clip_fraction": metrics["clip_fraction"]}
