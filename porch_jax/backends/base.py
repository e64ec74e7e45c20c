"""The backend contract: one async chat call from a request to a result that keeps token ids.

Every backend (scripted policy, embedded JAX sampler, OpenAI-compatible HTTP server) implements
``async chat(ChatRequest) -> ChatResult``; wrappers (retry, faults, metering) compose by holding
an ``inner`` backend. One call returns one completion: for n samples issue n calls with different
seeds (the embedded backend batches them into one sampler call anyway).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Sampling:
    """How one role samples. ``thinking``: the chat template's ``enable_thinking`` (Qwen3-style templates think by
    default); None leaves the template's default and sends nothing."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None
    n: int = 1
    logprobs: bool = True
    thinking: bool | None = None

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            raise ValueError(f"max_tokens: must be > 0, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature: must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 or self.n < 1:
            raise ValueError(f"top_k must be >= 0 and n >= 1, got top_k={self.top_k}, n={self.n}")

    @property
    def template_kwargs(self) -> dict[str, Any]:
        """What the chat template is rendered with for this sampling (the thinking switch, where set)."""
        return {} if self.thinking is None else {"enable_thinking": self.thinking}


@dataclass
class ChatRequest:
    """``role`` ("orchestrator", "subagent", ...) drives cost accounting; ``state`` is the engine's
    typed view for scripted policies (LLM backends ignore it)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    sampling: Sampling = field(default_factory=Sampling)
    role: str = "orchestrator"
    state: Any = None


TOKEN_SOURCES = ("sampler", "server", "none")


@dataclass
class ChatResult:
    """``token_ids``/``logprobs`` are the sampled tokens (empty when no model sampled them, or when
    the provider does not return them). ``token_source`` says where the ids come from: "sampler"
    (our embedded sampler), "server" (the serving engine returned the ids it sampled) or "none"
    (a scripted policy, or a provider that returns text only: training tokenizes the text, and
    counts such rows as re-tokenized). ``prompt_token_ids``/``prompt_text`` are the prompt as the server rendered
    it, where it says; ``reasoning`` the model's separate reasoning text, where the provider
    returns one."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"
    latency_s: float = 0.0
    token_source: str = "none"
    prompt_token_ids: list[int] = field(default_factory=list)
    prompt_text: str | None = None
    reasoning: str | None = None


@runtime_checkable
class Backend(Protocol):
    async def chat(self, request: ChatRequest) -> ChatResult: ...


# What went wrong, as runs count it: a prompt over the model's context, overload (429), a server fault (5xx or a
# malformed reply), no answer in time, no connection, a refused key, another request error, anything else.
ERROR_KINDS = ("context_length", "rate_limit", "server", "timeout", "connection", "auth", "bad_request", "other")
# The kinds that say the backend could not answer, not that the request was wrong: the same request may succeed
# later, on another server or after a restart. An episode cut short by one is a retryable failure (the policy did
# nothing wrong); the other kinds are the episode's own (a context too long, a bad request) and stay in it.
UNAVAILABLE_KINDS = ("rate_limit", "server", "timeout", "connection")
_CONTEXT_LENGTH = re.compile(
    r"maximum context length|max_model_len|maximum model length|context_length_exceeded|context window|"
    r"prompt is too long|longer than the maximum|the sampler takes at most",
    re.IGNORECASE,
)


class BackendError(RuntimeError):
    """A failed call. ``retryable`` says whether trying again may succeed (overload, timeout,
    connection reset) or not (prompt too long, bad request). ``retry_after_s`` is the wait the
    server asked for (HTTP Retry-After), which the retry loop honours. ``kind`` (one of
    ``ERROR_KINDS``) is what the engine counts; by default it is read from the message."""

    def __init__(
        self, message: str, *, retryable: bool = False, retry_after_s: float | None = None, kind: str | None = None
    ):
        super().__init__(message)
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        kind = kind or ("context_length" if _CONTEXT_LENGTH.search(message) else "other")
        if kind not in ERROR_KINDS:
            raise ValueError(f"BackendError kind {kind!r} is not one of {ERROR_KINDS}")
        self.kind = kind


def error_kind(error: BaseException) -> str:
    """The ``ERROR_KINDS`` entry of any failure a backend raised (timeouts and dropped connections included)."""
    if isinstance(error, BackendError):
        return error.kind
    if isinstance(error, TimeoutError):
        return "timeout"
    if isinstance(error, ConnectionError):
        return "connection"
    return "context_length" if _CONTEXT_LENGTH.search(str(error)) else "other"


def unavailable(error: BaseException) -> bool:
    """Whether ``error`` says the backend could not answer (``UNAVAILABLE_KINDS``), after whatever retries it made."""
    return error_kind(error) in UNAVAILABLE_KINDS


def check_single(sampling: Sampling) -> None:
    if sampling.n != 1:
        raise BackendError(f"n={sampling.n}: one call returns one completion; issue n calls with distinct seeds")
