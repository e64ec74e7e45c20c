"""The SFT and OPOD train steps of a named model shape, built the way the trainer builds them (porch_jax/train), on
random weights or on abstract ones: what bench_mfu.py times and aot_memory.py compiles without allocating.

Shapes (`SHAPES`): `tiny` (a toy Qwen3 for CI), `smollm2_135m`, `qwen3_1p7b` and `qwen3_5_9b` (its depth a
parameter: the 9B cut to a few layers keeps the full width). Batches are packed rows (train/packing.py), `rows`
sequences of `seq` tokens on the mesh's batch axes:

- SFT: view "policy", every next-token position a target (K = seq - 1), as a pretraining step counts them.
- OPOD (RWR + OPD, packed rows): view "rwr" as SFT's; OPD's "student" and "teacher" rows of `seq` tokens whose
  last `action` tokens are the sampled action. The student trains on both; the frozen teacher (a second parameter
  set, the step's `frozen_params`) runs forward only, with its own LM head over the action.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from porch_jax.models import ModelConfig, init_model
from porch_jax.models.presets import preset
from porch_jax.train import optim
from porch_jax.train import step as step_lib
from porch_jax.train.config import OptimizerConfig
from porch_jax.train.methods import MethodConfig, make_method
from porch_jax.train.packing import SeqRow, Span, scored_batch, seq_batch
from porch_jax.train.sources import place

TINY: dict[str, Any] = {
    "model_type": "qwen3",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "tie_word_embeddings": True,
    "max_position_embeddings": 4096,
}
SHAPES = ("tiny", "smollm2_135m", "qwen3_1p7b", "qwen3_5_9b")
METHODS = ("sft", "opod")


def shape_config(name: str, layers: int | None = None) -> dict[str, Any]:
    """The config.json dict of shape `name`; `layers` cuts (or deepens) it, keeping its width."""
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r} (known: {', '.join(SHAPES)})")
    hf = dict(TINY) if name == "tiny" else preset({"smollm2_135m": "smollm2-135m", "qwen3_1p7b": "qwen3-1.7b",
                                                   "qwen3_5_9b": "qwen3.5-9b"}[name])  # fmt: skip
    if layers:
        hf = (
            preset("qwen3.5-9b", num_hidden_layers=layers)
            if name == "qwen3_5_9b"
            else hf | {"num_hidden_layers": layers}
        )
    return hf


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """One benchmarked step: a shape, a method, `rows` x `seq` tokens per view, OPD's `action` tokens, the compute
    dtype ("float32" or "bfloat16"; parameters and AdamW moments stay float32) and layer remat."""

    shape: str = "tiny"
    method: str = "sft"
    rows: int = 4
    seq: int = 256
    action: int = 64
    dtype: str = "bfloat16"
    remat: bool = False
    layers: int | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if not 0 < self.action < self.seq:
            raise ValueError(f"action must be in (0, seq), got action={self.action}, seq={self.seq}")

    @property
    def hf(self) -> dict[str, Any]:
        return shape_config(self.shape, self.layers)

    def views(self) -> dict[str, tuple[int, bool]]:
        """{view: (target tokens per row, trained)}: what the step's FLOPs and tokens are counted over."""
        if self.method == "sft":
            return {"policy": (self.seq - 1, True)}
        return {"rwr": (self.seq - 1, True), "student": (self.action, True), "teacher": (self.action, False)}


def host_batch(spec: StepSpec, seed: int = 0) -> dict[str, Any]:
    """Random token rows in the one row format of spec's method (numpy, [rows, ...] per view)."""
    rng = np.random.default_rng(seed)
    vocab, t = spec.hf["vocab_size"], spec.seq

    def tokens() -> tuple[int, ...]:
        return tuple(int(x) for x in rng.integers(0, vocab, t))

    whole = seq_batch([SeqRow(tokens(), (Span(1, t - 1),)) for _ in range(spec.rows)], t, t - 1)
    if spec.method == "sft":
        return {"policy": whole}
    prompt = t - spec.action
    rows = [tokens() for _ in range(spec.rows)]
    prompts, actions = [r[:prompt] for r in rows], [r[prompt:] for r in rows]
    return {
        "rwr": whole,
        "student": scored_batch(prompts, actions, t, spec.action),
        "teacher": scored_batch(prompts, actions, t, spec.action),
    }


@dataclasses.dataclass
class BuiltStep:
    """A jitted step with what it is called on; `state`/`frozen` are arrays, or ShapeDtypeStructs when abstract."""

    step: step_lib.TrainStep
    state: Any
    batch: Any
    frozen: Any

    def args(self) -> tuple:
        return (self.state, self.batch) + ((self.frozen,) if self.frozen is not None else ())

    def __call__(self) -> dict[str, jax.Array]:
        """One step (concrete only); the state is donated and replaced."""
        self.state, metrics = self.step(*self.args())
        return metrics

    def lower(self):
        """The step lowered for its arguments (abstract or concrete)."""
        return self.step.lower(*self.args())


def build(spec: StepSpec, mesh: jax.sharding.Mesh, *, abstract: bool = False, seed: int = 0) -> BuiltStep:
    """The step of `spec` on `mesh`: random weights placed on the mesh, or (abstract) ShapeDtypeStructs carrying the
    trainer's shardings, nothing allocated but the batch."""
    config = ModelConfig.from_hf(spec.hf)
    dtype = jnp.dtype(spec.dtype)

    def make() -> nnx.Module:
        return init_model(config, seed, dtype=dtype, mesh=None if abstract else mesh, remat=spec.remat)

    tx_cfg = OptimizerConfig(learning_rate=1e-5, warmup_steps=0, total_steps=1000)
    tx, schedule = optim.make_optimizer(tx_cfg), optim.learning_rate_schedule(tx_cfg)
    method = make_method(MethodConfig(name=spec.method))
    if abstract:
        model = nnx.eval_shape(make)
        graphdef = nnx.split(model, nnx.Param, ...)[0]
        shardings = step_lib.train_state_shardings_of(model, tx, mesh)
        state = step_lib.abstract_train_state(model, tx, mesh)
        frozen = state["params"] if method.frozen else None
    else:
        model = make()
        graphdef, state, shardings = step_lib.init_train_state(model, tx, mesh)
        frozen = jax.tree.map(jnp.copy, state["params"]) if method.frozen else None
    step = step_lib.TrainStep(method, graphdef, tx, schedule, mesh=mesh, state_shardings=shardings)
    return BuiltStep(step, state, place(host_batch(spec, seed), mesh), frozen)
