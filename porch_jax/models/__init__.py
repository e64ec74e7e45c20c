"""Flax NNX decoders with Hugging Face safetensors import/export and logical-axis sharding."""

from porch_jax.models.cache import KVCache
from porch_jax.models.config import ConfigError, ModelConfig, RopeScaling
from porch_jax.models.io import (
    MODEL_SPECS,
    CheckpointError,
    ModelSpec,
    WeightRule,
    check_pretrained,
    export_config,
    export_tensor_shapes,
    from_pretrained,
    init_model,
    save_pretrained,
)
from porch_jax.models.llama import LlamaForCausalLM, Qwen2ForCausalLM
from porch_jax.models.qwen3 import REMAT_POLICIES, Qwen3ForCausalLM
from porch_jax.models.qwen3_5 import HybridCache, Qwen3_5ForCausalLM
from porch_jax.models.sharding import (
    RULES,
    data_sharding,
    logical_to_spec,
    make_mesh,
    shard_model,
    state_shardings,
)

__all__ = [
    "MODEL_SPECS",
    "REMAT_POLICIES",
    "RULES",
    "RopeScaling",
    "CheckpointError",
    "ConfigError",
    "HybridCache",
    "KVCache",
    "LlamaForCausalLM",
    "ModelConfig",
    "ModelSpec",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3_5ForCausalLM",
    "WeightRule",
    "check_pretrained",
    "data_sharding",
    "export_config",
    "export_tensor_shapes",
    "from_pretrained",
    "init_model",
    "logical_to_spec",
    "make_mesh",
    "save_pretrained",
    "shard_model",
    "state_shardings",
]
