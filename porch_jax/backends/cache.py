"""An exact response cache shared by every system of a comparison: the same request to the same model is
answered once and replayed from disk after that.

A request is cacheable when its reply is a function of the request: greedy sampling (temperature 0), or a
fixed seed (vLLM's per-request generator makes a seeded sample reproducible). Its key is the sha256 of the
model's identity (a name the caller chooses, e.g. the served folder's name and weight digest), the messages, the
tool schemas and every sampling field; the role is not part of it (the server never sees it). Other requests
pass through uncached.

The cache is an append-only JSONL file (`trajectories.jsonl`: one fsynced write per entry, a torn last line set
aside), so a run killed mid-way keeps every answer it got and a rerun replays them: this is how a comparison of
many systems resumes. A replayed result carries the tokens the original call spent, so a system's cost is the
same whether its calls were answered by the server or by the cache. Identical requests in flight at once are
sent once (the others await the first).

Besides the total, the counts are kept per scope: `SCOPE`, a context variable a caller sets around one part of its
run (`with scope("cot"): ...`, e.g. one system of a comparison). asyncio copies the context into every task it
creates, so each call a scoped coroutine makes, in whichever task, counts under its scope, and a rerun can show which
parts reached the model (`scope_counts`, `counts_since`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from porch_jax.backends.base import Backend, ChatRequest, ChatResult, Sampling
from porch_jax.trajectories.jsonl import AppendOnlyJsonl

SCOPE: contextvars.ContextVar[str | None] = contextvars.ContextVar("porch_jax.backends.cache.SCOPE", default=None)

# what a cached entry keeps of a ChatResult (ids and logprobs stay out: the comparison reads text and counts)
_KEPT = ("text", "prompt_tokens", "completion_tokens", "finish_reason", "token_source")


class CacheError(ValueError):
    """A cache file line that is not an entry of this format (names the file and line)."""


def cacheable(sampling: Sampling) -> bool:
    """Whether a reply under `sampling` is reproducible: greedy, or seeded."""
    return sampling.temperature == 0.0 or sampling.seed is not None


def request_key(model_id: str, request: ChatRequest) -> str:
    """sha256 over the model's identity, the messages, the tools and every sampling field."""
    payload = {
        "model": model_id,
        "messages": request.messages,
        "tools": request.tools,
        "sampling": dataclasses.asdict(request.sampling),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


class ResponseFile(AppendOnlyJsonl):
    """key -> kept result fields, one JSON object per line."""

    writer_name = "another run sharing this response cache"

    def load(self) -> dict[str, dict[str, Any]]:
        entries: dict[str, dict[str, Any]] = {}
        for lineno, raw in self.raw_lines():
            try:
                row = json.loads(raw)
                entries[row["key"]] = {k: row[k] for k in _KEPT}
            except (ValueError, KeyError, TypeError) as e:
                raise CacheError(f"{self.path}:{lineno}: not a response-cache entry ({e!r})") from None
        return entries

    def append(self, key: str, result: ChatResult) -> None:
        row = {"key": key, **{k: getattr(result, k) for k in _KEPT}}
        self.write_lines((json.dumps(row, ensure_ascii=False) + "\n").encode())


@dataclasses.dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0  # cacheable requests sent to the model
    uncacheable: int = 0
    shared: int = 0  # requests that awaited an identical one in flight

    @property
    def model_calls(self) -> int:
        """Requests that reached the model: the cacheable ones it answered and the uncacheable ones."""
        return self.misses + self.uncacheable

    def minus(self, earlier: CacheStats) -> CacheStats:
        """The requests counted since `earlier` (a copy of these counts taken then)."""
        return CacheStats(
            **{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in dataclasses.fields(self)}
        )

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@contextlib.contextmanager
def scope(name: str) -> Iterator[None]:
    """Every request made inside (by this coroutine and the tasks it creates) counts under `name`."""
    token = SCOPE.set(name)
    try:
        yield
    finally:
        SCOPE.reset(token)


def scope_counts(backend: Any) -> dict[str | None, CacheStats] | None:
    """A copy of `backend`'s counts per scope (None: requests made outside any), or None for a backend that keeps
    none (anything but a `CachedBackend`)."""
    if not isinstance(backend, CachedBackend):
        return None
    return {name: dataclasses.replace(stats) for name, stats in backend.scoped.items()}


def counts_since(
    before: dict[str | None, CacheStats], after: dict[str | None, CacheStats]
) -> dict[str | None, CacheStats]:
    """The requests between two `scope_counts` copies, per scope that made any."""
    return {
        name: stats.minus(before.get(name, CacheStats())) for name, stats in after.items() if stats != before.get(name)
    }


class CachedBackend:
    """`inner` behind the exact response cache at `path`; `model_id` names the model whose replies it holds."""

    def __init__(self, inner: Backend, path: str | os.PathLike[str], *, model_id: str):
        if not model_id:
            raise ValueError("CachedBackend needs a model_id: replies of different models must not share keys")
        self.inner, self.model_id = inner, model_id
        self.file = ResponseFile(path)
        self.entries = self.file.load()
        self.stats = CacheStats()
        self.scoped: dict[str | None, CacheStats] = {}  # per `SCOPE` (None: outside any); they sum to `stats`
        self._in_flight: dict[str, asyncio.Future[ChatResult]] = {}

    @property
    def path(self) -> Path:
        return self.file.path

    async def chat(self, request: ChatRequest) -> ChatResult:
        if not cacheable(request.sampling):
            self._count("uncacheable")
            return await self.inner.chat(request)
        key = request_key(self.model_id, request)
        if key in self.entries:
            self._count("hits")
            return ChatResult(**self.entries[key])
        if key in self._in_flight:
            self._count("shared")
            result = await asyncio.shield(self._in_flight[key])
            return dataclasses.replace(result)
        future: asyncio.Future[ChatResult] = asyncio.get_running_loop().create_future()
        self._in_flight[key] = future
        try:
            result = await self.inner.chat(request)
        except BaseException as e:
            future.set_exception(e)
            future.exception()  # retrieved here, so a future nobody else awaited logs nothing
            raise
        finally:
            del self._in_flight[key]
        self._count("misses")
        self.entries[key] = {k: getattr(result, k) for k in _KEPT}
        self.file.append(key, result)
        future.set_result(result)
        return result

    def _count(self, field: str) -> None:
        """One request counted as `field`, in the total and under the current scope."""
        for stats in (self.stats, self.scoped.setdefault(SCOPE.get(), CacheStats())):
            setattr(stats, field, getattr(stats, field) + 1)

    def close(self) -> None:
        self.file.close()
