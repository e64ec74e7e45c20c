"""The training mesh and the shardings of everything a step touches, derived from one rules table.

Parameters follow the model's logical-axis rules (porch_jax.models.sharding.RULES); optimizer
moments mirror their parameter; batches are [accum, micro, ...] with micro over the rules'
'batch' axes; step counters and metrics are replicated. Nothing here depends on the mesh shape,
so one code path serves 1 device, 8 fake CPU devices and a multi-host mesh.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import optax
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from porch_jax.models import sharding as model_sharding


def make_mesh(shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh with Auto axes (GSPMD propagation) over `devices` (default: all).

    A shape smaller than the device list uses its first devices (a 1-device reference run on a
    host with 8 fake devices); across processes it must cover all of them.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) != len(model_sharding.MESH_AXES):
        raise ValueError(f"mesh shape must be (data, fsdp, tensor), got {shape}")
    devices = list(jax.devices() if devices is None else devices)
    n = shape[0] * shape[1] * shape[2]
    if n > len(devices) or (jax.process_count() > 1 and n != len(devices)):
        raise ValueError(f"mesh shape {shape} needs {n} devices, found {len(devices)}")
    axis_types = (AxisType.Auto,) * len(shape)
    return jax.make_mesh(shape, model_sharding.MESH_AXES, axis_types=axis_types, devices=devices[:n])


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_spec(rules: model_sharding.Rules = model_sharding.RULES, mesh: Mesh | None = None) -> PartitionSpec:
    """[accum, micro, ...]: accumulation steps unsharded, micro-batch rows over the 'batch' axes."""
    (axes,) = model_sharding.logical_to_spec(("batch",), rules, mesh=mesh)
    return PartitionSpec(None, axes)


def param_shardings(
    model: nnx.Module, mesh: Mesh, wrt=nnx.Param, rules: model_sharding.Rules = model_sharding.RULES
) -> nnx.State:
    """The model's `wrt` state with each array replaced by its NamedSharding (same tree structure,
    so it serves as jit in/out shardings and as an optax tree_map_params target). Works on an
    abstract model too."""
    return jax.tree.map(
        lambda v: v.replace(model_sharding.variable_sharding(v, mesh, rules)),
        nnx.state(model, wrt),
        is_leaf=lambda x: isinstance(x, nnx.Variable),
    )


def opt_state_shardings(tx: optax.GradientTransformation, params: nnx.State, shardings: nnx.State, mesh: Mesh):
    """Optimizer-state shardings: each per-parameter leaf (Adam moments) like its parameter, the rest replicated."""
    abstract = jax.eval_shape(tx.init, params)
    return optax.tree_map_params(
        tx,
        lambda _, s: s,
        abstract,
        shardings,
        transform_non_params=lambda _: replicated(mesh),
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )


def train_state_shardings(
    tx: optax.GradientTransformation, params: nnx.State, shardings: nnx.State, mesh: Mesh
) -> dict:
    """Shardings of the train state {step, params, opt_state}."""
    return {
        "step": replicated(mesh),
        "params": shardings,
        "opt_state": opt_state_shardings(tx, params, shardings, mesh),
    }


def abstract_like(tree: Any, shardings: Any = None) -> Any:
    """ShapeDtypeStructs carrying `shardings` (default: each array's own): a restore target for a (possibly
    different) mesh."""
    if shardings is None:
        shardings = jax.tree.map(lambda x: x.sharding, tree)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def describe(shardings: Mapping | nnx.State) -> dict[str, str]:
    """{path: spec} for logs and tests."""
    return {
        jax.tree_util.keystr(path): str(s.spec)
        for path, s in jax.tree_util.tree_flatten_with_path(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))[
            0
        ]
    }
