"""LLM backends behind one async interface, plus retry, fault-injection and cost-metering wrappers.

``EmbeddedBackend`` (our JAX sampler) and ``VLLMBackend`` (HTTP) are imported lazily, so this package
stays importable without jax or an HTTP client.
"""

from typing import Any

from porch_jax.backends.accounting import CostMeter, MeteredBackend, Usage
from porch_jax.backends.base import Backend, BackendError, ChatRequest, ChatResult, Sampling
from porch_jax.backends.faults import FAULT_KINDS, FaultyBackend
from porch_jax.backends.resilient import RetryingBackend, is_retryable
from porch_jax.backends.scripted import ScriptedBackend

__all__ = [
    "Backend",
    "BackendError",
    "ChatRequest",
    "ChatResult",
    "CostMeter",
    "EmbeddedBackend",
    "FAULT_KINDS",
    "FaultyBackend",
    "MeteredBackend",
    "RetryingBackend",
    "Sampling",
    "ScriptedBackend",
    "Usage",
    "VLLMBackend",
    "is_retryable",
]


def __getattr__(name: str) -> Any:
    if name == "EmbeddedBackend":
        from porch_jax.backends.embedded import EmbeddedBackend

        return EmbeddedBackend
    if name == "VLLMBackend":
        from porch_jax.backends.vllm_http import VLLMBackend

        return VLLMBackend
    raise AttributeError(name)
