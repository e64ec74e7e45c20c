"""A context window on any backend: a request whose rendered prompt is over ``max_prompt_tokens`` fails as a
``context_length`` error before it reaches the model, exactly as a server over its max-model-len does.

With the engine's ``context_overflow="drop_oldest"`` the orchestrator then sees its oldest decision and feedback
dropped and asks again, so every player of one experiment (the scripted expert whose decisions SFT imitates, the
embedded sampler, a vLLM server with a longer max-model-len) decides under the same window, and a recorded context
is one the trained policy will read whole. The prompt is rendered as our embedded sampler renders it
(``protocol.render.prompt_ids``: the chat template, with tool schemas in the system message where the template
shows none).
"""

from __future__ import annotations

from typing import Any

from porch_jax.backends.base import Backend, BackendError, ChatRequest, ChatResult
from porch_jax.protocol.render import prompt_ids


class ContextWindow:
    """``inner`` behind a prompt-length limit measured with ``tokenizer``."""

    def __init__(self, inner: Backend, tokenizer: Any, max_prompt_tokens: int):
        if max_prompt_tokens <= 0:
            raise ValueError(f"max_prompt_tokens must be > 0, got {max_prompt_tokens}")
        self.inner, self.tokenizer, self.max_prompt_tokens = inner, tokenizer, max_prompt_tokens
        self.refused = 0  # requests over the window (each one a compaction when the engine drops the oldest turn)

    async def chat(self, request: ChatRequest) -> ChatResult:
        n = len(prompt_ids(self.tokenizer, request.messages, request.tools, **request.sampling.template_kwargs))
        if n > self.max_prompt_tokens:
            self.refused += 1
            raise BackendError(
                f"prompt has {n} tokens; the context window takes at most {self.max_prompt_tokens}",
                kind="context_length",
            )
        return await self.inner.chat(request)
