"""Named model configs as Hugging Face config.json dicts (feed to `ModelConfig.from_hf`).

Presets let code size a model (parameter counts, memory plans, sharding) without a checkpoint;
real training loads the checkpoint's own config.json.
"""

from __future__ import annotations

import copy
from typing import Any

# The paper's orchestrator: the text half of Qwen3.5-9B. Token ids come from its tokenizer.
QWEN3_5_9B: dict[str, Any] = {
    "model_type": "qwen3_5_text",
    "vocab_size": 248320,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(32)],
    "attn_output_gate": True,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10_000_000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": True,
    },
    "max_position_embeddings": 262144,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "initializer_range": 0.02,
}

# Same shape family at toy size: GQA, 2 value heads per key head, and (without layer_types) the
# default pattern: every 4th layer full attention, whatever num_hidden_layers.
QWEN3_5_TINY: dict[str, Any] = {k: v for k, v in QWEN3_5_9B.items() if k != "layer_types"} | {
    "vocab_size": 1024,
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}

# Qwen3-1.7B's config.json: the dense shape the accelerator check (scripts/device_check.sh) measures MFU at.
QWEN3_1P7B: dict[str, Any] = {
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "initializer_range": 0.02,
}

# SmolLM2-135M-Instruct's config.json (the real-model experiments' model; its weights come from
# porch_jax.models.smollm2).
SMOLLM2_135M: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100_000.0,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}

PRESETS: dict[str, dict[str, Any]] = {
    "qwen3.5-9b": QWEN3_5_9B,
    "qwen3.5-tiny": QWEN3_5_TINY,
    "qwen3-1.7b": QWEN3_1P7B,
    "smollm2-135m": SMOLLM2_135M,
}


def preset(name: str, **overrides: Any) -> dict[str, Any]:
    """A fresh copy of a named config.json dict, with `overrides` applied.

    Overriding num_hidden_layers alone drops layer_types, so the config default (every 4th
    layer full attention) applies to the new depth.
    """
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
    hf = copy.deepcopy(PRESETS[name]) | overrides
    if "num_hidden_layers" in overrides and "layer_types" not in overrides:
        hf.pop("layer_types", None)
    return hf
