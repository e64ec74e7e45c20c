"""Training methods: what each reads from a batch and which pure loss (losses.py) it calls.

A `Method` is a tuple of loss `Part`s, each a (sum, count) pair with a coefficient; the step
(step.py) minimizes sum_p coef_p * sum_p / count_p with each count taken over the whole global
batch, so it needs no knowledge of any method. `METHODS` maps a method's name to the function
that builds it from its `MethodConfig`:

    sft     cross-entropy on demonstrations                          part "ce"
    rwr     cross-entropy weighted by the episode's reward           part "rwr"
    opod    RWR + opd_weight * OPD (reverse KL to the frozen self-teacher under s + H)   parts "rwr", "opd"
    opd     OPD alone                                                part "opd"
    grpo    clipped-ratio policy gradient on sampled groups (+ k3 KL to a frozen reference)   part "pg"
    dagrpo  GRPO on one-action rows at expert decision contexts, averaged per decision   part "pg"
    maca_grpo  GRPO over a scorer module's discrete actions (MACA's Eq. 10) + target_kl_weight * KL to the
            batch's target distribution (MACA's pi_mix)                      parts "pg", "kl_mix"

Language-model batches hold one row format (packing.py) as typed views (views.py): token rows with
target spans, each target token carrying its decision's weight over its length [B, K], each row its
decision count (`TokenView`); OPD rows hold one sampled action each with the sampler's
log-probabilities and where they exist (`SampledView`), GRPO rows their group advantage too
(`GroupView`). Views are named by role: "policy" (sft, rwr, grpo, dagrpo), "rwr" / "student" /
"teacher" (opod, opd). Every part of a method runs on every batch, and the Trainer refuses a source
that lacks a view a part reads.

MACA's discrete-action batches (maca_grpo, porch_jax/maca/train.py's source) are not a language
model's (`ActionsView`): the model is any module mapping a view's `inputs` to scores [D, A] over a
discrete action set, which the view's `masks` restrict and normalise; each decision holds its taken
action, sampler log-prob, advantage, validity and the target log-probs of the KL part. Parts read what they need
through `Forward`, which computes the LM head only for a model that has one and each view's action
log-probs once, however many parts read them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from porch_jax.train import losses
from porch_jax.train.config import MethodConfig
from porch_jax.train.views import ActionsView, Batch, SampledView, TokenView

Parts = dict[str, tuple[jax.Array, jax.Array]]


# ---------------------------------------------------------------------------------- forward helpers


def gathered_hidden(model: nnx.Module, view: TokenView) -> jax.Array:
    """Final hidden states at the target positions, [B, K, H] (the gather's gradient is a cheap scatter-add)."""
    hidden = model.hidden_states(view.tokens, attention_mask=view.mask)
    return jnp.take_along_axis(hidden, view.index[..., None], axis=1)


def lm_head(model: nnx.Module) -> jax.Array:
    return model.lm_head_kernel().astype(model.dtype)


def _tokens(view: TokenView) -> jax.Array:
    return jnp.sum(view.mask, dtype=jnp.float32)


def _flat_mask(view: TokenView) -> jax.Array:
    return view.target_mask.reshape(-1, view.target_mask.shape[-1])


def _logprob_gap(logp: jax.Array, view: SampledView) -> dict[str, jax.Array]:
    """Sum and count of |trainer - sampler| log-probabilities over sampled tokens (weight sync check)."""
    sampled = view.sampled & view.target_mask
    gap = jnp.where(sampled, jnp.abs(lax.stop_gradient(logp) - view.logprobs), 0.0)
    return {"gap_sum": jnp.sum(gap), "gap_count": jnp.sum(sampled, dtype=jnp.float32)}


@dataclasses.dataclass(frozen=True)
class Forward:
    """One micro-batch's shared forward quantities: the student's LM head (computed once, so its
    gradient sums every part's contribution in one place; None for a model without one, e.g. an
    action scorer), the frozen model, if any, and each "actions" view's log-probs (`action_log_probs`)."""

    model: nnx.Module
    head: jax.Array | None
    frozen: nnx.Module | None
    _scored: dict[str, jax.Array] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, model: nnx.Module, frozen: nnx.Module | None) -> Forward:
        return cls(model, lm_head(model) if hasattr(model, "lm_head_kernel") else None, frozen)

    def action_log_probs(self, name: str, view: ActionsView) -> jax.Array:
        """log pi(a | s) [D, A] of view `name`: the model's scores of its "inputs" normalised over its "masks"
        (computed once per view, so the parts that read it share one forward and one gradient path)."""
        if name not in self._scored:
            self._scored[name] = losses.masked_log_softmax(self.model(view.inputs), view.masks)
        return self._scored[name]


# ------------------------------------------------------------------------------------------- parts


@dataclasses.dataclass(frozen=True)
class CrossEntropy:
    """Cross-entropy on a view's target spans, each token weighted by its decision's weight over its length, so the
    sum over a row is its decisions' weighted means and the count its decisions (SFT, RWR)."""

    name: str
    view: str
    chunk_size: int | None = None
    coef: float = 1.0

    @property
    def views(self) -> tuple[str, ...]:
        return (self.view,)

    def count(self, batch: Batch) -> jax.Array:
        return jnp.sum(batch[self.view].count)

    def __call__(self, forward: Forward, micro: Batch) -> tuple[tuple[jax.Array, jax.Array], dict[str, jax.Array]]:
        v = micro[self.view]
        total, _ = losses.token_cross_entropy_from_hidden(
            gathered_hidden(forward.model, v),
            forward.head,
            v.targets,
            v.target_mask,
            v.weight,
            aggregation="token",
            chunk_size=self.chunk_size,
        )
        return (total, jnp.sum(v.count)), {"tokens": _tokens(v)}


@dataclasses.dataclass(frozen=True)
class Distillation:
    """OPD: full-vocabulary reverse KL(student || sg[frozen teacher]) on the student's sampled action
    tokens, the student reading s and the teacher s + H; averaged within each row's action, then over rows
    (each row one decision)."""

    student: str = "student"
    teacher: str = "teacher"
    chunk_size: int | None = None
    coef: float = 1.0
    name: str = "opd"

    @property
    def views(self) -> tuple[str, ...]:
        return (self.student, self.teacher)

    def count(self, batch: Batch) -> jax.Array:
        return losses.aggregation_weights(_flat_mask(batch[self.student]), None, "decision")[1]

    def __call__(self, forward: Forward, micro: Batch) -> tuple[tuple[jax.Array, jax.Array], dict[str, jax.Array]]:
        s, t = micro[self.student], micro[self.teacher]
        student_hidden = gathered_hidden(forward.model, s)
        teacher_hidden = lax.stop_gradient(gathered_hidden(forward.frozen, t))
        part = losses.opd_loss_from_hidden(
            student_hidden,
            forward.head,
            teacher_hidden,
            lax.stop_gradient(lm_head(forward.frozen)),
            s.target_mask,
            None,
            aggregation="decision",
            chunk_size=self.chunk_size,
        )
        logp = losses.token_logprobs_from_hidden(
            lax.stop_gradient(student_hidden), lax.stop_gradient(forward.head), s.targets, chunk_size=self.chunk_size
        )
        return part, {"tokens": _tokens(s), "teacher_tokens": _tokens(t), **_logprob_gap(logp, s)}


@dataclasses.dataclass(frozen=True)
class PolicyGradient:
    """GRPO's clipped-ratio loss on sampled targets with their per-row "advantage"; tokens without
    sampler log-probabilities (`sampled` false: a recorded sample's appended eos) count as on-policy (ratio 1)."""

    view: str = "policy"
    aggregation: str = "token"
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    kl_coef: float = 0.0
    chunk_size: int | None = None
    coef: float = 1.0
    name: str = "pg"

    @property
    def views(self) -> tuple[str, ...]:
        return (self.view,)

    def count(self, batch: Batch) -> jax.Array:
        agg = "token" if self.aggregation == "token" else "decision"
        return losses.aggregation_weights(_flat_mask(batch[self.view]), None, agg)[1]

    def __call__(self, forward: Forward, micro: Batch) -> tuple[tuple[jax.Array, jax.Array], dict[str, jax.Array]]:
        v = micro[self.view]
        logp = losses.token_logprobs_from_hidden(
            gathered_hidden(forward.model, v), forward.head, v.targets, chunk_size=self.chunk_size
        )
        old = jnp.where(v.sampled, v.logprobs, lax.stop_gradient(logp))
        ref = None
        if self.kl_coef > 0:
            ref = losses.token_logprobs_from_hidden(
                lax.stop_gradient(gathered_hidden(forward.frozen, v)),
                lax.stop_gradient(lm_head(forward.frozen)),
                v.targets,
                chunk_size=self.chunk_size,
            )
        total, count, m = losses.grpo_loss(
            logp,
            old,
            ref,
            v.advantage,
            v.target_mask,
            clip_eps=self.clip_eps,
            clip_eps_high=self.clip_eps_high,
            kl_coef=self.kl_coef,
            aggregation=self.aggregation,
        )
        aux = {
            "tokens": _tokens(v),
            "clipped_tokens": m["clipped_tokens"],
            "kl_sum": m["kl_sum"],
            "scored_tokens": m["tokens"],
            **_logprob_gap(logp, v),
        }
        return (total, count), aux


def _decisions(view: ActionsView) -> jax.Array:
    return jnp.sum(view.valid, dtype=jnp.float32)


@dataclasses.dataclass(frozen=True)
class _OnActions:
    """A part over discrete actions: one view of decisions, counted one per valid decision."""

    view: str = "decisions"

    @property
    def views(self) -> tuple[str, ...]:
        return (self.view,)

    def count(self, batch: Batch) -> jax.Array:
        return _decisions(batch[self.view])


@dataclasses.dataclass(frozen=True)
class ActionPolicyGradient(_OnActions):
    """GRPO's clipped surrogate over a scorer module's discrete actions, one per decision."""

    clip_eps: float = 0.2
    coef: float = 1.0
    name: str = "pg"

    def __call__(self, forward: Forward, micro: Batch) -> tuple[tuple[jax.Array, jax.Array], dict[str, jax.Array]]:
        v = micro[self.view]
        total, count, m = losses.action_policy_gradient(
            forward.action_log_probs(self.view, v),
            v.actions,
            v.old_logp,
            v.advantage,
            v.valid,
            clip_eps=self.clip_eps,
        )
        return (total, count), {"clipped_tokens": m["clipped_tokens"], "scored_tokens": m["tokens"]}


@dataclasses.dataclass(frozen=True)
class ActionKL(_OnActions):
    """KL(pi || target) summed over the action set at each valid decision (MACA: pi_mix)."""

    coef: float = 0.0
    name: str = "kl_mix"

    def __call__(self, forward: Forward, micro: Batch) -> tuple[tuple[jax.Array, jax.Array], dict[str, jax.Array]]:
        v = micro[self.view]
        total = losses.action_kl_sum(forward.action_log_probs(self.view, v), v.target, v.valid)
        return (total, _decisions(v)), {}


Part = CrossEntropy | Distillation | PolicyGradient | ActionPolicyGradient | ActionKL


# ------------------------------------------------------------------------------------------ method


@dataclasses.dataclass(frozen=True)
class Method:
    """A named sum of parts. frozen: whether the step takes a second, frozen parameter set (OPD's
    teacher, GRPO's reference)."""

    name: str
    parts: tuple[Part, ...]
    frozen: bool = False

    @property
    def views(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(v for p in self.parts for v in p.views))

    def global_counts(self, batch: Batch) -> dict[str, jax.Array]:
        """Each part's count over the whole [accum, micro] batch (what its sums are divided by)."""
        return {p.name: p.count(batch) for p in self.parts}

    def micro_parts(self, model: nnx.Module, frozen: nnx.Module | None, micro: Batch) -> tuple[Parts, dict]:
        """(sum, count) of each part on one micro-batch, and additive metric sums."""
        forward = Forward.of(model, frozen)
        parts, aux = {}, {}
        for p in self.parts:
            parts[p.name], extra = p(forward, micro)
            for k, v in extra.items():
                aux[k] = aux[k] + v if k in aux else v
        return parts, aux

    def loss(self, parts: Parts, counts: Mapping[str, jax.Array]) -> jax.Array:
        """sum_p coef_p * sum_p / count_p: the one place a method's parts are combined (OPOD: RWR + lambda * OPD)."""
        total = jnp.zeros((), jnp.float32)
        for p in self.parts:
            if p.name in parts:
                total = total + p.coef * losses.safe_mean(parts[p.name][0], counts[p.name])
        return total

    def summarize(self, parts: Parts, aux: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        """Logged metrics from accumulated parts (whose counts are then the global ones) and aux sums."""
        out = {"loss": self.loss(parts, {k: c for k, (_, c) in parts.items()})}
        for name, (total, count) in parts.items():
            out[name], out[f"{name}_count"] = losses.safe_mean(total, count), count
        if "tokens" in aux:
            out["tokens"] = aux["tokens"]
        if "teacher_tokens" in aux:
            out["teacher_tokens"] = aux["teacher_tokens"]
        if "kl_sum" in aux:
            out["kl"] = losses.safe_mean(aux["kl_sum"], aux["scored_tokens"])
        elif "opd" in out:
            out["kl"] = out["opd"]
        if "clipped_tokens" in aux:
            out["clip_fraction"] = losses.safe_mean(aux["clipped_tokens"], aux["scored_tokens"])
        if "gap_sum" in aux:
            out["logprob_gap"] = losses.safe_mean(aux["gap_sum"], aux["gap_count"])
            out["sampled_tokens"] = aux["gap_count"]
        return out


# ---------------------------------------------------------------------------------------- registry


def _cross_entropy(name: str, view: str, cfg: MethodConfig) -> CrossEntropy:
    return CrossEntropy(name, view, cfg.chunk_size)


def _distillation(cfg: MethodConfig) -> Distillation:
    return Distillation(chunk_size=cfg.chunk_size, coef=cfg.opd_weight)


def _policy_gradient(cfg: MethodConfig, aggregation: str) -> PolicyGradient:
    return PolicyGradient(
        aggregation=aggregation,
        clip_eps=cfg.clip_eps,
        clip_eps_high=cfg.clip_eps_high,
        kl_coef=cfg.kl_coef,
        chunk_size=cfg.chunk_size,
    )


METHODS: dict[str, Callable[[MethodConfig], Method]] = {
    "sft": lambda c: Method("sft", (_cross_entropy("ce", "policy", c),)),
    "rwr": lambda c: Method("rwr", (_cross_entropy("rwr", "policy", c),)),
    "opod": lambda c: Method("opod", (_cross_entropy("rwr", "rwr", c), _distillation(c)), frozen=True),
    "opd": lambda c: Method("opd", (_distillation(c),), frozen=True),
    "grpo": lambda c: Method("grpo", (_policy_gradient(c, c.pg_aggregation),), frozen=c.kl_coef > 0),
    "dagrpo": lambda c: Method("dagrpo", (_policy_gradient(c, "sequence"),), frozen=c.kl_coef > 0),
    "maca_grpo": lambda c: Method(
        "maca_grpo", (ActionPolicyGradient(clip_eps=c.clip_eps), ActionKL(coef=c.target_kl_weight))
    ),
}


def method_for_views(method: MethodConfig, views: tuple[str, ...]) -> MethodConfig:
    """OPOD on a source that holds one of its two parts' rows trains as that part's method, with the same
    coefficient and loss: OPD alone where no SFT rollout succeeded (no RWR rows), RWR alone where no decision was
    flagged (no OPD rows). Every other method reads the views its source yields (the Trainer checks)."""
    if method.name == "opod" and "rwr" not in views:
        return dataclasses.replace(method, name="opd")
    if method.name == "opod" and "student" not in views:
        return dataclasses.replace(method, name="rwr")
    return method


def make_method(cfg: MethodConfig) -> Method:
    if cfg.name not in METHODS:
        raise ValueError(f"unknown method {cfg.name!r} (known: {', '.join(METHODS)})")
    return METHODS[cfg.name](cfg)
