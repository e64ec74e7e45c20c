"""Sharding as data: logical axis names on parameters, one rules table to mesh axes.

Parameters are annotated with logical names (`out_sharding` metadata, e.g. ('embed', 'vocab')).
`RULES` maps each logical name to a mesh axis of a ('data', 'fsdp', 'tensor') mesh; a dimension
that does not divide evenly over its mesh axis is replicated instead (e.g. 1 kv head on 2 tensor
shards), so any tiny model runs on any mesh.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axis (or a tuple of mesh axes, or None for replicated)
Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]
RULES: Rules = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("norm", None),
    ("linear_heads", "tensor"),  # Gated DeltaNet value heads
    ("linear_conv", None),  # its fused [q | k | v] channels: head boundaries are not shard boundaries
)


def make_mesh(shape: Sequence[int] | None = None, axis_names: Sequence[str] = MESH_AXES) -> Mesh:
    """A mesh with Auto axes (GSPMD propagation). Default: every device on 'fsdp'."""
    if shape is None:
        shape = tuple(jax.device_count() if name == "fsdp" else 1 for name in axis_names)
    return jax.make_mesh(tuple(shape), tuple(axis_names), axis_types=(AxisType.Auto,) * len(axis_names))


def logical_to_spec(
    axes: Sequence[str | None], rules: Rules = RULES, *, mesh: Mesh | None = None, shape: Sequence[int] | None = None
) -> PartitionSpec:
    """PartitionSpec for logical axes. With mesh and shape, uneven dimensions are replicated."""
    table = dict(rules)
    used: set[str] = set()
    spec = []
    for i, name in enumerate(axes):
        if name is None:
            spec.append(None)
            continue
        if name not in table:
            raise KeyError(f"logical axis {name!r} has no sharding rule (rules cover {sorted(table)})")
        target = table[name]
        mesh_axes = (target,) if isinstance(target, str) else tuple(target or ())
        mesh_axes = tuple(a for a in mesh_axes if a not in used and (mesh is None or a in mesh.shape))
        if mesh is not None and shape is not None:
            size = int(np.prod([mesh.shape[a] for a in mesh_axes]))
            if shape[i] % size:
                mesh_axes = ()
        used.update(mesh_axes)
        spec.append(None if not mesh_axes else mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
    return PartitionSpec(*spec)


def variable_sharding(var: nnx.Variable, mesh: Mesh, rules: Rules = RULES) -> NamedSharding:
    """The NamedSharding of one annotated variable (replicated when it has no logical names)."""
    axes = var.get_metadata().get("out_sharding") or (None,) * len(var.shape)
    return NamedSharding(mesh, logical_to_spec(axes, rules, mesh=mesh, shape=var.shape))


def state_shardings(model: nnx.Module, mesh: Mesh, rules: Rules = RULES) -> nnx.State:
    """A State of NamedShardings, one per array variable of the model."""
    state = nnx.state(model)
    return jax.tree.map(
        lambda v: variable_sharding(v, mesh, rules),
        state,
        is_leaf=lambda x: isinstance(x, nnx.Variable),
    )


def shard_model(model: nnx.Module, mesh: Mesh, rules: Rules = RULES) -> nnx.Module:
    """Moves every variable of the model onto its sharding, in place; returns the model."""
    state = nnx.state(model)
    placed = jax.tree.map(
        lambda v: v.replace(jax.device_put(v[...], variable_sharding(v, mesh, rules))),
        state,
        is_leaf=lambda x: isinstance(x, nnx.Variable),
    )
    nnx.update(model, placed)
    return model


def constrain(x: jax.Array, axes: Sequence[str | None], rules: Rules = RULES) -> jax.Array:
    """Pins an activation's sharding by logical axes under `jax.set_mesh`; a no-op without a mesh.

    Without it GSPMD may keep activations sharded over 'data' only, leaving 'fsdp' devices
    computing the same rows.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, logical_to_spec(axes, rules, mesh=mesh, shape=x.shape))


def data_sharding(mesh: Mesh, rules: Rules = RULES, *, rows: int | None = None) -> NamedSharding:
    """Sharding for [batch, ...] inputs: the batch over the data-parallel axes (replicated when `rows`, the
    batch size, does not divide over them)."""
    return NamedSharding(mesh, logical_to_spec(("batch",), rules, mesh=mesh, shape=None if rows is None else (rows,)))
