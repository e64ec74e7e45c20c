"""Per-call timeout and retries with exponential backoff and jitter.

Retried: timeouts, ``BackendError(retryable=True)``, connection errors. Anything else (a bad
request, a programming error) is raised at once: retrying cannot fix it. A failure that carries
the server's Retry-After waits at least that long (up to ``max_retry_after_s``), so a rate-limited
provider is not hammered at the backoff's pace. After the last attempt a
``BackendError`` says how many attempts failed and chains the last cause.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from porch_jax.backends.base import Backend, BackendError, ChatRequest, ChatResult, error_kind

log = logging.getLogger(__name__)
T = TypeVar("T")


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, BackendError):
        return exc.retryable
    return isinstance(exc, (TimeoutError, ConnectionError))


class RetryingBackend:
    """``timeout_s`` bounds each attempt; attempt k (from 0) waits backoff_s·2^k·U[0.5, 1.5), capped. ``timeout_s``
    None: the inner backend bounds each attempt itself and raises a ``BackendError`` of kind "timeout" (the HTTP
    backend does, so that the server that did not answer is the one it takes out of rotation)."""

    def __init__(
        self,
        inner: Backend,
        timeout_s: float | None = 120.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        *,
        max_backoff_s: float = 30.0,
        max_retry_after_s: float = 120.0,
        seed: int | None = None,
    ):
        if (timeout_s is not None and timeout_s <= 0) or max_retries < 0 or backoff_s < 0:
            raise ValueError("timeout_s must be > 0 (or None), max_retries and backoff_s >= 0")
        self.inner, self.timeout_s, self.max_retries = inner, timeout_s, max_retries
        self.backoff_s, self.max_backoff_s, self.max_retry_after_s = backoff_s, max_backoff_s, max_retry_after_s
        self._rng = random.Random(seed)
        self.retries = 0  # total retries made: a health signal for the run log

    async def chat(self, request: ChatRequest) -> ChatResult:
        return await self.call(lambda: self.inner.chat(request), f"{request.role} call")

    async def call(self, attempt: Callable[[], Awaitable[T]], what: str) -> T:
        """``attempt()`` until it returns, retrying as ``chat`` does; ``what`` names the call in the final error."""
        last: BaseException | None = None
        for k in range(self.max_retries + 1):
            if k:
                delay = min(self.max_backoff_s, self.backoff_s * 2 ** (k - 1)) * self._rng.uniform(0.5, 1.5)
                asked = getattr(last, "retry_after_s", None)
                if asked is not None:
                    delay = max(delay, min(float(asked), self.max_retry_after_s))
                self.retries += 1
                log.debug("retry %d/%d in %.3fs after %r", k, self.max_retries, delay, last)
                await asyncio.sleep(delay)
            try:
                if self.timeout_s is None:
                    return await attempt()
                return await asyncio.wait_for(attempt(), self.timeout_s)
            except TimeoutError as e:  # an alias of TimeoutError since 3.11
                last = e
            except Exception as e:
                if not is_retryable(e):
                    raise
                last = e
        kind = "timed out" if error_kind(last) == "timeout" else f"failed ({last!r})"
        bound = f" (timeout {self.timeout_s}s)" if self.timeout_s is not None else f"; last: {last}"
        raise BackendError(
            f"{what} {kind} on all {self.max_retries + 1} attempts{bound}",
            retryable=False,
            kind=error_kind(last),
        ) from last
