"""An OpenAI-compatible HTTP backend for one or more vLLM servers.

- Token ids and logprobs: every request asks for ``return_token_ids`` and ``logprobs``, so the
  result keeps the ids the server sampled (re-tokenizing text drifts) and their raw logprobs.
- Tools: they are rendered by the server's chat template, but with ``tool_choice="none"`` so the
  server returns the raw text (Hermes ``<tool_call>`` markup) that ``porch_jax.protocol`` parses,
  exactly as the embedded backend does; no server-side tool parser is needed.
- Several servers: each attempt goes to the server with the fewest requests in flight (ties
  rotate), skipping servers that failed recently, so an executor pool spreads its load and a dead
  server stops receiving traffic until its cooldown ends.
- Failures: 429, 5xx, timeouts and connection errors are retried with exponential backoff and
  jitter (via ``RetryingBackend``), each attempt on a possibly different server; other 4xx (e.g. a
  prompt longer than the context) fail at once with the server's message.
- Connections: one pooled ``httpx2.AsyncClient`` per event loop (``httpx2`` is the httpx API that
  huggingface_hub, hence transformers, already installs).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

import httpx2 as httpx

from porch_jax.backends.base import BackendError, ChatRequest, ChatResult, check_single
from porch_jax.backends.resilient import RetryingBackend

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


@dataclass
class ServerStats:
    """Per-server counters, for load-balancing and the run log."""

    url: str
    inflight: int = 0
    requests: int = 0
    failures: int = 0
    down_until: float = 0.0


class VLLMBackend:
    """``chat`` against ``base_urls`` (``http://host:port``, without ``/v1``) serving ``model``.

    ``timeout_s`` bounds each attempt; ``max_retries`` more attempts follow a retryable failure.
    ``cooldown_s`` keeps a server that refused a connection or failed with 5xx out of the
    rotation for that long (unless every server is cooling down).
    """

    def __init__(
        self,
        base_urls: str | Sequence[str],
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        cooldown_s: float = 5.0,
        max_connections: int = 256,
        seed: int | None = None,
        extra_body: dict[str, Any] | None = None,
    ):
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise ValueError("VLLMBackend needs at least one server URL")
        self.servers = [ServerStats(u.rstrip("/")) for u in urls]
        self.model, self.api_key, self.timeout_s, self.cooldown_s = model, api_key, timeout_s, cooldown_s
        self.max_connections = max_connections
        self.extra_body = dict(extra_body or {})
        self._rotation = itertools.count()
        self._retrying = RetryingBackend(
            _Attempt(self),
            timeout_s=timeout_s,
            max_retries=max_retries,
            backoff_s=backoff_s,
            max_backoff_s=max_backoff_s,
            seed=seed,
        )
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def retries(self) -> int:
        return self._retrying.retries

    async def chat(self, request: ChatRequest) -> ChatResult:
        check_single(request.sampling)
        return await self._retrying.chat(request)

    def payload(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON body of ``/v1/chat/completions`` for ``request``."""
        s = request.sampling
        body: dict[str, Any] = {
            "model": self.model,
            "messages": request.messages,
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "n": 1,
            "logprobs": s.logprobs,
            "return_token_ids": True,
        }
        if s.top_k > 0:
            body["top_k"] = s.top_k
        if s.stop:
            body["stop"] = list(s.stop)
        if s.seed is not None:
            body["seed"] = s.seed
        if request.tools:
            body["tools"], body["tool_choice"] = request.tools, "none"
        return body | self.extra_body

    def client(self) -> httpx.AsyncClient:
        """The pooled client of the running event loop (a client cannot outlive its loop)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop or self._client.is_closed:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            limits = httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=self.max_connections)
            # trust_env=False: proxy variables must never reroute traffic meant for the rollout servers.
            self._client = httpx.AsyncClient(headers=headers, limits=limits, timeout=self.timeout_s, trust_env=False)
            self._loop = loop
        return self._client

    def pick(self) -> ServerStats:
        """The least-loaded server that is not cooling down; ties rotate."""
        now = time.monotonic()
        up = [s for s in self.servers if s.down_until <= now] or self.servers
        start = next(self._rotation) % len(up)
        rotated = up[start:] + up[:start]
        return min(rotated, key=lambda s: s.inflight)

    async def aclose(self) -> None:
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _Attempt:
    """One try on one server; ``RetryingBackend`` around it supplies timeouts, backoff and retries."""

    def __init__(self, owner: VLLMBackend):
        self.owner = owner

    async def chat(self, request: ChatRequest) -> ChatResult:
        owner = self.owner
        server = owner.pick()
        server.inflight += 1
        server.requests += 1
        t0 = time.perf_counter()
        try:
            response = await owner.client().post(f"{server.url}/v1/chat/completions", json=owner.payload(request))
        except httpx.TransportError as e:  # connect/read errors and httpx timeouts
            _mark_down(server, owner.cooldown_s)
            raise BackendError(f"{server.url}: {type(e).__name__}: {e}", retryable=True) from e
        finally:
            server.inflight -= 1
        if response.status_code != 200:
            retryable = response.status_code in RETRYABLE_STATUS
            if response.status_code >= 500:
                _mark_down(server, owner.cooldown_s)
            raise BackendError(
                f"{server.url}: HTTP {response.status_code}: {_error_text(response)}", retryable=retryable
            )
        try:
            data = response.json()
        except ValueError as e:
            raise BackendError(f"{server.url}: reply is not JSON: {response.text[:300]!r}") from e
        return parse_chat_response(data, latency_s=time.perf_counter() - t0, url=server.url)


def _mark_down(server: ServerStats, cooldown_s: float) -> None:
    server.failures += 1
    server.down_until = time.monotonic() + cooldown_s


def _error_text(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", {})
        return str(error.get("message", error)) if isinstance(error, dict) else str(error)
    except ValueError:
        return response.text[:500]


def parse_chat_response(data: dict[str, Any], *, latency_s: float = 0.0, url: str = "") -> ChatResult:
    """A ``ChatResult`` from a vLLM chat completion; a reply missing the fields we asked for is an
    error (not retryable: the server is not configured as this backend expects)."""
    try:
        choice = data["choices"][0]
        token_ids = [int(t) for t in choice["token_ids"]]
        content = (choice.get("logprobs") or {}).get("content") or []
        logprobs = [float(c["logprob"]) for c in content]
        usage = data.get("usage") or {}
        text = choice["message"].get("content") or ""
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise BackendError(f"{url}: malformed chat completion ({e!r}): {str(data)[:300]}") from e
    if logprobs and len(logprobs) != len(token_ids):
        raise BackendError(f"{url}: {len(token_ids)} token ids but {len(logprobs)} logprobs")
    return ChatResult(
        text=text,
        token_ids=token_ids,
        logprobs=logprobs,
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        completion_tokens=int(usage.get("completion_tokens", len(token_ids))),
        finish_reason=choice.get("finish_reason") or "stop",
        latency_s=latency_s,
    )
