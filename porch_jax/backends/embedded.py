"""Our JAX sampler as a backend, micro-batching concurrent requests into one sampler call.

Many episodes run concurrently on one event loop; each awaits ``chat``. Requests queue up and a
single worker drains whatever is waiting (up to ``max_batch``) into one ``Sampler.generate`` call
on a dedicated thread, so the event loop keeps running while the device works and the next batch
gathers meanwhile. The sampled token ids and raw-model logprobs are returned as generated, never
re-tokenized.

A request without a seed is seeded from what it asks, not from when: ``request_seed`` hashes the backend's
seed, the prompt's token ids and how many times this backend has sampled that prompt before. Which requests share
a batch, and in what order they arrive, then changes no sample, so a run resumed after a crash (fewer episodes in
flight, in another order) samples what the uninterrupted run sampled.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from porch_jax.backends.base import BackendError, ChatRequest, ChatResult, check_single
from porch_jax.models.sampler import SamplingParams
from porch_jax.protocol.render import prompt_ids


@dataclass
class _Pending:
    request: ChatRequest
    params: SamplingParams
    future: asyncio.Future[ChatResult]


def _digest(prompt: list[int]) -> bytes:
    return hashlib.blake2b(b"".join(int(x).to_bytes(8, "little") for x in prompt), digest_size=16).digest()


def _seed_of(seed: int, digest: bytes, occurrence: int) -> int:
    data = int(seed).to_bytes(8, "little", signed=True) + int(occurrence).to_bytes(8, "little") + digest
    return int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), "little") >> 1  # a non-negative int32


def request_seed(seed: int, prompt: list[int], occurrence: int) -> int:
    """The sampling seed of the `occurrence`-th request (from 0) for `prompt` to a backend seeded `seed`."""
    return _seed_of(seed, _digest(prompt), occurrence)


class EmbeddedBackend:
    """``sampler``: a ``porch_jax.models.sampler.Sampler``. A request without a seed samples with
    ``request_seed(seed, its prompt ids, how often this backend has seen that prompt)``: the same requests give the
    same samples whatever their order or batching (module docstring)."""

    def __init__(
        self,
        sampler: Any,
        *,
        max_batch: int | None = None,
        seed: int = 0,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ):
        self.sampler = sampler
        self.max_batch = max_batch or max(sampler.batch_buckets)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.seed = seed
        self._seen: dict[bytes, int] = {}  # prompt digest -> requests sampled for it (the sampler thread's alone)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedded-sampler")
        self._queue: asyncio.Queue[_Pending] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.batch_sizes: list[int] = []  # one entry per sampler call: shows batching works

    def encode(self, request: ChatRequest) -> list[int]:
        """The prompt token ids: the tokenizer's chat template with the generation prompt and the tools (in the
        system message when the template does not render tools: ``protocol.render.prompt_ids``), with the request's
        thinking switch over the backend's template kwargs."""
        kwargs = self.chat_template_kwargs | request.sampling.template_kwargs
        return prompt_ids(self.sampler.tokenizer, request.messages, request.tools, **kwargs)

    def _params(self, sampling: Any) -> SamplingParams:
        """The request's sampling settings; without a seed, ``_seeded`` gives it one once its prompt is encoded."""
        return SamplingParams(
            max_new_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            stop=tuple(sampling.stop),
            seed=sampling.seed,
        )

    def _seeded(self, params: SamplingParams, prompt: list[int]) -> SamplingParams:
        if params.seed is not None:
            return params
        digest = _digest(prompt)  # hashed once: the key of `_seen` and the seed's input
        occurrence = self._seen.get(digest, 0)
        self._seen[digest] = occurrence + 1
        return dataclasses.replace(params, seed=_seed_of(self.seed, digest, occurrence))

    async def chat(self, request: ChatRequest) -> ChatResult:
        check_single(request.sampling)
        try:
            params = self._params(request.sampling)
        except ValueError as e:
            raise BackendError(f"bad sampling settings: {e}") from e
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._worker is None or self._worker.done():
            self._loop, self._queue = loop, asyncio.Queue()
            self._worker = loop.create_task(self._serve())
        future: asyncio.Future[ChatResult] = loop.create_future()
        assert self._queue is not None
        self._queue.put_nowait(_Pending(request, params, future))
        return await future

    async def _serve(self) -> None:
        assert self._queue is not None and self._loop is not None
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            batch = [p for p in batch if not p.future.done()]  # cancelled while waiting (e.g. timed out)
            if not batch:
                continue
            try:
                outcomes = await self._loop.run_in_executor(self._executor, self._generate, batch)
            except Exception as e:  # never leave a caller waiting on a dead worker
                outcomes = [BackendError(f"embedded backend failed: {e!r}")] * len(batch)
            for pending, outcome in zip(batch, outcomes, strict=True):
                if pending.future.done():
                    continue
                if isinstance(outcome, BaseException):
                    pending.future.set_exception(outcome)
                else:
                    pending.future.set_result(outcome)

    def _generate(self, batch: list[_Pending]) -> list[ChatResult | BaseException]:
        """Runs on the sampler thread: render, generate the prompts that fit, build results."""
        t0 = time.perf_counter()
        outcomes: list[ChatResult | BaseException | None] = [None] * len(batch)
        prompts: dict[int, list[int]] = {}
        limit = max(self.sampler.prompt_buckets)
        for i, pending in enumerate(batch):
            try:
                ids = self.encode(pending.request)
            except Exception as e:  # a template error concerns one request, not the batch
                outcomes[i] = BackendError(f"chat template failed: {e!r}")
                continue
            if len(ids) > limit:
                outcomes[i] = BackendError(
                    f"prompt has {len(ids)} tokens; the sampler takes at most {limit}", kind="context_length"
                )
            else:
                prompts[i] = ids
        if prompts:
            idx = list(prompts)
            self.batch_sizes.append(len(idx))
            try:
                params = [self._seeded(batch[i].params, prompts[i]) for i in idx]
                completions = self.sampler.generate([prompts[i] for i in idx], params)
            except Exception as e:
                completions = [BackendError(f"sampler failed: {e!r}")] * len(idx)
            latency = time.perf_counter() - t0
            for i, c in zip(idx, completions, strict=True):
                outcomes[i] = (
                    c
                    if isinstance(c, BaseException)
                    else ChatResult(
                        text=c.text,
                        token_ids=list(c.token_ids),
                        logprobs=list(c.logprobs),
                        prompt_tokens=len(prompts[i]),
                        completion_tokens=len(c.token_ids),
                        finish_reason=c.finish_reason,
                        latency_s=latency,
                        token_source="sampler",
                        prompt_token_ids=list(prompts[i]),
                    )
                )
        return outcomes  # type: ignore[return-value]

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
        self._executor.shutdown(wait=False)
