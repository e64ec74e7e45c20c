"""The GRM with its reply format held: the flag is the base model's own choice, the hint its own words.

A small base model asked for I_GRM's two lines often writes neither (SmolLM2-135M wrote "FLAG:" in 1 of 75 free
replies), so its free reading says little about what it judges. Held, the reply is built by the format and filled
by the model: the assistant turn opens with "FLAG:", and the flag is whichever of " true" and " false" the model
gives the higher log-probability there; only a flagged decision's hint is generated, freely, after
"FLAG: true\\nHINT:" (it stops at a line that would open another field). `HeldGRM` answers the GRM's chat request
with that reply, so the attribution job (job.py) parses and records it as any other; the choice's log-probabilities
are in the reply's `reasoning` field for the record.

Where the log-probabilities come from (`Reader`): our sampler on the base model (`SamplerReader`), or a server that
scores a prompt of token ids (`ServedReader`: ``/v1/completions`` with ``prompt_logprobs``, vLLM and SGLang). The
prompt is rendered here with the base model's tokenizer and chat template, as the embedded sampler renders it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from porch_jax.backends.base import ChatRequest, ChatResult, Sampling, check_single
from porch_jax.protocol.render import prompt_ids

FLAG_OPENING = "FLAG:"
FLAG_CHOICES = (" true", " false")
HINT_OPENING = "FLAG: true\nHINT:"
HINT_STOPS = ("\nFLAG", "\nHINT")


class Reader(Protocol):
    async def logprobs(self, prompt: list[int], continuations: list[list[int]]) -> list[float]: ...

    async def complete(self, prompt: list[int], sampling: Sampling) -> str: ...


class _Batched:
    """``fn(items) -> results`` on one worker thread, called with every item waiting when it is free: concurrent
    requests (the attribution job's) share one sampler call, as the embedded backend batches chats."""

    def __init__(self, fn: Callable[[list[Any]], list[Any]], executor: ThreadPoolExecutor):
        self.fn, self.executor = fn, executor
        self._queue: asyncio.Queue[tuple[Any, asyncio.Future]] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, item: Any) -> Any:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._worker is None or self._worker.done():
            self._loop, self._queue = loop, asyncio.Queue()
            self._worker = loop.create_task(self._serve())
        future = loop.create_future()
        self._queue.put_nowait((item, future))
        return await future

    async def _serve(self) -> None:
        assert self._queue is not None and self._loop is not None
        while True:
            batch = [await self._queue.get()]
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                results = await self._loop.run_in_executor(self.executor, self.fn, [item for item, _ in batch])
            except Exception as e:  # never leave a caller waiting on a failed call
                results = [e] * len(batch)
            for (_, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)


class SamplerReader:
    """Our sampler (models/sampler.py) on the base model, on one worker thread so the event loop runs meanwhile;
    the requests waiting together are scored in one call, and their hints generated in one."""

    def __init__(self, sampler: Any):
        self.sampler = sampler
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="held-grm")
        self._score, self._complete = _Batched(self._score_all, executor), _Batched(self._complete_all, executor)

    async def logprobs(self, prompt: list[int], continuations: list[list[int]]) -> list[float]:
        return await self._score((prompt, continuations))

    async def complete(self, prompt: list[int], sampling: Sampling) -> str:
        return await self._complete((prompt, sampling))

    def _score_all(self, items: list[tuple[list[int], list[list[int]]]]) -> list[list[float]]:
        if all(len(c) == 1 for _, cs in items for c in cs) and len({tuple(map(tuple, cs)) for _, cs in items}) == 1:
            # one-token choices, the same for every prompt: one row per prompt, read at its next token
            return self.sampler.next_token_logprobs([p for p, _ in items], [c[0] for c in items[0][1]])
        rows = [(p, c) for p, cs in items for c in cs]
        scores = iter(self.sampler.score([p for p, _ in rows], [c for _, c in rows]))
        return [[next(scores) for _ in cs] for _, cs in items]

    def _complete_all(self, items: list[tuple[list[int], Sampling]]) -> list[str]:
        from porch_jax.models.sampler import SamplingParams

        params = [
            SamplingParams(
                max_new_tokens=s.max_tokens,
                temperature=s.temperature,
                top_p=s.top_p,
                stop=tuple(s.stop),
                seed=s.seed or 0,
            )
            for _, s in items
        ]
        return [c.text for c in self.sampler.generate([p for p, _ in items], params)]


class ServedReader:
    """A served base model through ``/v1/completions`` on token ids (backends/completions.py)."""

    def __init__(self, client: Any):
        self.client = client

    async def logprobs(self, prompt: list[int], continuations: list[list[int]]) -> list[float]:
        out = []
        for c in continuations:
            scored = await self.client.prompt_logprobs(prompt + c)
            out.append(sum(scored[len(prompt) - 1 :]))
        return out

    async def complete(self, prompt: list[int], sampling: Sampling) -> str:
        return await self.client.complete(prompt, sampling)


def continuation_ids(tokenizer: Any, opening: str, choice: str) -> list[int]:
    """The tokens `choice` adds after `opening`, as the tokenizer splits the two together."""
    head = tokenizer.encode(opening, add_special_tokens=False)
    both = tokenizer.encode(opening + choice, add_special_tokens=False)
    if both[: len(head)] == head and len(both) > len(head):
        return both[len(head) :]
    return tokenizer.encode(choice, add_special_tokens=False)


class HeldGRM:
    """A backend answering I_GRM requests (grm.grm_request) with the format held (module docstring).

    The request's sampling applies to the hint; its stop strings are kept and the format's added."""

    def __init__(self, reader: Reader, tokenizer: Any, template_kwargs: dict[str, Any] | None = None):
        self.reader, self.tokenizer = reader, tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self.choices = [continuation_ids(tokenizer, FLAG_OPENING, c) for c in FLAG_CHOICES]
        self.flag_opening = tokenizer.encode(FLAG_OPENING, add_special_tokens=False)
        self.hint_opening = tokenizer.encode(HINT_OPENING, add_special_tokens=False)

    async def chat(self, request: ChatRequest) -> ChatResult:
        check_single(request.sampling)
        t0 = time.perf_counter()
        kwargs = self.template_kwargs | request.sampling.template_kwargs
        base = prompt_ids(self.tokenizer, request.messages, request.tools, **kwargs)
        true_lp, false_lp = await self.reader.logprobs(base + self.flag_opening, self.choices)
        reasoning = f"held FLAG: logprob true {true_lp:.4f}, false {false_lp:.4f}"
        if true_lp > false_lp:
            sampling = dataclasses.replace(request.sampling, stop=tuple(request.sampling.stop) + HINT_STOPS)
            hint = (await self.reader.complete(base + self.hint_opening, sampling)).strip()
            text = f"{HINT_OPENING} {hint}"
        else:
            hint, text = "", "FLAG: false\nHINT:"
        return ChatResult(
            text=text,
            token_ids=[],
            logprobs=[],
            prompt_tokens=len(base),
            completion_tokens=len(self.tokenizer.encode(hint, add_special_tokens=False)) if hint else 0,
            finish_reason="stop",
            latency_s=time.perf_counter() - t0,
            reasoning=reasoning,
        )
