"""The backend contract: one async chat call from a request to a result that keeps token ids.

Every backend (scripted policy, embedded JAX sampler, OpenAI-compatible HTTP server) implements
``async chat(ChatRequest) -> ChatResult``; wrappers (retry, faults, metering) compose by holding
an ``inner`` backend. One call returns one completion: for n samples issue n calls with different
seeds (the embedded backend batches them into one sampler call anyway).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None
    n: int = 1
    logprobs: bool = True


@dataclass
class ChatRequest:
    """``role`` ("orchestrator", "subagent", ...) drives cost accounting; ``state`` is the engine's
    typed view for scripted policies (LLM backends ignore it)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    sampling: Sampling = field(default_factory=Sampling)
    role: str = "orchestrator"
    state: Any = None


@dataclass
class ChatResult:
    """``token_ids``/``logprobs`` are the sampled tokens (empty when no model sampled them)."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"
    latency_s: float = 0.0


@runtime_checkable
class Backend(Protocol):
    async def chat(self, request: ChatRequest) -> ChatResult: ...


class BackendError(RuntimeError):
    """A failed call. ``retryable`` says whether trying again may succeed (overload, timeout,
    connection reset) or not (prompt too long, bad request)."""

    def __init__(self, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


def check_single(sampling: Sampling) -> None:
    if sampling.n != 1:
        raise BackendError(f"n={sampling.n}: one call returns one completion; issue n calls with distinct seeds")
