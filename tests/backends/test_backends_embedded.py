"""EmbeddedBackend: micro-batching of concurrent requests, per-request failures, real tiny model."""

import asyncio
import time

import pytest

from porch_jax.backends import BackendError, ChatRequest, EmbeddedBackend, RetryingBackend, Sampling
from porch_jax.backends.embedded import request_seed
from porch_jax.models.sampler import Completion


class FakeTokenizer:
    def apply_chat_template(self, messages, tools=None, add_generation_prompt=True, tokenize=True):
        text = " ".join(m["content"] for m in messages)
        if "BAD" in text:
            raise ValueError("template failed")
        return {"input_ids": [len(w) for w in text.split()]}


class FakeSampler:
    """Echoes each prompt's ids; slow enough that concurrent requests pile up behind a batch."""

    batch_buckets = (1, 2, 4, 8)
    prompt_buckets = (4, 8)

    def __init__(self):
        self.tokenizer, self.calls = FakeTokenizer(), []

    def generate(self, prompts, params):
        self.calls.append([p.seed for p in params])
        time.sleep(0.05)
        return [
            Completion(token_ids=list(p), logprobs=[-1.0] * len(p), text=f"seed={q.seed}", finish_reason="stop")
            for p, q in zip(prompts, params, strict=False)
        ]


def req(text, seed=None):
    return ChatRequest(messages=[{"role": "user", "content": text}], sampling=Sampling(seed=seed, temperature=1.0))


def test_concurrent_requests_share_sampler_calls():
    sampler = FakeSampler()
    backend = EmbeddedBackend(sampler, seed=100)

    async def run():
        return await asyncio.gather(*(backend.chat(req("a bb ccc", seed=7 if i == 3 else None)) for i in range(10)))

    results = asyncio.run(run())
    assert sum(backend.batch_sizes) == 10 and max(backend.batch_sizes) > 1
    assert len(backend.batch_sizes) <= 3  # 10 requests with max_batch 8: at least two calls, few more
    assert all(r.token_ids == [1, 2, 3] and r.prompt_tokens == 3 and r.completion_tokens == 3 for r in results)
    assert results[3].text == "seed=7"
    # the 9 unseeded requests for one prompt: its occurrences 0..8, whichever batch each landed in
    assert sorted(r.text for i, r in enumerate(results) if i != 3) == sorted(
        f"seed={request_seed(100, [1, 2, 3], k)}" for k in range(9)
    )


def test_samples_do_not_depend_on_request_order_or_batching():
    """A resumed run sends the same requests in another order, in other batches: each prompt gets the seed it got
    in the uninterrupted run (its content and occurrence), so the same samples."""
    texts = [f"task {'w ' * i}" for i in range(6)] + ["task"]  # the last prompt's ids repeat the first's

    def seeds(order, base=100):
        backend = EmbeddedBackend(FakeSampler(), seed=base)

        async def run():
            return await asyncio.gather(*(backend.chat(req(texts[i])) for i in order))

        return sorted((tuple(r.token_ids), r.text) for r in asyncio.run(run()))  # identical prompts interchangeable

    forward = seeds(range(7))
    assert seeds([6, 3, 5, 0, 1, 4, 2]) == forward
    assert len({text for _, text in forward}) == 7  # a repeated prompt is sampled afresh
    assert seeds(range(7), base=101) != forward


def test_failures_stay_per_request():
    backend = EmbeddedBackend(FakeSampler())

    async def run():
        return await asyncio.gather(
            backend.chat(req("ok")), backend.chat(req("w " * 9)), backend.chat(req("BAD")), return_exceptions=True
        )

    ok, too_long, bad_template = asyncio.run(run())
    assert ok.token_ids == [2]
    assert isinstance(too_long, BackendError) and "at most 8" in str(too_long)
    assert isinstance(bad_template, BackendError) and "template" in str(bad_template)


def test_timed_out_request_does_not_break_the_worker():
    backend = EmbeddedBackend(FakeSampler())

    async def run():
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(backend.chat(req("x")), 0.001)
        return await RetryingBackend(backend, timeout_s=5).chat(req("y y"))

    assert asyncio.run(run()).token_ids == [1, 1]


@pytest.mark.slow
def test_real_tiny_model_keeps_sampled_ids(tmp_path):
    from transformers import AutoTokenizer

    from porch_jax.models import from_pretrained
    from porch_jax.models.sampler import Sampler, SamplingParams
    from porch_jax.models.tiny import make_tiny_model

    path = make_tiny_model(tmp_path / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(path)
    sampler = Sampler(from_pretrained(path), tokenizer, max_len=128, batch_buckets=(4,))
    backend = EmbeddedBackend(sampler, seed=5)
    requests = [
        ChatRequest(
            [{"role": "system", "content": "Orchestrate."}, {"role": "user", "content": f"Task {i}"}],
            sampling=Sampling(max_tokens=6, temperature=0.0 if i == 0 else 1.0),
        )
        for i in range(3)
    ]

    async def run():
        return await asyncio.gather(*(backend.chat(r) for r in requests))

    results = asyncio.run(run())
    assert backend.batch_sizes == [3]
    prompts = [backend.encode(r) for r in requests]
    direct = sampler.generate(
        prompts,
        [
            SamplingParams(max_new_tokens=6, temperature=0.0 if i == 0 else 1.0, seed=request_seed(5, prompts[i], 0))
            for i in range(3)
        ],
    )
    for r, d, p in zip(results, direct, prompts, strict=False):
        assert (r.token_ids, r.logprobs, r.text) == (d.token_ids, d.logprobs, d.text)
        assert r.prompt_tokens == len(p) and r.completion_tokens == len(r.token_ids) <= 6
        assert r.text == tokenizer.decode(r.token_ids, skip_special_tokens=True)
