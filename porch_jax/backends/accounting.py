"""Token and call accounting per role, aggregated through nested sub-agents.

A sub-agent that spawns its own helpers gets a ``child()`` meter: its counts roll up into every
ancestor, so an episode's meter always holds the full cost of everything it started.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

from porch_jax.backends.base import Backend, ChatRequest, ChatResult


@dataclass
class Usage:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0


class CostMeter:
    def __init__(self, parent: CostMeter | None = None):
        self.parent = parent
        self.by_role: dict[str, Usage] = defaultdict(Usage)

    def child(self) -> CostMeter:
        return CostMeter(parent=self)

    def add(self, role: str, result: ChatResult) -> None:
        meter: CostMeter | None = self
        while meter is not None:
            u = meter.by_role[role]
            u.calls += 1
            u.prompt_tokens += result.prompt_tokens
            u.completion_tokens += result.completion_tokens
            u.latency_s += result.latency_s
            meter = meter.parent

    def to_dict(self) -> dict[str, dict[str, int]]:
        """Per-role counts in ``RoleCost`` field names (``RoleCost(**d[role])`` rebuilds them)."""
        return {
            role: {"calls": u.calls, "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens}
            for role, u in sorted(self.by_role.items())
        }

    def total_tokens(self, role: str | None = None) -> int:
        roles = [role] if role is not None else list(self.by_role)
        return sum(
            self.by_role[r].prompt_tokens + self.by_role[r].completion_tokens for r in roles if r in self.by_role
        )


class MeteredBackend:
    """Records every successful call's usage in ``meter`` under ``request.role``; fills latency."""

    def __init__(self, inner: Backend, meter: CostMeter):
        self.inner, self.meter = inner, meter

    async def chat(self, request: ChatRequest) -> ChatResult:
        t0 = time.perf_counter()
        result = await self.inner.chat(request)
        if not result.latency_s:
            result.latency_s = time.perf_counter() - t0
        self.meter.add(request.role, result)
        return result
