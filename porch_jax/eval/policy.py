"""An orchestrator policy loaded from an exported Hugging Face folder, served by our JAX sampler.

Evaluation reads weights from disk only (never a trainer's live state): the folder's config,
weights, tokenizer and ``policy.json`` (the context view the policy was trained with). One
``Policy`` can swap in another folder's weights of the same architecture: the sampler keeps its
compiled programs, so evaluating several checkpoints compiles once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flax import nnx

from porch_jax.backends import Backend, ChatRequest, ChatResult
from porch_jax.envs.views import folder_view, policy_view
from porch_jax.models import ModelConfig, from_pretrained
from porch_jax.models.sampler import Sampler


class ViewBackend:
    """Shows the inner backend the policy's view of each request's messages. In the "dsl" view the
    reply is decoded into the full tool call against the request's context (the sampled tokens and
    logprobs stay those of the compact form; a reply that does not decode reaches the engine as
    written and is recorded as an invalid action)."""

    def __init__(self, inner: Backend, view: str):
        self.inner, self.view = inner, view

    async def chat(self, request: ChatRequest) -> ChatResult:
        result = await self.inner.chat(dataclasses.replace(request, messages=policy_view(request.messages, self.view)))
        if self.view == "dsl":
            from porch_jax.envs.workplace.codec import decode_text

            result = dataclasses.replace(result, text=decode_text(result.text, request.messages))
        return result


@dataclass
class Policy:
    folder: Path
    model: nnx.Module
    tokenizer: Any
    sampler: Sampler

    def backend(self, seed: int = 0) -> Backend:
        """Our sampler behind the policy's view (requests without a seed draw seeds from ``seed`` on)."""
        from porch_jax.backends.embedded import EmbeddedBackend

        return ViewBackend(EmbeddedBackend(self.sampler, seed=seed), folder_view(self.folder))

    def load(self, folder: str | Path) -> Policy:
        """Replace the weights with those of ``folder`` (same architecture); returns self."""
        folder = Path(folder)
        if ModelConfig.from_pretrained(folder) != self.model.config or folder_view(folder) != folder_view(self.folder):
            raise ValueError(f"{folder} holds a different architecture or view than {self.folder}")
        nnx.update(self.model, nnx.state(from_pretrained(folder), nnx.Param))
        self.folder = folder
        return self


def load_policy(
    folder: str | Path,
    *,
    max_len: int = 2048,
    prompt_buckets: Sequence[int] | None = None,
    batch_buckets: Sequence[int] = (1, 4, 16, 64),
    prefix_cache_bytes: int = 0,
    max_batch_tokens: int | None = None,
) -> Policy:
    """The model and tokenizer saved in ``folder`` (``save_pretrained`` with a tokenizer) and a sampler.

    Few buckets keep compilations few: a rollout's batch size varies with the episodes in flight.
    ``prefix_cache_bytes`` > 0: a decision's prompt that extends an earlier one of its episode starts from that
    one's keys and values (the sampler's prefix reuse), in a cache of at most that many bytes. ``max_batch_tokens``:
    the sampler's bound on one forward's padded prompt tokens (models/sampler.py).
    """
    from transformers import AutoTokenizer

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} is not an exported model folder (no config.json)")
    model = from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    sampler = Sampler(
        model,
        tokenizer,
        max_len=max_len,
        prompt_buckets=prompt_buckets,
        batch_buckets=batch_buckets,
        prefix_cache_bytes=prefix_cache_bytes,
        max_batch_tokens=max_batch_tokens,
    )
    return Policy(folder, model, tokenizer, sampler)
