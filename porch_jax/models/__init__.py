"""Flax NNX decoders with Hugging Face safetensors import/export and logical-axis sharding.

The names below load on first use (PEP 562): `porch_jax.models.smollm2` (the SmolLM2 folder) and
`porch_jax.models.config` are read while launchers parse flags, and importing them must not load JAX.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "KVCache": "cache",
    "ConfigError": "config",
    "ModelConfig": "config",
    "RopeScaling": "config",
    "MODEL_SPECS": "io",
    "CheckpointError": "io",
    "ModelSpec": "io",
    "WeightRule": "io",
    "check_pretrained": "io",
    "export_config": "io",
    "export_tensor_shapes": "io",
    "from_pretrained": "io",
    "init_model": "io",
    "save_pretrained": "io",
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "REMAT_POLICIES": "qwen3",
    "Qwen3ForCausalLM": "qwen3",
    "HybridCache": "qwen3_5",
    "Qwen3_5ForCausalLM": "qwen3_5",
    "RULES": "sharding",
    "data_sharding": "sharding",
    "logical_to_spec": "sharding",
    "make_mesh": "sharding",
    "shard_model": "sharding",
    "state_shardings": "sharding",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
