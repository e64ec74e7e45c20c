"""Training losses as pure functions: SFT / RWR cross-entropy, OPD reverse KL, OPOD, GRPO.

Every loss returns ``(sum, count)`` float32 scalars rather than a mean, so summing both over
micro-batches and hosts and dividing once is exact (the Tunix convention). Counts never depend
on parameters, so a trainer may also compute the global count first and divide each
micro-batch's sum by it.

Layout: ``[B, T]`` arrays hold one decision (or sampled sequence) per row; ``mask`` marks the
output tokens that are scored. Two aggregations (``aggregation=``):

- ``"token"``: sum of token losses; count = scored tokens.
- ``"decision"``: mean over each decision's scored tokens, summed over decisions; count = decisions
  with at least one scored token. This is the paper's ("Both losses average output-token losses
  within each decision, then across minibatch decisions with the corresponding supervision").

Optional ``weights`` ([B] per decision or [B, T] per token) scale the losses. A zero weight takes
the token/decision out of both the sum and the count ("decisions with the corresponding
supervision": RWR with 0/1 rewards averages over successful decisions, OPD with FLAG weights over
attributable ones); a non-zero weight scales the loss and counts once.

The ``*_from_hidden`` variants take final hidden states and the LM head and use the chunked fused
kernels in ``fused_kl`` so full [tokens, vocab] logits never exist (use them for training).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax import lax

from porch_jax.train import fused_kl

Array = jax.Array
Aggregation = Literal["token", "decision"]
RwrWeighting = Literal["reward", "exp"]


# --------------------------------------------------------------------------------------------
# Aggregation.
# --------------------------------------------------------------------------------------------


def aggregation_weights(
    mask: Array, weights: Array | None = None, aggregation: Aggregation = "token"
) -> tuple[Array, Array]:
    """Per-token weights ``tw [B, T]`` and ``count`` such that ``(sum(tw * loss), count)`` is the
    requested aggregation of a ``[B, T]`` token loss (see the module docstring).

    The same weights, flattened, drive the chunked kernels, which is how the fused losses get the
    per-decision mean without ever seeing the [B, T] layout.
    """
    if mask.ndim != 2:
        raise ValueError(f"mask must be [B, T], got shape {mask.shape}")
    m = (mask != 0).astype(jnp.float32)
    if weights is None:
        w = jnp.ones_like(m)
    else:
        w = jnp.asarray(weights, jnp.float32)
        if w.shape == m.shape[:1]:
            w = w[:, None]
        elif w.shape != m.shape:
            raise ValueError(f"weights must be [B] or [B, T] for mask {m.shape}, got {w.shape}")
        w = jnp.broadcast_to(w, m.shape)
    w = lax.stop_gradient(w)
    active = m * (w != 0)
    tw = m * w
    if aggregation == "token":
        return tw, jnp.sum(active)
    if aggregation == "decision":
        tokens = jnp.sum(m, axis=1, keepdims=True)
        tw = tw / jnp.maximum(tokens, 1.0)
        return tw, jnp.sum(jnp.any(active != 0, axis=1).astype(jnp.float32))
    raise ValueError(f"aggregation must be 'token' or 'decision', got {aggregation!r}")


def aggregate(
    token_losses: Array,
    mask: Array,
    weights: Array | None = None,
    aggregation: Aggregation = "token",
) -> tuple[Array, Array]:
    """(sum, count) of a [B, T] token loss under ``aggregation`` (masked tokens never leak NaN)."""
    tw, count = aggregation_weights(mask, weights, aggregation)
    return jnp.sum(jnp.where(tw != 0, tw * token_losses, 0.0)), count


def safe_mean(total: Array, count: Array) -> Array:
    """total / count, 0 when nothing was counted (a micro-batch without supervision)."""
    return jnp.where(count > 0, total / jnp.where(count > 0, count, 1.0), 0.0)


# --------------------------------------------------------------------------------------------
# Log-probabilities and cross-entropy (SFT, RWR).
# --------------------------------------------------------------------------------------------


def token_logprobs(logits: Array, targets: Array) -> Array:
    """log softmax(logits)[target] in fp32, shape of ``targets``; NaN for an id outside [0, V).

    The target logit is picked by a one-hot select, not a gather: the gather's gradient is a
    scatter into a zeroed [B, T, V] buffer, two extra passes over the logits that XLA:CPU does not
    fuse; the select's is elementwise (benchmarks/bench_train_step.py: with the logits no longer
    sliced, 4% off a bf16 step).
    """
    logits = logits.astype(jnp.float32)
    vocab = logits.shape[-1]
    valid = (targets >= 0) & (targets < vocab)
    is_target = jnp.arange(vocab, dtype=jnp.int32) == targets[..., None].astype(jnp.int32)
    picked = jnp.sum(jnp.where(is_target, logits, 0.0), axis=-1)
    return jnp.where(valid, picked - jax.nn.logsumexp(logits, axis=-1), jnp.nan)


def _safe_targets(targets: Array, mask: Array) -> Array:
    """Unscored positions may hold any id (e.g. -100)."""
    return jnp.where(mask != 0, targets, 0)


def token_cross_entropy(
    logits: Array,
    targets: Array,
    mask: Array,
    weights: Array | None = None,
    *,
    aggregation: Aggregation = "token",
) -> tuple[Array, Array]:
    """Cross-entropy on scored (decision) tokens: logits [B, T, V], targets/mask [B, T]."""
    ce = -token_logprobs(logits, _safe_targets(targets, mask))
    return aggregate(ce, mask, weights, aggregation)


def rwr_weights(rewards: Array, *, weighting: RwrWeighting = "reward", temperature: float = 1.0) -> Array:
    """Per-decision RWR weights from trajectory rewards [B] (no gradient).

    - ``"reward"``: w = r. With 0/1 success rewards this is cross-entropy on the decisions of
      successful trajectories, the paper's RWR. Rewards must be >= 0.
    - ``"exp"``: w = exp(r / temperature), normalized to mean 1 over the given decisions
      (Peters & Schaal 2007); any real rewards. The normalization is per call: for exact
      micro-batch accumulation compute it once over the whole batch and pass the result to
      ``reward_weighted_regression(..., weighting="reward")``.
    """
    r = lax.stop_gradient(jnp.asarray(rewards, jnp.float32))
    if weighting == "reward":
        return r
    if weighting == "exp":
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        e = jnp.exp((r - jnp.max(r)) / temperature)
        return e / jnp.mean(e)
    raise ValueError(f"weighting must be 'reward' or 'exp', got {weighting!r}")


def reward_weighted_regression(
    logits: Array,
    targets: Array,
    mask: Array,
    rewards: Array,
    *,
    weighting: RwrWeighting = "reward",
    temperature: float = 1.0,
    aggregation: Aggregation = "decision",
) -> tuple[Array, Array]:
    """RWR: cross-entropy of each decision weighted by ``rwr_weights(rewards)``; zero-weight
    decisions are left out of the count (default aggregation: the paper's per-decision mean)."""
    w = rwr_weights(rewards, weighting=weighting, temperature=temperature)
    return token_cross_entropy(logits, targets, mask, w, aggregation=aggregation)


# --------------------------------------------------------------------------------------------
# Reverse KL (OPD) and OPOD.
# --------------------------------------------------------------------------------------------


def token_reverse_kl(student_logits: Array, teacher_logits: Array) -> Array:
    """Full-vocabulary KL(p_s || sg[p_t]) = sum_v p_s (log p_s - log p_t) per token, fp32."""
    lps = jax.nn.log_softmax(student_logits.astype(jnp.float32), axis=-1)
    lpt = jax.nn.log_softmax(lax.stop_gradient(teacher_logits).astype(jnp.float32), axis=-1)
    return jnp.sum(jnp.exp(lps) * (lps - lpt), axis=-1)


def reverse_kl(
    student_logits: Array,
    teacher_logits: Array,
    mask: Array,
    weights: Array | None = None,
    *,
    aggregation: Aggregation = "token",
) -> tuple[Array, Array]:
    """Masked reverse KL over [B, T, V] logits; token-level (sum, count) by default."""
    return aggregate(token_reverse_kl(student_logits, teacher_logits), mask, weights, aggregation)


def opd_loss(
    student_logits: Array,
    teacher_logits: Array,
    mask: Array,
    attributable: Array | None = None,
) -> tuple[Array, Array]:
    """The paper's OPD: reverse KL averaged over each decision's tokens, then over decisions.

    ``attributable`` [B] (FLAG) drops decisions without a hint. Returns (sum of per-decision mean
    KL, number of counted decisions).
    """
    return reverse_kl(student_logits, teacher_logits, mask, attributable, aggregation="decision")


# --------------------------------------------------------------------------------------------
# GRPO.
# --------------------------------------------------------------------------------------------


def masked_log_softmax(logits: Array, mask: Array) -> Array:
    """log softmax over the allowed entries of a discrete action set [..., A]; -inf where ``mask`` is false."""
    return jax.nn.log_softmax(jnp.where(mask, logits, -jnp.inf), axis=-1)


def action_kl(log_probs: Array, target_log_probs: Array) -> Array:
    """KL(pi || target) [...] summed over a discrete action set [..., A]; actions pi never takes contribute 0."""
    p = jnp.exp(log_probs)
    taken = p > 0  # masking both logs first keeps -inf out of the gradient as well as the value
    log_ratio = jnp.where(taken, log_probs, 0.0) - jnp.where(taken, target_log_probs, 0.0)
    return jnp.sum(p * log_ratio, axis=-1)


def action_policy_gradient(
    log_probs: Array, actions: Array, old_logp: Array, advantages: Array, valid: Array, *, clip_eps: float
) -> tuple[Array, Array, dict[str, Array]]:
    """GRPO's clipped surrogate over decisions with one discrete action each: log_probs [D, A] of the
    policy, the taken actions, their sampler log-probs and advantages [D], rows flagged by valid [D].
    Returns `grpo_loss`'s (sum, count, metrics), each decision one token."""
    logp = jnp.take_along_axis(log_probs, actions[:, None], axis=-1)
    return grpo_loss(logp, old_logp[:, None], None, advantages, valid[:, None], clip_eps=clip_eps)


def action_kl_sum(log_probs: Array, target_log_probs: Array, valid: Array) -> Array:
    """Sum over the valid decisions [D] of KL(pi || target) (`action_kl`)."""
    return jnp.sum(jnp.where(valid, action_kl(log_probs, target_log_probs), 0.0))


def group_advantages(rewards: Array, *, eps: float = 1e-4, scale_by_std: bool = True, ddof: int = 1) -> Array:
    """Group-normalized advantages for rewards [G groups, n samples]: (r - mean) / (std + eps).

    ``ddof=1`` (unbiased std) matches TRL's GRPO; ``scale_by_std=False`` only centres (Dr. GRPO).
    """
    r = jnp.asarray(rewards, jnp.float32)
    if r.ndim != 2:
        raise ValueError(f"rewards must be [groups, samples], got shape {r.shape}")
    if scale_by_std and r.shape[1] <= ddof:
        raise ValueError(f"std with ddof={ddof} needs more than {ddof} samples per group")
    # Shift by each group's first reward before averaging: a constant group then centres to exactly
    # zero instead of float32 rounding noise that the std division would blow up.
    shifted = r - r[:, :1]
    centred = shifted - jnp.mean(shifted, axis=1, keepdims=True)
    if not scale_by_std:
        return centred
    return centred / (jnp.std(r, axis=1, ddof=ddof, keepdims=True) + eps)


def grpo_loss(
    logp_new: Array,
    logp_old: Array | None,
    logp_ref: Array | None,
    advantages: Array,
    mask: Array,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    kl_coef: float = 0.0,
    aggregation: Literal["token", "sequence"] = "token",
) -> tuple[Array, Array, dict[str, Array]]:
    """Clipped-ratio GRPO loss with the k3 KL estimator to a reference policy.

    Per token: -min(rho * A, clip(rho, 1 - eps, 1 + eps_high) * A) + kl_coef * k3, where
    rho = exp(logp_new - logp_old) and k3 = exp(ref - new) - (ref - new) - 1 (>= 0, unbiased for
    KL(new || ref)). ``logp_old=None`` means on-policy (rho = 1 with the policy gradient kept);
    ``logp_ref=None`` requires ``kl_coef == 0``. ``advantages`` is [B] (or [B, T]). ``"token"``
    aggregation sums tokens over the batch (count = tokens); ``"sequence"`` averages within each
    sequence first (count = sequences).

    Returns (sum, count, metrics); metrics hold sums (``clipped_tokens``, ``kl_sum``, ``tokens``)
    for exact accumulation and their ratios (``clip_fraction``, ``kl``) for logging.
    """
    if logp_ref is None and kl_coef != 0.0:
        raise ValueError("kl_coef != 0 needs logp_ref")
    if aggregation not in ("token", "sequence"):
        raise ValueError(f"aggregation must be 'token' or 'sequence', got {aggregation!r}")
    eps_low, eps_high = clip_eps, clip_eps if clip_eps_high is None else clip_eps_high
    scored = mask != 0
    # Unscored positions may hold anything (NaN log-probs of padding ids): zero them first, since
    # a NaN there would turn into a NaN gradient through exp() even behind a mask.
    new = jnp.where(scored, logp_new.astype(jnp.float32), 0.0)
    old = new if logp_old is None else jnp.where(scored, logp_old.astype(jnp.float32), 0.0)
    old = lax.stop_gradient(old)
    adv = lax.stop_gradient(jnp.asarray(advantages, jnp.float32))
    adv = adv[:, None] if adv.ndim == 1 else adv  # per sequence [B] or per token [B, T]

    ratio = jnp.exp(new - old)
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = -jnp.minimum(unclipped, clipped)
    if logp_ref is not None:
        delta = lax.stop_gradient(jnp.where(scored, logp_ref.astype(jnp.float32), 0.0)) - new
        k3 = jnp.exp(delta) - delta - 1.0
        per_token = per_token + kl_coef * k3
    else:
        k3 = jnp.zeros_like(new)

    total, count = aggregate(per_token, mask, None, "token" if aggregation == "token" else "decision")

    m = (mask != 0).astype(jnp.float32)
    is_clipped = ((ratio < 1.0 - eps_low) & (adv < 0)) | ((ratio > 1.0 + eps_high) & (adv > 0))
    tokens = jnp.sum(m)
    clipped_tokens = lax.stop_gradient(jnp.sum(m * is_clipped))
    kl_sum = lax.stop_gradient(jnp.sum(jnp.where(m > 0, k3, 0.0)))
    metrics = {
        "clipped_tokens": clipped_tokens,
        "kl_sum": kl_sum,
        "tokens": tokens,
        "clip_fraction": safe_mean(clipped_tokens, tokens),
        "kl": safe_mean(kl_sum, tokens),
    }
    return total, count, metrics


# --------------------------------------------------------------------------------------------
# The same losses from hidden states, chunked with the LM head fused in (for training).
# --------------------------------------------------------------------------------------------


def _flat(hidden: Array) -> Array:
    if hidden.ndim != 3:
        raise ValueError(f"hidden must be [B, T, H], got shape {hidden.shape}")
    return hidden.reshape(-1, hidden.shape[-1])


def token_logprobs_from_hidden(hidden: Array, head: Array, targets: Array, *, chunk_size: int | None = None) -> Array:
    """[B, T] log-probs of ``targets`` under ``hidden [B, T, H] @ head [H, V]``, chunked."""
    lp = fused_kl.chunked_token_logprobs(_flat(hidden), head, targets.reshape(-1), chunk_size=chunk_size)
    return lp.reshape(targets.shape)


def token_cross_entropy_from_hidden(
    hidden: Array,
    head: Array,
    targets: Array,
    mask: Array,
    weights: Array | None = None,
    *,
    aggregation: Aggregation = "token",
    chunk_size: int | None = None,
) -> tuple[Array, Array]:
    """``token_cross_entropy`` computed from hidden states [B, T, H] and head [H, V]."""
    tw, count = aggregation_weights(mask, weights, aggregation)
    total, _ = fused_kl.chunked_token_cross_entropy(
        _flat(hidden),
        head,
        _safe_targets(targets, mask).reshape(-1),
        tw.reshape(-1),
        chunk_size=chunk_size,
    )
    return total, count


def reward_weighted_regression_from_hidden(
    hidden: Array,
    head: Array,
    targets: Array,
    mask: Array,
    rewards: Array,
    *,
    weighting: RwrWeighting = "reward",
    temperature: float = 1.0,
    aggregation: Aggregation = "decision",
    chunk_size: int | None = None,
) -> tuple[Array, Array]:
    """``reward_weighted_regression`` computed from hidden states, chunked."""
    w = rwr_weights(rewards, weighting=weighting, temperature=temperature)
    return token_cross_entropy_from_hidden(
        hidden, head, targets, mask, w, aggregation=aggregation, chunk_size=chunk_size
    )


def opd_loss_from_hidden(
    student_hidden: Array,
    student_head: Array,
    teacher_hidden: Array,
    teacher_head: Array,
    mask: Array,
    attributable: Array | None = None,
    *,
    aggregation: Aggregation = "decision",
    chunk_size: int | None = None,
) -> tuple[Array, Array]:
    """``opd_loss`` from hidden states: student and teacher hidden states [B, T, H] of the same
    sampled action tokens (each under its own context), heads [H, V]. Only the student gets
    gradients."""
    if student_hidden.shape[:2] != teacher_hidden.shape[:2]:
        raise ValueError(
            f"student and teacher hidden states must align: {student_hidden.shape[:2]} vs {teacher_hidden.shape[:2]}"
        )
    tw, count = aggregation_weights(mask, attributable, aggregation)
    total, _ = fused_kl.chunked_reverse_kl(
        _flat(student_hidden),
        student_head,
        _flat(teacher_hidden),
        teacher_head,
        tw.reshape(-1),
        chunk_size=chunk_size,
    )
    return total, count
