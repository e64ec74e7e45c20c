"""Seeded fault injection for tests: hangs, errors and garbage replies at a given rate.

Faults are drawn from one seeded stream in call order, so a sequential run is reproducible; under
concurrency the *set* of draws is fixed while which call gets which depends on scheduling.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

from porch_jax.backends.base import Backend, BackendError, ChatRequest, ChatResult

FAULT_KINDS = ("timeout", "error", "garbage")


class FaultyBackend:
    """With probability ``rate`` a call hangs for ``hang_s`` (past any sane timeout), raises a
    retryable ``BackendError``, or returns text with no valid tool call; otherwise it delegates."""

    def __init__(
        self,
        inner: Backend,
        rate: float,
        seed: int = 0,
        *,
        kinds: tuple[str, ...] = FAULT_KINDS,
        hang_s: float = 3600.0,
    ):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be in [0, 1], got {rate}")
        unknown = set(kinds) - set(FAULT_KINDS)
        if unknown or not kinds:
            raise ValueError(f"kinds must be a non-empty subset of {FAULT_KINDS}, got {kinds}")
        self.inner, self.rate, self.kinds, self.hang_s = inner, rate, kinds, hang_s
        self._rng = random.Random(seed)
        self.injected: Counter[str] = Counter()

    def _garbage(self) -> str:
        pieces = ["<tool_call>{not json", "I think the answer is", "</tool_call>", '{"name": 3}', "\u00e9\u6f22\n"]
        return " ".join(self._rng.choice(pieces) for _ in range(self._rng.randint(1, 4)))

    async def chat(self, request: ChatRequest) -> ChatResult:
        if self._rng.random() >= self.rate:
            return await self.inner.chat(request)
        kind = self._rng.choice(self.kinds)
        self.injected[kind] += 1
        if kind == "timeout":
            await asyncio.sleep(self.hang_s)
            raise BackendError("injected hang ended", retryable=True)
        if kind == "error":
            raise BackendError("injected error", retryable=True)
        text = self._garbage()
        return ChatResult(text=text, completion_tokens=len(text.split()), finish_reason="stop")
