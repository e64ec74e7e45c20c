"""Hugging Face safetensors folders in and out, and model construction by model_type.

Each model type has a `ModelSpec`: its class and a table of `WeightRule`s from HF tensor names
to our module paths. The table is used both ways (import and export), every tensor is checked
against the shape the config implies, and nothing is silently dropped or left uninitialised.
A new architecture registers another spec in `MODEL_SPECS`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from safetensors import safe_open
from safetensors.numpy import save_file

from porch_jax.models.config import ModelConfig
from porch_jax.models.qwen3 import Qwen3ForCausalLM
from porch_jax.models.qwen3_5 import Qwen3_5ForCausalLM
from porch_jax.models.sharding import RULES, Rules, shard_model, variable_sharding


class CheckpointError(ValueError):
    """A weights folder that does not match its config; the message names the tensor."""


@dataclasses.dataclass(frozen=True)
class WeightRule:
    """One HF tensor name <-> one parameter path; `{i}` stands for a layer index.

    in_dims = 0: stored as is. in_dims = n > 0: an HF Linear weight [out, in] whose kernel here is
    [*in, *out] with n leading input dims (e.g. o_proj [heads, head_dim, hidden] has in_dims 2).
    """

    hf: str
    ours: str
    in_dims: int = 0

    def match(self, name: str, *, hf: bool) -> str | None:
        """The name on the other side when `name` matches this rule, else None."""
        src, dst = (self.hf, self.ours) if hf else (self.ours, self.hf)
        m = re.fullmatch(re.escape(src).replace(r"\{i\}", r"(?P<i>\d+)"), name)
        return None if m is None else dst.format(**m.groupdict())

    def hf_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if not self.in_dims:
            return tuple(shape)
        return math.prod(shape[self.in_dims :]), math.prod(shape[: self.in_dims])

    def to_ours(self, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return array.T.reshape(shape) if self.in_dims else array

    def to_hf(self, array: np.ndarray) -> np.ndarray:
        if not self.in_dims:
            return array
        return array.reshape(math.prod(array.shape[: self.in_dims]), -1).T


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    model_cls: type[nnx.Module]
    weights: tuple[WeightRule, ...]
    ignored: tuple[str, ...] = ()  # regexes of HF tensors that exist but are not parameters here
    ignored_when_tied: tuple[str, ...] = ()  # HF tensors duplicated by tied embeddings


def _layer_rule(hf: str, ours: str, in_dims: int = 0) -> WeightRule:
    return WeightRule(f"model.layers.{{i}}.{hf}", f"layers.{{i}}.{ours}", in_dims)


QWEN3 = ModelSpec(
    model_cls=Qwen3ForCausalLM,
    weights=(
        WeightRule("model.embed_tokens.weight", "embed_tokens"),
        WeightRule("model.norm.weight", "norm.weight"),
        WeightRule("lm_head.weight", "lm_head", 1),
        _layer_rule("input_layernorm.weight", "input_layernorm.weight"),
        _layer_rule("post_attention_layernorm.weight", "post_attention_layernorm.weight"),
        _layer_rule("self_attn.q_proj.weight", "self_attn.q_proj", 1),
        _layer_rule("self_attn.k_proj.weight", "self_attn.k_proj", 1),
        _layer_rule("self_attn.v_proj.weight", "self_attn.v_proj", 1),
        _layer_rule("self_attn.o_proj.weight", "self_attn.o_proj", 2),
        _layer_rule("self_attn.q_norm.weight", "self_attn.q_norm.weight"),
        _layer_rule("self_attn.k_norm.weight", "self_attn.k_norm.weight"),
        _layer_rule("mlp.gate_proj.weight", "mlp.gate_proj", 1),
        _layer_rule("mlp.up_proj.weight", "mlp.up_proj", 1),
        _layer_rule("mlp.down_proj.weight", "mlp.down_proj", 1),
    ),
    ignored=(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
    ignored_when_tied=(r"lm_head\.weight",),
)


def _qwen3_5(prefix: str, ignored: tuple[str, ...] = ()) -> ModelSpec:
    """Qwen3.5 text weights under `prefix`: "model." in a text checkpoint, "model.language_model."
    in a multimodal one (whose vision tower is not loaded). MTP (speculative) heads are dropped."""

    def layer(hf: str, ours: str, in_dims: int = 0) -> WeightRule:
        return WeightRule(f"{prefix}layers.{{i}}.{hf}", f"layers.{{i}}.{ours}", in_dims)

    return ModelSpec(
        model_cls=Qwen3_5ForCausalLM,
        weights=(
            WeightRule(f"{prefix}embed_tokens.weight", "embed_tokens"),
            WeightRule(f"{prefix}norm.weight", "norm.weight"),
            WeightRule("lm_head.weight", "lm_head", 1),
            layer("input_layernorm.weight", "input_layernorm.weight"),
            layer("post_attention_layernorm.weight", "post_attention_layernorm.weight"),
            *(layer(f"mlp.{p}.weight", f"mlp.{p}", 1) for p in ("gate_proj", "up_proj", "down_proj")),
            *(layer(f"self_attn.{p}.weight", f"self_attn.{p}", 1) for p in ("q_proj", "k_proj", "v_proj")),
            layer("self_attn.o_proj.weight", "self_attn.o_proj", 2),
            layer("self_attn.q_norm.weight", "self_attn.q_norm.weight"),
            layer("self_attn.k_norm.weight", "self_attn.k_norm.weight"),
            *(
                layer(f"linear_attn.{p}.weight", f"linear_attn.{p}", 1)
                for p in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
            ),
            layer("linear_attn.conv1d.weight", "linear_attn.conv1d"),
            layer("linear_attn.dt_bias", "linear_attn.dt_bias"),
            layer("linear_attn.A_log", "linear_attn.A_log"),
            layer("linear_attn.norm.weight", "linear_attn.norm.weight"),
            layer("linear_attn.out_proj.weight", "linear_attn.out_proj", 2),
        ),
        ignored=(r"mtp\..*", *ignored),
        ignored_when_tied=(r"lm_head\.weight",),
    )


MODEL_SPECS: dict[str, ModelSpec] = {
    "qwen3": QWEN3,
    "qwen3_5_text": _qwen3_5("model."),
    "qwen3_5": _qwen3_5("model.language_model.", ignored=(r"model\.visual\..*",)),
}


def _spec(config: ModelConfig) -> ModelSpec:
    if config.model_type not in MODEL_SPECS:
        raise CheckpointError(f"model_type {config.model_type!r} has no registered model class")
    return MODEL_SPECS[config.model_type]


def init_model(
    config: ModelConfig,
    seed: int = 0,
    *,
    dtype=jnp.float32,
    param_dtype=jnp.float32,
    mesh: Mesh | None = None,
    rules: Rules | None = None,
    **model_kwargs: Any,
) -> nnx.Module:
    """A randomly initialised model (HF-like: normal(0, initializer_range), norms at 1)."""
    model = _spec(config).model_cls(config, rngs=nnx.Rngs(seed), dtype=dtype, param_dtype=param_dtype, **model_kwargs)
    return model if mesh is None else shard_model(model, mesh, rules or RULES)


def _dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def _tensor_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index} has no 'weight_map'")
        files = [path / f for f in sorted(set(weight_map.values()))]
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors files in {path}")
    for file in files:
        if not file.is_file():
            raise CheckpointError(f"weights file {file.name} listed in {index.name} is missing")
    return files


def _read_tensors(path: Path) -> Iterator[tuple[str, np.ndarray]]:
    seen: set[str] = set()
    for file in _tensor_files(path):
        with safe_open(file, framework="numpy") as f:
            for name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                if name in seen:
                    raise CheckpointError(f"tensor {name!r} appears in more than one file ({file.name})")
                seen.add(name)
                yield name, f.get_tensor(name)


def from_pretrained(
    path: str | Path,
    dtype=jnp.float32,
    param_dtype=None,
    mesh: Mesh | None = None,
    rules: Rules | None = None,
    **model_kwargs: Any,
) -> nnx.Module:
    """Loads an HF safetensors folder (single file or sharded with an index).

    param_dtype defaults to dtype. With a mesh, each tensor goes straight onto its sharding.
    Raises ConfigError / CheckpointError naming the field or tensor at fault.
    """
    path = Path(path)
    config = ModelConfig.from_pretrained(path)
    spec = _spec(config)
    param_dtype = param_dtype or dtype
    abstract = nnx.eval_shape(
        lambda: spec.model_cls(config, rngs=nnx.Rngs(0), dtype=dtype, param_dtype=param_dtype, **model_kwargs)
    )
    graphdef, state = nnx.split(abstract)
    targets = {_dotted(p): v for p, v in nnx.to_flat_state(state)}
    ignored = spec.ignored + (spec.ignored_when_tied if config.tie_word_embeddings else ())
    values: dict[str, jax.Array] = {}
    for name, array in _read_tensors(path):
        if any(re.fullmatch(pattern, name) for pattern in ignored):
            continue
        ours, rule = _match(spec, name, hf=True)
        if ours not in targets:
            raise CheckpointError(f"unexpected tensor {name!r} in {path} (no parameter {ours!r} in this config)")
        var = targets[ours]
        expected = rule.hf_shape(var.shape)
        if tuple(array.shape) != expected:
            raise CheckpointError(f"tensor {name!r} has shape {tuple(array.shape)}, but the config implies {expected}")
        array = rule.to_ours(array, var.shape).astype(var.dtype)
        sharding = variable_sharding(var, mesh, rules or RULES) if mesh is not None else None
        values[ours] = jax.device_put(array, sharding)
    missing = [ours for ours in targets if ours not in values]
    if missing:
        names = [_match(spec, ours, hf=False)[0] for ours in missing]
        raise CheckpointError(f"{len(names)} tensor(s) missing from {path}: {', '.join(names)}")
    flat = [(p, v.replace(values[_dotted(p)])) for p, v in nnx.to_flat_state(state)]
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def _match(spec: ModelSpec, name: str, *, hf: bool) -> tuple[str, WeightRule]:
    for rule in spec.weights:
        other = rule.match(name, hf=hf)
        if other is not None:
            return other, rule
    kind = "tensor" if hf else "parameter"
    raise CheckpointError(f"unexpected {kind} {name!r}: no rule in the weight table maps it")


def _to_numpy(x: jax.Array) -> np.ndarray:
    if not x.is_fully_addressable:
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))


def save_pretrained(model: nnx.Module, path: str | Path, tokenizer=None) -> Path:
    """Writes config.json, generation_config.json and model.safetensors in HF layout.

    The folder loads in transformers' AutoModelForCausalLM and in vLLM. Sharded (even
    multi-host) parameters are gathered; only process 0 writes.
    """
    path = Path(path)
    config: ModelConfig = model.config
    spec = _spec(config)
    tensors = {}
    for p, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        hf_name, rule = _match(spec, _dotted(p), hf=False)
        tensors[hf_name] = np.ascontiguousarray(rule.to_hf(_to_numpy(var[...])))
    if jax.process_index() != 0:
        return path
    path.mkdir(parents=True, exist_ok=True)
    hf_config = config.to_hf() | {"dtype": str(np.dtype(model.param_dtype))}
    (path / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    text = hf_config.get("text_config", hf_config)  # a multimodal config nests the text model's fields
    generation = {k: text[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if text[k] is not None}
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save_pretrained(str(path))
    return path
