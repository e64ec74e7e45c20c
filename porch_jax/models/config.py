"""Model configuration, read from and written to a Hugging Face `config.json`.

Only what the JAX decoder needs is kept; features we do not implement (sliding windows, biased
output or MLP projections, RoPE scalings other than Llama 3's, other activations) are rejected at
load time, naming the field, rather than silently producing a different model.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen3_5_text", "qwen3_5", "llama", "qwen2")
# Hybrid models (Gated DeltaNet + attention). "qwen3_5" is the multimodal checkpoint layout: its
# config.json nests the text model under text_config, which is all we load and all we write back
# (as model_type "qwen3_5_text": the vision tower is never loaded, so an export has none).
HYBRID_MODEL_TYPES = ("qwen3_5_text", "qwen3_5")
# The model_type an export writes for each model_type read, and the architecture it names (what
# transformers' AutoModelForCausalLM and vLLM's registry resolve).
EXPORT_MODEL_TYPES = {"qwen3_5": "qwen3_5_text"}
ARCHITECTURES = {
    "qwen3": "Qwen3ForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3_5_text": "Qwen3_5ForCausalLM",
}
# text_config keys of a multimodal Qwen3.5 that its text-only export leaves out: the MTP
# (speculative) head's, since its weights are not loaded, so not written.
_DROPPED_TEXT_KEYS = ("mtp_",)
LAYER_TYPES = ("full_attention", "linear_attention")
_LINEAR_FIELDS = (
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)


class ConfigError(ValueError):
    """A config.json that we cannot turn into a model; the message names the field."""


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama 3's RoPE frequency scaling (`rope_type` "llama3"): long wavelengths are divided by
    `factor`, short ones kept, the band between interpolated (transformers' _compute_llama3_parameters)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int
    rope_type: str = "llama3"

    def __post_init__(self) -> None:
        if self.rope_type != "llama3":
            raise ConfigError(f"rope_type {self.rope_type!r} is not supported (known: 'default', 'llama3')")
        if not self.high_freq_factor > self.low_freq_factor > 0 or self.factor <= 0:
            raise ConfigError(
                "rope scaling needs factor > 0 and high_freq_factor > low_freq_factor > 0, got "
                f"factor={self.factor}, low_freq_factor={self.low_freq_factor}, high_freq_factor={self.high_freq_factor}"
            )

    def to_hf(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    initializer_range: float = 0.02
    # Hybrid models only: each layer's token mixer (LAYER_TYPES), the Gated DeltaNet dims, the
    # sigmoid gate on attention outputs. partial_rotary_factor: the fraction of head_dim rotated.
    layer_types: tuple[str, ...] = ()
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    attn_output_gate: bool = False
    partial_rotary_factor: float = 1.0
    # A multimodal checkpoint's whole config.json (JSON text): the text_config keys we do not model
    # (mRoPE sections, SSM dtype, ...) go into the text-only export as they were.
    multimodal_config: str | None = None
    # Llama 3.x long-context RoPE (None: plain RoPE at rope_theta).
    rope_scaling: RopeScaling | None = None

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(
                f"model_type {self.model_type!r} is not supported (known: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"config field {name!r} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"config field 'num_attention_heads' ({self.num_attention_heads}) must be a multiple of "
                f"'num_key_value_heads' ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ConfigError(f"config field 'head_dim' must be even for RoPE, got {self.head_dim}")
        if self.model_type in HYBRID_MODEL_TYPES:
            self._check_hybrid()
        elif self.partial_rotary_factor != 1.0:
            raise ConfigError(f"config field 'partial_rotary_factor' must be 1 for {self.model_type!r}")
        if isinstance(self.rope_scaling, dict):
            object.__setattr__(self, "rope_scaling", _rope_scaling(self.rope_scaling, "rope_scaling"))

    @property
    def qk_norm(self) -> bool:
        """Per-head RMSNorm on queries and keys before RoPE (Qwen3, Qwen3.5; not Llama or Qwen2)."""
        return self.model_type not in ("llama", "qwen2")

    @property
    def qkv_bias(self) -> bool:
        """Biases on the q, k and v projections (Qwen2)."""
        return self.model_type == "qwen2"

    def _check_hybrid(self) -> None:
        object.__setattr__(self, "layer_types", tuple(self.layer_types))  # a list when read from JSON
        if len(self.layer_types) != self.num_hidden_layers or not set(self.layer_types) <= set(LAYER_TYPES):
            raise ConfigError(
                f"config field 'layer_types' must list {self.num_hidden_layers} entries of {LAYER_TYPES}, "
                f"got {list(self.layer_types)!r}"
            )
        for name in _LINEAR_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"config field {name!r} must be a positive integer, got {value!r}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError(
                f"config field 'linear_num_value_heads' ({self.linear_num_value_heads}) must be a multiple of "
                f"'linear_num_key_heads' ({self.linear_num_key_heads})"
            )
        rotary = int(self.head_dim * self.partial_rotary_factor)
        if rotary <= 0 or rotary > self.head_dim or rotary % 2:
            raise ConfigError(
                f"config field 'partial_rotary_factor' ({self.partial_rotary_factor}) must rotate an even, "
                f"non-zero part of head_dim ({self.head_dim})"
            )
        if not self.attn_output_gate:
            raise ConfigError("config field 'attn_output_gate' = false is not supported (Qwen3.5 gates attention)")

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        """Builds a config from a config.json dict (legacy `rope_theta` or `rope_parameters`)."""
        if "model_type" not in hf:
            raise ConfigError("config is missing required field 'model_type'")
        if hf["model_type"] == "qwen3_5":
            return cls._from_multimodal(hf)
        _reject_unsupported(hf)
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
        for name in required:
            if name not in hf or hf[name] is None:
                raise ConfigError(f"config is missing required field {name!r}")
        heads = hf["num_attention_heads"]
        eos = hf.get("eos_token_id")
        return cls(
            model_type=hf["model_type"],
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(_rope_theta(hf)),
            max_position_embeddings=hf.get("max_position_embeddings", 32768),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
            pad_token_id=hf.get("pad_token_id"),
            initializer_range=float(hf.get("initializer_range", 0.02)),
            rope_scaling=_hf_rope_scaling(hf),
            **_hybrid_fields(hf),
        )

    @classmethod
    def _from_multimodal(cls, hf: dict[str, Any]) -> ModelConfig:
        """The text model of a multimodal Qwen3.5 config.json, remembering the whole file."""
        text = hf.get("text_config")
        if not isinstance(text, dict):
            raise ConfigError("config of model_type 'qwen3_5' is missing required field 'text_config'")
        tied = hf.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        # Token ids the text config leaves out come from the outer one.
        tokens = {k: hf[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if text.get(k) is None and k in hf}
        config = cls.from_hf(text | tokens | {"model_type": "qwen3_5_text", "tie_word_embeddings": tied})
        return dataclasses.replace(config, model_type="qwen3_5", multimodal_config=json.dumps(hf))

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        file = Path(path) / "config.json"
        if not file.is_file():
            raise ConfigError(f"no config.json in {path}")
        try:
            hf = json.loads(file.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{file} is not valid JSON: {e}") from e
        return cls.from_hf(hf)

    @property
    def export_model_type(self) -> str:
        """The model_type `to_hf` writes: "qwen3_5_text" for a multimodal Qwen3.5, else model_type."""
        return EXPORT_MODEL_TYPES.get(self.model_type, self.model_type)

    def to_hf(self) -> dict[str, Any]:
        """A config.json dict that transformers (and vLLM) read as the same model.

        A multimodal Qwen3.5 ("qwen3_5") is written as its text model alone: model_type
        "qwen3_5_text", architecture Qwen3_5ForCausalLM, the text fields flat (no text_config or
        vision_config), with the text_config keys we do not model kept and MTP's dropped.
        """
        out = dataclasses.asdict(self)
        scaling = out.pop("rope_scaling")
        if isinstance(self.eos_token_id, tuple):
            out["eos_token_id"] = list(self.eos_token_id)
        hybrid = {name: out.pop(name) for name in (*_LINEAR_FIELDS, "layer_types", "attn_output_gate")}
        multimodal = out.pop("multimodal_config")
        rope = {"rope_type": "default", "rope_theta": self.rope_theta}
        if scaling is not None:
            rope |= scaling
        if out.pop("partial_rotary_factor") != 1.0:
            rope["partial_rotary_factor"] = self.partial_rotary_factor
        if self.model_type in HYBRID_MODEL_TYPES:
            out.update(hybrid, layer_types=list(self.layer_types))
        model_type = self.export_model_type
        out.update(
            model_type=model_type,
            architectures=[ARCHITECTURES[model_type]],
            hidden_act="silu",
            attention_bias=False,
            mlp_bias=False,
            attention_dropout=0.0,
            use_sliding_window=False,
            sliding_window=None,
            rope_parameters=rope,
            use_cache=True,
        )
        if not multimodal:
            return out
        text = json.loads(multimodal).get("text_config") or {}
        kept = {k: v for k, v in text.items() if not k.startswith(_DROPPED_TEXT_KEYS)}
        out["rope_parameters"] = (text.get("rope_parameters") or {}) | rope
        return kept | out

    @property
    def num_groups(self) -> int:
        """Query heads per key/value head (GQA)."""
        return self.num_attention_heads // self.num_key_value_heads


def _rope_theta(hf: dict[str, Any]) -> float:
    params = hf.get("rope_parameters") or {}
    if "rope_theta" in params:
        return params["rope_theta"]
    return hf.get("rope_theta", 1_000_000.0)


def _rope_kind(rope: dict[str, Any]) -> str:
    return rope.get("rope_type", rope.get("type", "default"))


def _rope_scaling(rope: dict[str, Any], field: str) -> RopeScaling:
    names = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [name for name in names if name not in rope]
    if missing:
        raise ConfigError(f"config field {field!r} (rope_type 'llama3') is missing {', '.join(map(repr, missing))}")
    return RopeScaling(
        factor=float(rope["factor"]),
        low_freq_factor=float(rope["low_freq_factor"]),
        high_freq_factor=float(rope["high_freq_factor"]),
        original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
        rope_type=_rope_kind(rope),
    )


def _hf_rope_scaling(hf: dict[str, Any]) -> RopeScaling | None:
    """Llama 3 scaling from `rope_parameters` (transformers 5) or the legacy `rope_scaling`."""
    for field in ("rope_parameters", "rope_scaling"):
        rope = hf.get(field) or {}
        if _rope_kind(rope) == "llama3":
            return _rope_scaling(rope, field)
    return None


def _hybrid_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """The hybrid-model fields of a text config.json, with transformers' defaults."""
    rope = hf.get("rope_parameters") or {}
    hybrid = hf["model_type"] in HYBRID_MODEL_TYPES
    partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25 if hybrid else 1.0))
    if not hybrid:
        return {"partial_rotary_factor": float(partial)}
    layers = hf.get("num_hidden_layers") or 0
    interval = hf.get("full_attention_interval", 4)  # transformers' default layer pattern
    default_types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
    defaults = {
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
    }
    return {name: hf.get(name, default) for name, default in defaults.items()} | {
        "layer_types": tuple(hf.get("layer_types") or default_types),
        "attn_output_gate": bool(hf.get("attn_output_gate", True)),
        "partial_rotary_factor": float(partial),
    }


def _reject_unsupported(hf: dict[str, Any]) -> None:
    if hf.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"config field 'hidden_act' must be 'silu', got {hf['hidden_act']!r}")
    # Qwen2's q/k/v biases are part of its architecture (no config field); an `attention_bias`
    # flag (Llama, Qwen3) also biases the output projection, which we do not implement.
    if hf.get("attention_bias", False):
        raise ConfigError("config field 'attention_bias' = true is not supported")
    if hf.get("mlp_bias", False):
        raise ConfigError("config field 'mlp_bias' = true is not supported")
    if hf.get("use_sliding_window", False):
        raise ConfigError("config field 'use_sliding_window' = true is not supported")
    if (hf.get("pretraining_tp") or 1) != 1:
        raise ConfigError(f"config field 'pretraining_tp' must be 1, got {hf['pretraining_tp']!r}")
    scalable = hf["model_type"] == "llama"
    for field in ("rope_parameters", "rope_scaling"):
        kind = _rope_kind(hf.get(field) or {})
        if kind != "default" and not (scalable and kind == "llama3"):
            allowed = "'default' or 'llama3'" if scalable else "'default'"
            raise ConfigError(
                f"config field {field!r} has rope_type {kind!r}; {allowed} is supported for {hf['model_type']!r}"
            )
