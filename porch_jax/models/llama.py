"""Llama (SmolLM2, Llama 3.x) and Qwen2 causal language models in Flax NNX.

Both are the Qwen3 decoder with its config's switches set: no q/k norms (`config.qk_norm`), q/k/v
biases for Qwen2 (`config.qkv_bias`), Llama 3's scaled RoPE (`config.rope_scaling`). The classes
exist so that each model type has its own name and weight table (io.MODEL_SPECS); their numerics
match transformers' LlamaForCausalLM and Qwen2ForCausalLM (tests/models/test_llama.py).
"""

from __future__ import annotations

from porch_jax.models.qwen3 import Qwen3ForCausalLM


class LlamaForCausalLM(Qwen3ForCausalLM):
    """Decoder-only Llama (model_type "llama"). See docs/CONTRACTS.md for the call signature."""


class Qwen2ForCausalLM(Qwen3ForCausalLM):
    """Decoder-only Qwen2 (model_type "qwen2"): Llama with biased q/k/v projections."""
