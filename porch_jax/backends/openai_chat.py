"""One OpenAI-compatible chat backend for every provider: vLLM, SGLang and the hosted APIs.

- Providers: what a server accepts and returns is a ``providers.Provider`` (data, not branches):
  standard chat-completions fields by default; vLLM's extras (the sampled token ids, the prompt's
  ids and rendered text) requested only where the provider is declared to have them; reasoning
  models' quirks (``max_completion_tokens``, no temperature) and separate reasoning fields
  (DeepSeek's ``reasoning_content``) from the same table.
- Keys: the API key is read from an environment variable (``api_key_env``, or the provider's
  default), never from a config; a missing variable is an error that names the variable. The key
  never appears in an error, a record or a log line: server messages that echo it are redacted.
- Tools: sent with ``tool_choice="none"`` so the server returns the raw text (Hermes
  ``<tool_call>`` markup) that ``porch_jax.protocol`` parses, exactly as the embedded backend does.
  A served model whose chat template does not render tools (SmolLM2's ChatML) would never see them:
  with ``tools_in_prompt`` the schemas go into the system message instead (``protocol.render.chat_inputs``,
  the rendering the embedded backend and training use for such templates).
- Several servers: each attempt goes to the server with the fewest requests in flight (ties
  rotate), skipping servers that failed recently, so an executor pool spreads its load and a dead
  or stalled server stops receiving traffic until its cooldown ends. A server that refused a
  connection, dropped one, answered 5xx or gave no reply within ``timeout_s`` is out of rotation
  for ``cooldown_s``; after it, the next attempt that picks it is the probe: a restarted server
  (same URL) rejoins with its first answer, a dead one fails that attempt, which moves on to
  another server, and cools down again. With every server cooling down, attempts go to all of them.
- Failures: 429, 5xx, timeouts and dropped connections are retried with exponential backoff and
  jitter (``RetryingBackend``), honouring Retry-After, each attempt on a possibly different
  server; 401/403 fail at once, naming the key's variable; other 4xx (e.g. a prompt longer than
  the context) fail at once with the server's message.
- Bounds: each attempt waits at most ``timeout_s`` for its whole reply (connect, send, the server's
  generation, read), bounded here rather than by the retry loop so that the server that did not
  answer is the one marked; a call makes at most ``max_retries + 1`` attempts, so it ends within
  (max_retries + 1) · timeout_s plus the backoffs, answered or raising ``BackendError``.
- Other endpoints: ``post`` sends a body to any path of the pool (``/v1/completions`` on token ids,
  backends/completions.py) with the same rotation, bounds, retries and redaction as a chat.
- Connections: one pooled ``httpx2.AsyncClient`` per event loop (``httpx2`` is the httpx API that
  huggingface_hub, hence transformers, already installs).
"""

from __future__ import annotations

import asyncio
import email.utils
import itertools
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

import httpx2 as httpx

from porch_jax.backends.base import BackendError, ChatRequest, ChatResult, check_single
from porch_jax.backends.providers import DEFAULT, Provider, provider
from porch_jax.backends.resilient import RetryingBackend
from porch_jax.protocol.render import chat_inputs

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
AUTH_STATUS = frozenset({401, 403})


@dataclass
class ServerStats:
    """Per-server counters, for load-balancing and the run log: attempts sent (``requests``), answered with a
    JSON reply (``answered``), failed so that the server left the rotation (``failures``; ``timeouts`` of them for
    no reply in time), and when it may be tried again (``down_until``, on the monotonic clock)."""

    url: str
    inflight: int = 0
    requests: int = 0
    answered: int = 0
    failures: int = 0
    timeouts: int = 0
    down_until: float = 0.0


def read_api_key(env_var: str | None) -> str | None:
    """The key in ``$env_var`` (None when no variable is named); a named variable that is unset
    or empty is an error naming it."""
    if not env_var:
        return None
    key = os.environ.get(env_var, "")
    if not key:
        raise BackendError(f"the API key variable ${env_var} is not set (export it; keys never go in a config)")
    return key


class OpenAIChatBackend:
    """``chat`` against ``base_urls`` serving ``model`` through ``provider`` (a name from
    ``providers.PROVIDERS`` or a ``Provider``).

    ``base_urls`` default to the provider's hosted endpoint. ``api_key_env`` names the variable
    holding the key (default: the provider's); ``api_key`` passes a key held in memory (a server
    this process started), never one from a config file. ``timeout_s`` bounds each attempt, its
    whole reply included; ``max_retries`` more attempts follow a retryable failure. ``cooldown_s``
    keeps a server that refused or dropped a connection, failed with 5xx or did not answer in time
    out of the rotation for that long (unless every server is cooling down). ``extra_body`` is merged into every request (provider-specific knobs).
    ``tools_in_prompt``: the served model's chat template does not render tools, so the schemas are
    written into the system message and no ``tools`` field is sent (``VLLMServer.renders_tools`` tells).
    """

    def __init__(
        self,
        base_urls: str | Sequence[str] | None,
        model: str,
        *,
        provider: str | Provider = DEFAULT,
        api_key: str | None = None,
        api_key_env: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        max_retry_after_s: float = 120.0,
        cooldown_s: float = 5.0,
        max_connections: int = 256,
        seed: int | None = None,
        extra_body: dict[str, Any] | None = None,
        tools_in_prompt: bool = False,
    ):
        self.provider = _provider(provider)
        self.tools_in_prompt = tools_in_prompt
        if base_urls is None:
            base_urls = self.provider.base_url
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls or ())
        if not urls:
            raise ValueError(f"{type(self).__name__} ({self.provider.name}) needs at least one server URL")
        self.servers = [ServerStats(u.rstrip("/")) for u in urls]
        self.api_key_env = api_key_env or (None if api_key else self.provider.api_key_env)
        self.api_key = api_key if api_key is not None else read_api_key(self.api_key_env)
        self.model, self.timeout_s, self.cooldown_s = model, timeout_s, cooldown_s
        self.max_connections = max_connections
        self.extra_body = dict(extra_body or {})
        self._rotation = itertools.count()
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self._retrying = RetryingBackend(
            _Attempt(self),
            timeout_s=None,  # each attempt bounds itself by timeout_s, to mark the server that did not answer
            max_retries=max_retries,
            backoff_s=backoff_s,
            max_backoff_s=max_backoff_s,
            max_retry_after_s=max_retry_after_s,
            seed=seed,
        )
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def retries(self) -> int:
        return self._retrying.retries

    async def chat(self, request: ChatRequest) -> ChatResult:
        check_single(request.sampling)
        try:
            return await self._retrying.chat(request)
        except BackendError as e:
            raise self.redacted(e) from e.__cause__

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        """``body`` (its ``model`` added) POSTed to ``path`` on the pool, with the servers' rotation, timeouts and
        retries of ``chat``: the JSON reply. For the endpoints beside chat (``/v1/completions``: completions.py)."""
        try:
            data, _, _ = await self._retrying.call(
                lambda: post_once(self, path, {"model": self.model, **body}), f"POST {path}"
            )
        except BackendError as e:
            raise self.redacted(e) from e.__cause__
        return data

    def payload(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON body of a chat completion for ``request``, as this provider takes it."""
        s, p = request.sampling, self.provider
        messages, tools = chat_inputs(request.messages, request.tools, template_tools=not self.tools_in_prompt)
        body: dict[str, Any] = {"model": self.model, "messages": messages, "n": 1}
        body[p.max_tokens_field] = s.max_tokens
        if p.sampling_controls:
            body["temperature"], body["top_p"] = s.temperature, s.top_p
            if p.top_k and s.top_k > 0:
                body["top_k"] = s.top_k
        if p.logprobs and s.logprobs:
            body["logprobs"] = True
        if p.token_ids:
            body["return_token_ids"] = True
        if p.prompt_text:
            body["return_prompt_text"] = True
        if p.stop and s.stop:
            body["stop"] = list(s.stop)
        if p.seed and s.seed is not None:
            body["seed"] = s.seed
        if p.template_kwargs and s.template_kwargs:
            body["chat_template_kwargs"] = s.template_kwargs
        if tools:
            body["tools"], body["tool_choice"] = tools, "none"
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

    def redact(self, text: str) -> str:
        return text.replace(self.api_key, "[redacted]") if self.api_key else text

    def redacted(self, error: BackendError) -> BackendError:
        """``error`` with every occurrence of the key removed from its message (and its causes')."""
        if not self.api_key or self.api_key not in str(error):
            return error
        return BackendError(
            self.redact(str(error)), retryable=error.retryable, retry_after_s=error.retry_after_s, kind=error.kind
        )

    async def aclose(self) -> None:
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class VLLMBackend(OpenAIChatBackend):
    """A vLLM server pool (``http://host:port``, without ``/v1``) with vLLM's extras requested."""

    def __init__(self, base_urls: str | Sequence[str], model: str, **kwargs: Any):
        kwargs.setdefault("provider", "vllm")
        super().__init__(base_urls, model, **kwargs)


def _provider(p: str | Provider) -> Provider:
    try:
        return provider(p)
    except ValueError as e:
        raise BackendError(str(e)) from None


class _Attempt:
    """One try on one server; ``RetryingBackend`` around it supplies timeouts, backoff and retries."""

    def __init__(self, owner: OpenAIChatBackend):
        self.owner = owner

    async def chat(self, request: ChatRequest) -> ChatResult:
        owner = self.owner
        data, latency_s, url = await post_once(owner, owner.provider.chat_path, owner.payload(request))
        return parse_chat_response(data, latency_s=latency_s, url=url, provider=owner.provider)


async def post_once(owner: OpenAIChatBackend, path: str, body: dict[str, Any]) -> tuple[Any, float, str]:
    """One POST of ``body`` to ``path`` on the server ``owner`` picks: its JSON reply, the seconds it took and the
    server's URL. A server that does not answer in time, drops the connection or answers 5xx leaves the rotation."""
    server = owner.pick()
    server.inflight += 1
    server.requests += 1
    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(owner.timeout_s):
            response = await owner.client().post(f"{server.url}{path}", json=body)
    except TimeoutError:  # no whole reply in time: a stalled or overloaded server
        server.timeouts += 1
        _mark_down(server, owner.cooldown_s, "no reply")
        raise BackendError(
            f"{server.url}: no reply within {owner.timeout_s}s", retryable=True, kind="timeout"
        ) from None
    except httpx.TransportError as e:  # connect/read errors, dropped connections and httpx timeouts
        kind = "timeout" if isinstance(e, httpx.TimeoutException) else "connection"
        server.timeouts += kind == "timeout"
        _mark_down(server, owner.cooldown_s, type(e).__name__)
        raise BackendError(
            f"{server.url}: {type(e).__name__}: {owner.redact(str(e))}", retryable=True, kind=kind
        ) from None
    finally:
        server.inflight -= 1
    if response.status_code != 200:
        raise _status_error(owner, server, response)
    try:
        data = response.json()
    except ValueError:
        raise BackendError(
            f"{server.url}: reply is not JSON: {owner.redact(response.text[:300])!r}", kind="server"
        ) from None
    server.answered += 1
    return data, time.perf_counter() - t0, server.url


def _status_error(owner: OpenAIChatBackend, server: ServerStats, response: httpx.Response) -> BackendError:
    status = response.status_code
    message = owner.redact(_error_text(response))
    if status >= 500:
        _mark_down(server, owner.cooldown_s, f"HTTP {status}")
    if status in AUTH_STATUS:
        where = f"the key in ${owner.api_key_env}" if owner.api_key_env else "the API key"
        return BackendError(
            f"{server.url}: HTTP {status}: authentication failed, check {where}: {message}", kind="auth"
        )
    text = f"{server.url}: HTTP {status}: {message}"
    kind = "rate_limit" if status == 429 else "server" if status >= 500 else None
    if kind is None:  # a 4xx: a prompt over the context (vLLM says so in a 400), else a bad request
        kind = "context_length" if BackendError(text).kind == "context_length" else "bad_request"
    return BackendError(
        text,
        retryable=status in RETRYABLE_STATUS,
        retry_after_s=retry_after_seconds(response.headers.get("retry-after")),
        kind=kind,
    )


def retry_after_seconds(value: str | None) -> float | None:
    """HTTP Retry-After as seconds from now: delta-seconds or an HTTP date (RFC 9110); None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _mark_down(server: ServerStats, cooldown_s: float, why: str) -> None:
    server.failures += 1
    server.down_until = time.monotonic() + cooldown_s
    log.warning("%s out of rotation for %.1fs (%s; failure %d)", server.url, cooldown_s, why, server.failures)


def _error_text(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(data, list) and data:  # Gemini wraps its error object in a list
        data = data[0]
    error = data.get("error", data) if isinstance(data, dict) else data
    return str(error.get("message", error)) if isinstance(error, dict) else str(error)


def parse_chat_response(
    data: dict[str, Any], *, latency_s: float = 0.0, url: str = "", provider: str | Provider = DEFAULT
) -> ChatResult:
    """A ``ChatResult`` from a chat completion. A reply missing a field this provider is declared
    to return (token ids for vLLM) is an error, not retryable: the server is not configured as
    the backend expects. Without token ids the result's ``token_source`` is "none" (training
    re-tokenizes the text and counts the row as such)."""
    p = _provider(provider)
    try:
        choice = data["choices"][0]
        message = choice["message"]
        if p.token_ids and "token_ids" not in choice:
            raise BackendError(
                f"{url}: the reply has no token_ids, which provider {p.name!r} asks for (vLLM's return_token_ids); a "
                f"server that speaks only the standard chat-completions format needs provider={DEFAULT!r}",
                kind="server",
            )
        raw_ids = choice["token_ids"] if p.token_ids else choice.get("token_ids") or ()
        token_ids = [int(t) for t in raw_ids]
        source = "server" if token_ids or p.token_ids else "none"
        content = (choice.get("logprobs") or {}).get("content") or []
        logprobs = [float(c["logprob"]) for c in content]
        usage = data.get("usage") or {}
        text = message.get("content") or ""
        reasoning = next((message[f] for f in p.reasoning_fields if message.get(f)), None)
        prompt_ids = [int(t) for t in data.get("prompt_token_ids") or ()]
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise BackendError(f"{url}: malformed chat completion ({e!r}): {str(data)[:300]}", kind="server") from None
    if logprobs and token_ids and len(logprobs) != len(token_ids):
        raise BackendError(f"{url}: {len(token_ids)} token ids but {len(logprobs)} logprobs", kind="server")
    return ChatResult(
        text=text,
        token_ids=token_ids,
        logprobs=logprobs,
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        completion_tokens=int(usage.get("completion_tokens", len(token_ids))),
        finish_reason=choice.get("finish_reason") or "stop",
        latency_s=latency_s,
        token_source=source,
        prompt_token_ids=prompt_ids,
        prompt_text=data.get("prompt_text"),
        reasoning=reasoning,
    )
