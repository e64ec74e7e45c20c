"""Deterministic Python policies as a backend (experts, scripted sub-agents, tests, benchmarks).

Token counts are whitespace word counts unless a tokenizer is given, so accounting is
deterministic and needs no model files. Token ids are only produced with a tokenizer.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

from porch_jax.backends.base import ChatRequest, ChatResult, check_single

Policy = Callable[[ChatRequest], "str | Awaitable[str]"]


def _content_text(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


class ScriptedBackend:
    """``policy(request) -> text`` (sync or async). ``latency_s`` simulates a model's delay."""

    def __init__(self, policy: Policy, *, tokenizer: Any = None, latency_s: float = 0.0):
        self.policy, self.tokenizer, self.latency_s = policy, tokenizer, latency_s

    def _count(self, text: str) -> tuple[int, list[int]]:
        if self.tokenizer is None:
            return len(text.split()), []
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        return len(ids), ids

    async def chat(self, request: ChatRequest) -> ChatResult:
        check_single(request.sampling)
        t0 = time.perf_counter()
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        text = self.policy(request)
        if inspect.isawaitable(text):
            text = await text
        if not isinstance(text, str):
            raise TypeError(f"scripted policy returned {type(text).__name__}, expected str")
        prompt_tokens = sum(self._count(_content_text(m))[0] for m in request.messages)
        completion_tokens, ids = self._count(text)
        return ChatResult(
            text=text,
            token_ids=ids,
            logprobs=[0.0] * len(ids),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            finish_reason="stop",
            latency_s=time.perf_counter() - t0,
        )
