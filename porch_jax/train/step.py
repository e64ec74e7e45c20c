"""The jitted train step of each method (sft, rwr, opod, grpo) with exact gradient accumulation.

A global batch is [accum, micro, ...]; the step scans over accum. Every loss part is a (sum,
count) pair whose count depends only on masks and weights, so the step first computes each
part's *global* count from the whole batch, then differentiates sum / global_count per
micro-batch: summed over micro-batches, the gradient is exactly that of the global mean,
whatever the split (the accumulated counts are returned too, for checking and logging).

Losses see hidden states gathered at the target positions (see data.py) and the LM head matrix,
through the chunked fused kernels of losses.py, so full [tokens, vocab] logits never exist.
Parameters stay float32 (master copy); the model's compute dtype decides the matmul precision.
The train state {step, params, opt_state} is donated, and all in/out shardings are explicit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax import lax

from porch_jax.train import losses
from porch_jax.train import mesh as mesh_lib

TrainState = dict[str, Any]  # {"step": int32 [], "params": nnx.State, "opt_state": optax state}
Parts = dict[str, tuple[jax.Array, jax.Array]]


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """aggregation: "token" or "decision" (the paper's per-decision mean, for RWR/OPD).
    opd_weight: λ of OPOD. grpo_*: see losses.grpo_loss. grpo_kl_coef > 0 needs reference params.
    chunk_size: tokens per fused LM-head chunk (None: automatic)."""

    aggregation: str = "token"
    opd_weight: float = 1.0
    grpo_clip_eps: float = 0.2
    grpo_clip_eps_high: float | None = None
    grpo_kl_coef: float = 0.0
    grpo_aggregation: str = "token"
    chunk_size: int | None = None


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    """What a method reads and optimizes.

    views/scalars: the batch layout (data.collate). parts: loss part -> (the view whose target
    mask and, if weighted, per-row weight define its count, its coefficient name in LossConfig or
    None for 1). frozen: whether the step takes a second, frozen parameter set (OPD's teacher,
    GRPO's reference).
    """

    views: tuple[str, ...]
    parts: Mapping[str, tuple[str, bool, str | None]]
    scalars: tuple[str, ...] = ()
    frozen: bool = False


def method_spec(method: str, cfg: LossConfig) -> MethodSpec:
    if method == "sft":
        return MethodSpec(("policy",), {"ce": ("policy", True, None)})
    if method == "rwr":
        return MethodSpec(("policy",), {"rwr": ("policy", True, None)})
    if method == "opod":
        parts = {"rwr": ("rwr", True, None), "opd": ("student", True, "opd_weight")}
        return MethodSpec(("rwr", "student", "teacher"), parts, frozen=True)
    if method == "grpo":
        return MethodSpec(("policy",), {"pg": ("policy", False, None)}, ("advantage",), frozen=cfg.grpo_kl_coef > 0)
    raise ValueError(f"unknown method {method!r} (known: sft, rwr, opod, grpo)")


def _count_aggregation(part: str, cfg: LossConfig) -> str:
    if part == "pg":
        return "token" if cfg.grpo_aggregation == "token" else "decision"
    return cfg.aggregation


# ------------------------------------------------------------------------------- forward parts


def _gathered_hidden(model: nnx.Module, view: Mapping[str, jax.Array]) -> jax.Array:
    """Final hidden states at the target positions, [B, K, H] (the gather's gradient is a cheap scatter-add)."""
    hidden = model.hidden_states(view["tokens"], attention_mask=view["mask"])
    return jnp.take_along_axis(hidden, view["index"][..., None], axis=1)


def _head(model: nnx.Module) -> jax.Array:
    return model.lm_head_kernel().astype(model.dtype)


def _logprob_gap(logp: jax.Array, view: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """Sum and count of |trainer - sampler| log-probabilities over sampled tokens (weight sync check)."""
    sampled = view["sampled"] & view["target_mask"]
    gap = jnp.where(sampled, jnp.abs(lax.stop_gradient(logp) - view["logprobs"]), 0.0)
    return {"gap_sum": jnp.sum(gap), "gap_count": jnp.sum(sampled, dtype=jnp.float32)}


def _tokens(*views: Mapping[str, jax.Array]) -> jax.Array:
    return sum(jnp.sum(v["mask"], dtype=jnp.float32) for v in views)


def micro_parts(
    method: str, cfg: LossConfig, model: nnx.Module, frozen: nnx.Module | None, micro: Mapping[str, Any]
) -> tuple[Parts, dict[str, jax.Array]]:
    """(sum, count) of each loss part on one micro-batch, and additive metric sums."""
    if method in ("sft", "rwr"):
        v = micro["policy"]
        part = losses.token_cross_entropy_from_hidden(
            _gathered_hidden(model, v),
            _head(model),
            v["targets"],
            v["target_mask"],
            v["weight"],
            aggregation=cfg.aggregation,
            chunk_size=cfg.chunk_size,
        )
        return {"ce" if method == "sft" else "rwr": part}, {"tokens": _tokens(v)}
    if method == "opod":
        r, s, t = micro["rwr"], micro["student"], micro["teacher"]
        head = _head(model)
        rwr = losses.token_cross_entropy_from_hidden(
            _gathered_hidden(model, r),
            head,
            r["targets"],
            r["target_mask"],
            r["weight"],
            aggregation=cfg.aggregation,
            chunk_size=cfg.chunk_size,
        )
        student_hidden = _gathered_hidden(model, s)
        teacher_hidden = lax.stop_gradient(_gathered_hidden(frozen, t))
        opd = losses.opd_loss_from_hidden(
            student_hidden,
            head,
            teacher_hidden,
            lax.stop_gradient(_head(frozen)),
            s["target_mask"],
            s["weight"],
            aggregation=cfg.aggregation,
            chunk_size=cfg.chunk_size,
        )
        logp = losses.token_logprobs_from_hidden(
            lax.stop_gradient(student_hidden), lax.stop_gradient(head), s["targets"], chunk_size=cfg.chunk_size
        )
        aux = {"tokens": _tokens(r, s), "teacher_tokens": _tokens(t), **_logprob_gap(logp, s)}
        return {"rwr": rwr, "opd": opd}, aux
    if method == "grpo":
        v = micro["policy"]
        logp = losses.token_logprobs_from_hidden(
            _gathered_hidden(model, v), _head(model), v["targets"], chunk_size=cfg.chunk_size
        )
        # Tokens without sampler log-probabilities are treated as on-policy (ratio 1).
        old = jnp.where(v["sampled"], v["logprobs"], lax.stop_gradient(logp))
        ref = None
        if frozen is not None:
            ref = losses.token_logprobs_from_hidden(
                lax.stop_gradient(_gathered_hidden(frozen, v)),
                lax.stop_gradient(_head(frozen)),
                v["targets"],
                chunk_size=cfg.chunk_size,
            )
        total, count, m = losses.grpo_loss(
            logp,
            old,
            ref,
            micro["advantage"],
            v["target_mask"],
            clip_eps=cfg.grpo_clip_eps,
            clip_eps_high=cfg.grpo_clip_eps_high,
            kl_coef=cfg.grpo_kl_coef,
            aggregation=cfg.grpo_aggregation,
        )
        aux = {
            "tokens": _tokens(v),
            "clipped_tokens": m["clipped_tokens"],
            "kl_sum": m["kl_sum"],
            "scored_tokens": m["tokens"],
            **_logprob_gap(logp, v),
        }
        return {"pg": (total, count)}, aux
    raise ValueError(f"unknown method {method!r}")


def global_counts(spec: MethodSpec, cfg: LossConfig, batch: Mapping[str, Any]) -> dict[str, jax.Array]:
    """Each part's count over the whole [accum, micro] batch (what its sums are divided by)."""
    out = {}
    for part, (view, weighted, _) in spec.parts.items():
        v = batch[view]
        mask = v["target_mask"].reshape(-1, v["target_mask"].shape[-1])
        weights = v["weight"].reshape(-1) if weighted else None
        out[part] = losses.aggregation_weights(mask, weights, _count_aggregation(part, cfg))[1]
    return out


# ------------------------------------------------------------------------------------ the step


def _summarize(spec: MethodSpec, cfg: LossConfig, parts: Parts, aux: dict[str, jax.Array]) -> dict[str, jax.Array]:
    out = {"loss": jnp.zeros((), jnp.float32)}
    for part, (_, _, coef) in spec.parts.items():
        mean = losses.safe_mean(*parts[part])
        out[part], out[f"{part}_count"] = mean, parts[part][1]
        out["loss"] = out["loss"] + (getattr(cfg, coef) if coef else 1.0) * mean
    out["tokens"] = aux["tokens"]
    if "opd" in parts:
        out["kl"] = out["opd"]
    if "kl_sum" in aux:
        out["kl"] = losses.safe_mean(aux["kl_sum"], aux["scored_tokens"])
        out["clip_fraction"] = losses.safe_mean(aux["clipped_tokens"], aux["scored_tokens"])
    if "gap_sum" in aux:
        out["logprob_gap"] = losses.safe_mean(aux["gap_sum"], aux["gap_count"])
        out["sampled_tokens"] = aux["gap_count"]
    if "teacher_tokens" in aux:
        out["teacher_tokens"] = aux["teacher_tokens"]
    return out


class TrainStep:
    """A jitted step `(state, batch[, frozen_params]) -> (state, metrics)` for one method.

    `num_traces` counts how many times the step was traced (= compiled): once per batch shape,
    i.e. per (T, K) bucket.
    """

    def __init__(
        self,
        method: str,
        graphdef: nnx.GraphDef,
        tx: optax.GradientTransformation,
        schedule: optax.Schedule,
        cfg: LossConfig,
        *,
        mesh: jax.sharding.Mesh,
        state_shardings: TrainState,
    ):
        self.method, self.cfg, self.spec, self.mesh = method, cfg, method_spec(method, cfg), mesh
        self.graphdef, self.tx, self.schedule = graphdef, tx, schedule
        self.num_traces = 0
        self._param_shardings = state_shardings["params"]
        batch_shardings = mesh_lib.batch_shardings(mesh, self.spec.views, self.spec.scalars)
        in_shardings = (state_shardings, batch_shardings)
        if self.spec.frozen:
            in_shardings += (state_shardings["params"],)
        self._jitted = jax.jit(
            self._step,
            in_shardings=in_shardings,
            out_shardings=(state_shardings, mesh_lib.replicated(mesh)),
            donate_argnums=(0,),
        )

    def __call__(self, state: TrainState, batch: Mapping[str, Any], frozen_params: nnx.State | None = None):
        if self.spec.frozen != (frozen_params is not None):
            raise ValueError(f"method {self.method!r} {'needs' if self.spec.frozen else 'takes no'} frozen params")
        args = (state, batch) + ((frozen_params,) if self.spec.frozen else ())
        with jax.set_mesh(self.mesh):  # traced under the mesh: `sharding.constrain` and the kernels' per-shard calls
            return self._jitted(*args)

    def _step(self, state: TrainState, batch: Mapping[str, Any], frozen_params: nnx.State | None = None):
        self.num_traces += 1
        counts = global_counts(self.spec, self.cfg, batch)
        frozen = None if frozen_params is None else nnx.merge(self.graphdef, frozen_params)

        def loss_fn(params, micro):
            parts, aux = micro_parts(self.method, self.cfg, nnx.merge(self.graphdef, params), frozen, micro)
            loss = jnp.zeros((), jnp.float32)
            for part, (_, _, coef) in self.spec.parts.items():
                scale = getattr(self.cfg, coef) if coef else 1.0
                loss = loss + scale * losses.safe_mean(parts[part][0], counts[part])
            return loss, (parts, aux)

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

        def body(carry, micro):
            grads, sums = carry
            (_, out), g = grad_fn(state["params"], micro)
            grads = lax.with_sharding_constraint(jax.tree.map(jnp.add, grads, g), self._param_shardings)
            return (grads, jax.tree.map(jnp.add, sums, out)), None

        first = jax.tree.map(lambda x: x[0], batch)
        _, sums_shape = jax.eval_shape(loss_fn, state["params"], first)
        zeros = lambda tree: jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), tree)
        init = (lax.with_sharding_constraint(zeros(state["params"]), self._param_shardings), zeros(sums_shape))
        (grads, (parts, aux)), _ = lax.scan(body, init, batch)

        updates, opt_state = self.tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = _summarize(self.spec, self.cfg, parts, aux)
        metrics |= {
            "grad_norm": optax.tree.norm(grads),
            "update_norm": optax.tree.norm(updates),
            "learning_rate": self.schedule(state["step"]),
        }
        return {"step": state["step"] + 1, "params": params, "opt_state": opt_state}, metrics


def init_train_state(
    model: nnx.Module, tx: optax.GradientTransformation, mesh: jax.sharding.Mesh
) -> tuple[nnx.GraphDef, TrainState, TrainState]:
    """Splits the model into (graphdef, state, state shardings), placing everything on the mesh.

    Only nnx.Param variables are trained; a model holding other variables is rejected, since
    they would silently be dropped from checkpoints.
    """
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    if jax.tree.leaves(rest):
        raise ValueError(f"model has non-Param state the trainer does not handle: {list(nnx.to_flat_state(rest))[:3]}")
    shardings = train_state_shardings_of(model, tx, mesh)
    params = jax.device_put(
        params, shardings["params"], may_alias=False
    )  # the state is donated: never alias the model's arrays
    opt_state = jax.jit(tx.init, out_shardings=shardings["opt_state"])(params)
    step = jax.device_put(jnp.zeros((), jnp.int32), shardings["step"])
    return graphdef, {"step": step, "params": params, "opt_state": opt_state}, shardings


def train_state_shardings_of(
    model: nnx.Module, tx: optax.GradientTransformation, mesh: jax.sharding.Mesh
) -> TrainState:
    """Shardings of the train state of `model` (concrete or abstract) on `mesh`."""
    params = nnx.state(model, nnx.Param)
    return mesh_lib.train_state_shardings(tx, params, mesh_lib.param_shardings(model, mesh), mesh)


def abstract_train_state(model: nnx.Module, tx: optax.GradientTransformation, mesh: jax.sharding.Mesh) -> TrainState:
    """ShapeDtypeStructs with shardings on `mesh`: the target to restore a checkpoint onto any mesh."""
    params = nnx.state(model, nnx.Param)
    shapes = {
        "step": jax.ShapeDtypeStruct((), jnp.int32),
        "params": params,
        "opt_state": jax.eval_shape(tx.init, params),
    }
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), shapes)
    return mesh_lib.abstract_like(shapes, train_state_shardings_of(model, tx, mesh))
