"""LLM backends behind one async interface, plus retry, fault-injection and cost-metering wrappers.

``EmbeddedBackend`` (our JAX sampler) and the OpenAI-compatible HTTP backends (``OpenAIChatBackend`` for
any provider in ``providers.PROVIDERS``, ``VLLMBackend`` for a vLLM pool with its extras) are imported
lazily, so this package stays importable without jax or an HTTP client.
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
    "OpenAIChatBackend",
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
    if name in ("VLLMBackend", "OpenAIChatBackend"):
        from porch_jax.backends import openai_chat

        return getattr(openai_chat, name)
    raise AttributeError(name)
