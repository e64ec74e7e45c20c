"""Hugging Face safetensors folders in and out, and model construction by model_type.

Each model type has a `ModelSpec`: its class and a table of `WeightRule`s from HF tensor names
to our module paths. The table is used both ways (import and export), every tensor is checked
against the shape the config implies, and nothing is silently dropped or left uninitialised.
A new architecture registers another spec in `MODEL_SPECS`. Export uses the spec of
`ModelConfig.export_model_type`: a multimodal Qwen3.5 is read with its "model.language_model." names
and written as a text-only Qwen3_5ForCausalLM folder.

With a mesh, every process reads only the parts of each tensor that its own devices hold
(safetensors slices into `jax.make_array_from_callback`), so a model larger than one host's
memory loads across hosts.
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
from porch_jax.models.llama import LlamaForCausalLM, Qwen2ForCausalLM
from porch_jax.models.qwen3 import Qwen3ForCausalLM
from porch_jax.models.qwen3_5 import Qwen3_5ForCausalLM
from porch_jax.models.sharding import RULES, Rules, shard_model, variable_sharding
from porch_jax.protocol.render import template_renders_tools


class CheckpointError(ValueError):
    """A weights folder that does not match its config; the message names the tensor."""


@dataclasses.dataclass(frozen=True)
class WeightRule:
    """One HF tensor name <-> one parameter path; `{i}` stands for a layer index.

    in_dims = 0: stored as is (flat: HF stores it flattened, e.g. a bias [heads * head_dim] that is
    [heads, head_dim] here). in_dims = n > 0: an HF Linear weight [out, in] whose kernel here is
    [*in, *out] with n leading input dims (e.g. o_proj [heads, head_dim, hidden] has in_dims 2).
    """

    hf: str
    ours: str
    in_dims: int = 0
    flat: bool = False

    def match(self, name: str, *, hf: bool) -> str | None:
        """The name on the other side when `name` matches this rule, else None."""
        src, dst = (self.hf, self.ours) if hf else (self.ours, self.hf)
        m = re.fullmatch(re.escape(src).replace(r"\{i\}", r"(?P<i>\d+)"), name)
        return None if m is None else dst.format(**m.groupdict())

    def hf_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.flat:
            return (math.prod(shape),)
        if not self.in_dims:
            return tuple(shape)
        return math.prod(shape[self.in_dims :]), math.prod(shape[: self.in_dims])

    def read_block(self, hf_tensor, shape: tuple[int, ...], index: tuple[slice, ...]) -> np.ndarray:
        """The block `index` of our [shape] array, read from `hf_tensor` (anything sliceable in HF layout:
        a numpy array or a safetensors slice) without reading more of it than the block's rows need.

        Each group of our dims that is one HF dim (a Linear's input dims, its output dims, a flat
        tensor's dims) reads the range its first dim's slice covers in full and cuts its inner dims
        from that; they are whole in every layout the sharding rules give (head_dim is never split).
        """
        index = tuple(index) + (slice(None),) * (len(shape) - len(index))
        if self.in_dims:
            n = self.in_dims
            cols, in_shape, in_cut = _covering_range(shape[:n], index[:n])
            rows, out_shape, out_cut = _covering_range(shape[n:], index[n:])
            block = np.asarray(hf_tensor[rows, cols]).T.reshape(*in_shape, *out_shape)
            return block[(*in_cut, *out_cut)]
        if self.flat:
            flat, block_shape, cut = _covering_range(shape, index)
            return np.asarray(hf_tensor[flat]).reshape(block_shape)[cut]
        return np.asarray(hf_tensor[index])

    def to_hf(self, array: np.ndarray) -> np.ndarray:
        if self.flat:
            return array.reshape(-1)
        if not self.in_dims:
            return array
        return array.reshape(math.prod(array.shape[: self.in_dims]), -1).T


def _covering_range(dims: tuple[int, ...], index: tuple[slice, ...]) -> tuple[slice, tuple[int, ...], tuple]:
    """For dims stored flattened into one: the flat range that covers `index`, the shape of that
    range unflattened, and the cut that takes `index` out of it."""
    start, stop, step = index[0].indices(dims[0])
    if step != 1:
        raise ValueError(f"a strided slice {index[0]} cannot be read as a block")
    inner = math.prod(dims[1:])
    return slice(start * inner, stop * inner), (stop - start, *dims[1:]), (slice(None), *index[1:])


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    model_cls: type[nnx.Module]
    weights: tuple[WeightRule, ...]
    ignored: tuple[str, ...] = ()  # regexes of HF tensors that exist but are not parameters here
    ignored_when_tied: tuple[str, ...] = ()  # HF tensors duplicated by tied embeddings


def _layer_rule(hf: str, ours: str, in_dims: int = 0) -> WeightRule:
    return WeightRule(f"model.layers.{{i}}.{hf}", f"layers.{{i}}.{ours}", in_dims)


# Llama's weights; Qwen3 adds q/k norms, Qwen2 q/k/v biases.
_LLAMA_WEIGHTS = (
    WeightRule("model.embed_tokens.weight", "embed_tokens"),
    WeightRule("model.norm.weight", "norm.weight"),
    WeightRule("lm_head.weight", "lm_head", 1),
    _layer_rule("input_layernorm.weight", "input_layernorm.weight"),
    _layer_rule("post_attention_layernorm.weight", "post_attention_layernorm.weight"),
    _layer_rule("self_attn.q_proj.weight", "self_attn.q_proj", 1),
    _layer_rule("self_attn.k_proj.weight", "self_attn.k_proj", 1),
    _layer_rule("self_attn.v_proj.weight", "self_attn.v_proj", 1),
    _layer_rule("self_attn.o_proj.weight", "self_attn.o_proj", 2),
    _layer_rule("mlp.gate_proj.weight", "mlp.gate_proj", 1),
    _layer_rule("mlp.up_proj.weight", "mlp.up_proj", 1),
    _layer_rule("mlp.down_proj.weight", "mlp.down_proj", 1),
)
_ROTARY_BUFFERS = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",)


def _llama_family(model_cls: type[nnx.Module], *extra: WeightRule) -> ModelSpec:
    return ModelSpec(
        model_cls=model_cls,
        weights=_LLAMA_WEIGHTS + extra,
        ignored=_ROTARY_BUFFERS,
        ignored_when_tied=(r"lm_head\.weight",),
    )


QWEN3 = _llama_family(
    Qwen3ForCausalLM,
    _layer_rule("self_attn.q_norm.weight", "self_attn.q_norm.weight"),
    _layer_rule("self_attn.k_norm.weight", "self_attn.k_norm.weight"),
)
LLAMA = _llama_family(LlamaForCausalLM)
QWEN2 = _llama_family(
    Qwen2ForCausalLM,
    *(
        WeightRule(f"model.layers.{{i}}.self_attn.{p}_proj.bias", f"layers.{{i}}.self_attn.{p}_bias", flat=True)
        for p in "qkv"
    ),
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
    "llama": LLAMA,
    "qwen2": QWEN2,
    "qwen3_5_text": _qwen3_5("model."),
    "qwen3_5": _qwen3_5("model.language_model.", ignored=(r"model\.visual\..*",)),
}


def _spec(config: ModelConfig, *, export: bool = False) -> ModelSpec:
    """The spec that reads a folder of `config`'s model_type, or (export) that writes its export."""
    model_type = config.export_model_type if export else config.model_type
    if model_type not in MODEL_SPECS:
        raise CheckpointError(f"model_type {model_type!r} has no registered model class")
    return MODEL_SPECS[model_type]


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


def _tensor_files(path: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The folder's safetensors files and, where it has an index, the index's tensor -> file map."""
    index = path / "model.safetensors.index.json"
    weight_map = None
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text()).get("weight_map")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
            raise CheckpointError(f"{index} is not a JSON object ({e})") from e
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise CheckpointError(f"{index} has no 'weight_map' of tensor names to file names")
        files = [path / f for f in sorted(set(weight_map.values()))]
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors files in {path}")
    for file in files:
        if not file.is_file():
            raise CheckpointError(f"weights file {file.name} listed in {index.name} is missing")
    return files, weight_map


def _tensor_slices(path: Path) -> Iterator[tuple[str, Any]]:
    """(name, safetensors slice) of every tensor; a slice reads only the part it is indexed with. With an index,
    every tensor it lists must be in the file it names, and each file's tensors must be listed there."""
    files, weight_map = _tensor_files(path)
    index = "model.safetensors.index.json"
    seen: set[str] = set()
    for file in files:
        with _open_safetensors(file) as f:
            for name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                if name in seen:
                    raise CheckpointError(f"tensor {name!r} appears in more than one file ({file.name})")
                if weight_map is not None and weight_map.get(name) != file.name:
                    listed = weight_map.get(name)
                    where = f"lists it in {listed}" if listed else "does not list it"
                    raise CheckpointError(f"tensor {name!r} is in {file.name}, but {index} {where}")
                seen.add(name)
                yield name, f.get_slice(name)
    missing = sorted(set(weight_map or ()) - seen)
    if missing:
        raise CheckpointError(f"{index} lists {len(missing)} tensor(s) no file holds: {', '.join(missing[:8])}")


def _open_safetensors(file: Path) -> Any:
    try:
        return safe_open(file, framework="numpy")
    except Exception as e:  # safetensors' SafetensorError (a torn header, a cut file) names no file
        raise CheckpointError(f"{file} is not a readable safetensors file ({type(e).__name__}: {e})") from e


def _load_array(hf_tensor, rule: WeightRule, var: nnx.Variable, sharding) -> jax.Array:
    """One parameter: whole onto the default device, or with a sharding each addressable device's block
    read on its own (devices holding the same block share one read)."""
    shape = tuple(var.shape)

    def block(index: tuple[slice, ...]) -> np.ndarray:
        return np.ascontiguousarray(rule.read_block(hf_tensor, shape, index).astype(var.dtype))

    if sharding is None:
        return jax.device_put(block(tuple(slice(None) for _ in shape)))
    blocks: dict[tuple, np.ndarray] = {}

    def cached(index: tuple[slice, ...]) -> np.ndarray:
        key = tuple(s.indices(n) for s, n in zip(index, shape, strict=True))
        if key not in blocks:
            blocks[key] = block(index)
        return blocks[key]

    return jax.make_array_from_callback(shape, sharding, cached)


def from_pretrained(
    path: str | Path,
    dtype=jnp.float32,
    param_dtype=None,
    mesh: Mesh | None = None,
    rules: Rules | None = None,
    **model_kwargs: Any,
) -> nnx.Module:
    """Loads an HF safetensors folder (single file or sharded with an index).

    param_dtype defaults to dtype. With a mesh, each tensor goes straight onto its sharding, and each
    process reads only the blocks its own devices hold. Raises ConfigError / CheckpointError naming
    the field or tensor at fault.
    """
    path = Path(path)
    config = ModelConfig.from_pretrained(path)
    param_dtype = param_dtype or dtype
    graphdef, state, targets = _abstract(config, dtype, param_dtype, **model_kwargs)
    values: dict[str, jax.Array] = {}
    for ours, rule, hf_tensor in _matched_tensors(path, config, targets):
        var = targets[ours]
        sharding = variable_sharding(var, mesh, rules or RULES) if mesh is not None else None
        values[ours] = _load_array(hf_tensor, rule, var, sharding)
    flat = [(p, v.replace(values[_dotted(p)])) for p, v in nnx.to_flat_state(state)]
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def check_pretrained(path: str | Path) -> ModelConfig:
    """The config of HF folder `path`, after checking its tensors against it as `from_pretrained` does (each one
    maps to a parameter and has the shape the config implies, none is missing, an index matches the files) without
    reading any tensor data. Raises ConfigError / CheckpointError naming the field or tensor at fault."""
    path = Path(path)
    config = ModelConfig.from_pretrained(path)
    _, _, targets = _abstract(config, jnp.float32, jnp.float32)
    for _ in _matched_tensors(path, config, targets):
        pass
    return config


def _abstract(config: ModelConfig, dtype, param_dtype, **model_kwargs: Any) -> tuple[Any, Any, dict[str, Any]]:
    """The model of `config` without memory: its graphdef, abstract state and parameters by dotted path."""
    spec = _spec(config)
    abstract = nnx.eval_shape(
        lambda: spec.model_cls(config, rngs=nnx.Rngs(0), dtype=dtype, param_dtype=param_dtype, **model_kwargs)
    )
    graphdef, state = nnx.split(abstract)
    return graphdef, state, {_dotted(p): v for p, v in nnx.to_flat_state(state)}


def _matched_tensors(path: Path, config: ModelConfig, targets: dict[str, Any]) -> Iterator[tuple[str, WeightRule, Any]]:
    """(parameter path, rule, safetensors slice) of each of the folder's tensors that is a parameter, after checking
    its name and shape; once all are through, that no parameter lacks its tensor."""
    spec = _spec(config)
    ignored = spec.ignored + (spec.ignored_when_tied if config.tie_word_embeddings else ())
    found: set[str] = set()
    for name, hf_tensor in _tensor_slices(path):
        if any(re.fullmatch(pattern, name) for pattern in ignored):
            continue
        ours, rule = _match(spec, name, hf=True)
        if ours not in targets:
            raise CheckpointError(f"unexpected tensor {name!r} in {path} (no parameter {ours!r} in this config)")
        expected, shape = rule.hf_shape(targets[ours].shape), tuple(hf_tensor.get_shape())
        if shape != expected:
            raise CheckpointError(f"tensor {name!r} has shape {shape}, but the config implies {expected}")
        found.add(ours)
        yield ours, rule, hf_tensor
    missing = [ours for ours in targets if ours not in found]
    if missing:
        names = [_match(spec, ours, hf=False)[0] for ours in missing]
        raise CheckpointError(f"{len(names)} tensor(s) missing from {path}: {', '.join(names)}")


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


def export_config(config: ModelConfig, param_dtype=jnp.float32) -> dict[str, Any]:
    """The config.json `save_pretrained` writes for `config` (no parameters needed): `config.to_hf()`
    with the weights' dtype; a multimodal Qwen3.5 is its text model alone (see `ModelConfig.to_hf`)."""
    return config.to_hf() | {"dtype": str(np.dtype(param_dtype))}


def export_tensor_shapes(model: nnx.Module) -> dict[str, tuple[int, ...]]:
    """HF name -> shape of every tensor `save_pretrained` writes for `model` (an abstract model from
    `nnx.eval_shape` will do: nothing is read or allocated)."""
    spec = _spec(model.config, export=True)
    shapes = {}
    for p, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        hf_name, rule = _match(spec, _dotted(p), hf=False)
        shapes[hf_name] = rule.hf_shape(tuple(var.shape))
    return shapes


def save_pretrained(model: nnx.Module, path: str | Path, tokenizer=None) -> Path:
    """Writes config.json (`export_config`), generation_config.json and model.safetensors in HF layout.

    The folder loads in transformers' AutoModelForCausalLM and in vLLM. A model read from a
    multimodal Qwen3.5 folder is written as a text-only one (Qwen3_5ForCausalLM: `model.layers.*`,
    no vision tower, no MTP head). Sharded (even multi-host) parameters are gathered; only
    process 0 writes.
    """
    path = Path(path)
    config: ModelConfig = model.config
    spec = _spec(config, export=True)
    tensors = {}
    for p, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        hf_name, rule = _match(spec, _dotted(p), hf=False)
        tensors[hf_name] = np.ascontiguousarray(rule.to_hf(_to_numpy(var[...])))
    if jax.process_index() != 0:
        return path
    path.mkdir(parents=True, exist_ok=True)
    hf_config = export_config(config, model.param_dtype)
    (path / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    generation = {k: hf_config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if hf_config[k] is not None}
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save_pretrained(str(path))
    return path


def folder_chat_template(path: str | Path) -> str | None:
    """The chat template a Hugging Face folder ships (chat_template.jinja, else tokenizer_config.json's), as
    transformers and vLLM read it; None when it has none."""
    path = Path(path)
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text()
    config = path / "tokenizer_config.json"
    template = json.loads(config.read_text()).get("chat_template") if config.is_file() else None
    return template if isinstance(template, str) else None


def folder_renders_tools(path: str | Path) -> bool:
    """Whether the folder's chat template renders tool schemas (clients of a server that does not set
    ``tools_in_prompt``)."""
    return template_renders_tools(folder_chat_template(path))
