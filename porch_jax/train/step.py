"""The jitted train step of any method (methods.py) with exact gradient accumulation.

A global batch is [accum, micro, ...]; the step scans over accum. Every loss part is a (sum,
count) pair whose count depends only on masks, weights and the rows' decision counts, so the step
first computes each part's *global* count from the whole batch, then differentiates
sum / global_count per micro-batch: summed over micro-batches, the gradient is exactly that of the
global mean, whatever the split (the accumulated counts are returned too, for checking and
logging). With one micro-batch the step differentiates that micro-batch's loss directly.

Losses see hidden states gathered at the target positions and the LM head matrix, through the
chunked fused kernels of losses.py, so full [tokens, vocab] logits never exist. Parameters stay
float32 (master copy); the model's compute dtype decides the matmul precision. The train state
{step, params, opt_state} is donated; state shardings are explicit and the batch keeps the
shardings its source placed it with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax import lax

from porch_jax.train import mesh as mesh_lib
from porch_jax.train.methods import Method

TrainState = dict[str, Any]  # {"step": int32 [], "params": nnx.State, "opt_state": optax state}


class TrainStep:
    """A jitted step `(state, batch[, frozen_params]) -> (state, metrics)` for one method.

    `num_traces` counts how many times the step was traced (= compiled): once per batch shape,
    i.e. per (T, K) bucket.
    """

    def __init__(
        self,
        method: Method,
        graphdef: nnx.GraphDef,
        tx: optax.GradientTransformation,
        schedule: optax.Schedule,
        *,
        mesh: jax.sharding.Mesh,
        state_shardings: TrainState,
    ):
        self.method, self.mesh = method, mesh
        self.graphdef, self.tx, self.schedule = graphdef, tx, schedule
        self.num_traces = 0
        self._param_shardings = state_shardings["params"]
        in_shardings = (state_shardings, None)  # None: the batch keeps its source's shardings
        if method.frozen:
            in_shardings += (state_shardings["params"],)
        self._jitted = jax.jit(
            self._step,
            in_shardings=in_shardings,
            out_shardings=(state_shardings, mesh_lib.replicated(mesh)),
            donate_argnums=(0,),
        )
        self._parts = jax.jit(self._parts_impl, out_shardings=mesh_lib.replicated(mesh))

    def __call__(self, state: TrainState, batch: Mapping[str, Any], frozen_params: nnx.State | None = None):
        if self.method.frozen != (frozen_params is not None):
            need = "needs" if self.method.frozen else "takes no"
            raise ValueError(f"method {self.method.name!r} {need} frozen params")
        args = (state, batch) + ((frozen_params,) if self.method.frozen else ())
        with jax.set_mesh(self.mesh):  # traced under the mesh: `sharding.constrain` and the kernels' per-shard calls
            return self._jitted(*args)

    def parts(self, params: nnx.State, batch: Mapping[str, Any], frozen_params: nnx.State | None = None):
        """{part: (sum, count)} of the method on `batch` at `params`, summed over its accumulation steps, with no
        update (a validation loss: `Method.loss(parts, counts)` over several batches' summed parts is their mean)."""
        if self.method.frozen != (frozen_params is not None):
            need = "needs" if self.method.frozen else "takes no"
            raise ValueError(f"method {self.method.name!r} {need} frozen params")
        with jax.set_mesh(self.mesh):
            return self._parts(params, batch, frozen_params)

    def _parts_impl(self, params, batch, frozen_params):
        model = nnx.merge(self.graphdef, params)
        frozen = None if frozen_params is None else self._frozen(frozen_params)

        total = None
        for i in range(jax.tree.leaves(batch)[0].shape[0]):  # accumulation steps: static, few
            parts, _ = self.method.micro_parts(model, frozen, jax.tree.map(lambda x, i=i: x[i], batch))
            total = parts if total is None else jax.tree.map(jnp.add, total, parts)
        return total

    def lower(self, state: TrainState, batch: Mapping[str, Any], frozen_params: nnx.State | None = None):
        """The step lowered for these arguments (arrays or ShapeDtypeStructs with shardings): `.compile()` gives
        XLA's executable and its `memory_analysis()` without running (or allocating) anything."""
        args = (state, batch) + ((frozen_params,) if self.method.frozen else ())
        with jax.set_mesh(self.mesh):
            return self._jitted.lower(*args)

    def _frozen(self, frozen_params: nnx.State) -> nnx.Module:
        """The frozen model (OPD's teacher, GRPO's reference) without layer remat: it runs forward only, under
        stop_gradient, so there is no backward pass to save memory for (and nnx's remat, inside the student's
        gradient trace, refuses to write a module whose parameters come from outside it)."""
        frozen = nnx.merge(self.graphdef, frozen_params)
        if getattr(frozen, "remat", False):
            frozen.remat = False
        return frozen

    def _step(self, state: TrainState, batch: Mapping[str, Any], frozen_params: nnx.State | None = None):
        self.num_traces += 1
        method = self.method
        counts = method.global_counts(batch)

        def loss_fn(params, micro):
            frozen = None if frozen_params is None else self._frozen(frozen_params)
            parts, aux = method.micro_parts(nnx.merge(self.graphdef, params), frozen, micro)
            return method.loss(parts, counts), (parts, aux)

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        first = jax.tree.map(lambda x: x[0], batch)
        if jax.tree.leaves(batch)[0].shape[0] == 1:  # one micro-batch: its own gradient, no accumulator
            (_, (parts, aux)), grads = grad_fn(state["params"], first)
        else:

            def body(carry, micro):
                grads, sums = carry
                (_, out), g = grad_fn(state["params"], micro)
                grads = lax.with_sharding_constraint(jax.tree.map(jnp.add, grads, g), self._param_shardings)
                return (grads, jax.tree.map(jnp.add, sums, out)), None

            _, sums_shape = jax.eval_shape(loss_fn, state["params"], first)

            def zeros(tree):
                return jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), tree)

            init = (lax.with_sharding_constraint(zeros(state["params"]), self._param_shardings), zeros(sums_shape))
            (grads, (parts, aux)), _ = lax.scan(body, init, batch)

        updates, opt_state = self.tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = method.summarize(parts, aux)
        metrics |= {
            "micro_batches": jnp.float32(jax.tree.leaves(batch)[0].shape[0]),  # the accumulation steps, logged
            "grad_norm": optax.global_norm(grads),
            "update_norm": optax.global_norm(updates),
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
