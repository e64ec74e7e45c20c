"""Token-aware orchestration (MACA Sec. 2.3) as pure jnp functions: the structural action mask, the
masked policy (Eq. 11), the prior action distribution, the KL to pi_mix and the shaped reward (Eq. 12).

The action space is A = O + {STOP}: agent i is action i, STOP is action N. A state is summarised by the
previously invoked agent `prev` (-1 before the first call). These functions take action logits [..., A]
from any policy (a head over the pool, or an LLM's summed log-probs of each action's text); a GRPO
trainer turns `trajectory_return` into group advantages (Eq. 9) and the clipped loss (Eq. 10).

Paper ambiguities and how they are resolved here:
- The mask H (Eq. 11) is not specified beyond "structurally implausible interactions". Here an agent is
  allowed iff it passed the relevance gate (z_j > 0) and, after agent i, P_prior[i, j] > edge_threshold;
  STOP is always allowed, so no state is left without an action. With `conditional` the threshold
  applies to the row normalised over the retained agents, P_prior[i, j] / sum_k retained P_prior[i, k]:
  P_prior[i, j] estimates P(next = v_j | v_i visited, success) (edges.py), which folds in how often
  successful trajectories ended at v_i; a row that ends most of them (a checker's: every entry ~0.002 on
  the synthetic pool) then forbids every continuation, so the mask would decide STOP, a decision that is
  the token-aware policy's (pi_prior's STOP mass still pulls towards it through the KL). Normalised, the
  row says which agent is plausible next if any is.
- pi_prior ("the prior action distribution induced by GraphSpec") is not defined. Here it is the walk
  that prior learning executes on a structure (edges.py), read off GraphSpec: before the first call the
  agents share 1 - stop_floor in proportion to the START row of P_prior where GraphSpec has one (else
  to z_j), STOP gets stop_floor (a successful trajectory never ends before its first call); after agent i, each allowed agent not yet called (a walk never revisits) by P_prior[i, j]
  and STOP by clip(1 - sum of those weights, stop_floor, 1): the edge MLP is fitted on where successful
  trajectories went next after v_i, a row with no next meaning "ended here", so the mass the row leaves
  is its stopping probability. Restricted to H and normalised. (Summing the row over every agent, as
  an earlier version did, counts mass on masked and already-called agents that the walk can never take,
  and weighting the first call by z_j makes every gate-passing agent, bystanders included, an equally
  likely opening.)
- Eq. 12 gives a per-step r_t = R_acc - beta * C_t. Paying R_acc at every step would reward long
  trajectories, so the accuracy reward is paid once, at the last step, and every step pays for its own
  tokens: sum_t r_t = R_acc - beta * C_total. C is counted in units of `token_unit` tokens (default 1000),
  since beta = 0.02 per raw token would make any answer's cost dwarf its accuracy.
- KL(pi_theta || pi_mix) is the exact sum over A at each step. As a reward term it carries no gradient:
  the trainer treats rewards as constants.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from porch_jax.maca.settings import PRIOR_KL_WEIGHT, TOKEN_COST_WEIGHT
from porch_jax.train import losses


def structural_mask(
    z: jax.Array, p_prior: jax.Array, prev: jax.Array, *, edge_threshold: float = 0.0, conditional: bool = False
) -> jax.Array:
    """H: bool [..., N + 1] for previous agents `prev` [...] (int, -1 = no agent yet). `conditional`: the
    threshold applies to P_prior's row normalised over the retained agents (see the module docstring)."""
    retained = z > 0
    row = p_prior[jnp.maximum(prev, 0)]  # [..., N]
    if conditional:
        row = row * retained
        row = row / jnp.maximum(row.sum(-1, keepdims=True), 1e-30)
    plausible = jnp.where((prev >= 0)[..., None], row > edge_threshold, True)
    agents = retained & plausible
    return jnp.concatenate([agents, jnp.ones((*agents.shape[:-1], 1), bool)], axis=-1)


def masked_log_probs(logits: jax.Array, mask: jax.Array) -> jax.Array:
    """Eq. 11: log pi_masked(a | s) = log(exp(l_a) H_a / sum_a' exp(l_a') H_a'); -inf where H_a = 0 (the one
    trainer's action parts normalise the same way, `losses.masked_log_softmax`)."""
    return losses.masked_log_softmax(logits, mask)


def prior_action_probs(
    z: jax.Array,
    p_prior: jax.Array,
    prev: jax.Array,
    mask: jax.Array,
    *,
    start: jax.Array | None = None,
    visited: jax.Array | None = None,
    stop_floor: float = 0.05,
) -> jax.Array:
    """pi_prior [..., N + 1] (see the module docstring). z [N], p_prior [N, N], prev [...] (-1: no agent
    yet), mask bool [..., N + 1]; start [N] (GraphSpec's START row; None: use z), visited bool [..., N]."""
    started = (prev >= 0)[..., None]
    row = p_prior[jnp.maximum(prev, 0)]  # [..., N]
    candidates = mask[..., :-1] & (True if visited is None else ~visited)
    opening = (z if start is None else start) * candidates
    opening = (1.0 - stop_floor) * opening / jnp.maximum(opening.sum(-1, keepdims=True), 1e-30)
    agent_w = jnp.where(started, row * candidates, opening)
    stop_w = jnp.where(started[..., 0], jnp.clip(1.0 - agent_w.sum(-1), stop_floor, 1.0), stop_floor)
    weights = jnp.concatenate([agent_w, stop_w[..., None]], axis=-1) * mask
    return weights / weights.sum(-1, keepdims=True)


def mix_log_probs(ref_log_probs: jax.Array, prior_probs: jax.Array) -> jax.Array:
    """log pi_mix = log((pi_ref + pi_prior) / 2), computed in log space."""
    return jnp.logaddexp(ref_log_probs, jnp.log(prior_probs)) - jnp.log(2.0)


def kl_to_mix(policy_log_probs: jax.Array, mix_log_probs_: jax.Array) -> jax.Array:
    """KL(pi_theta || pi_mix) [...] summed over actions; actions pi_theta never takes contribute 0 (the KL
    the one trainer's "kl_mix" part charges, `losses.action_kl`)."""
    return losses.action_kl(policy_log_probs, mix_log_probs_)


def step_rewards(
    correct: jax.Array,
    step_tokens: jax.Array,
    kl: jax.Array,
    step_mask: jax.Array,
    *,
    token_cost_weight: float = TOKEN_COST_WEIGHT,
    prior_kl_weight: float = PRIOR_KL_WEIGHT,
    token_unit: float = 1000.0,
) -> jax.Array:
    """Eq. 12, r'_t = r_t - lambda * KL_t with r_t = R_acc [t = last] - beta * C_t / token_unit.

    correct [...] (0/1); step_tokens, kl, step_mask [..., T] (step_mask: real steps, left-aligned).
    """
    step_mask = step_mask.astype(bool)
    last = jnp.arange(step_mask.shape[-1]) == (step_mask.sum(-1, keepdims=True) - 1)
    accuracy = jnp.where(last, correct[..., None].astype(jnp.float32), 0.0)
    r = accuracy - token_cost_weight * step_tokens / token_unit - prior_kl_weight * kl
    return jnp.where(step_mask, r, 0.0)


def trajectory_return(rewards: jax.Array) -> jax.Array:
    """R = sum_t r'_t (Eq. 8), the per-trajectory reward that GRPO normalises within a group."""
    return rewards.sum(-1)
