"""The exact response cache: what it keys on, what it keeps, what it passes through, how it survives a kill, and
what it counts per scope."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from porch_jax.backends import ChatRequest, Sampling, ScriptedBackend
from porch_jax.backends.cache import (
    SCOPE,
    CachedBackend,
    CacheError,
    CacheStats,
    cacheable,
    counts_since,
    request_key,
    scope,
    scope_counts,
)


class Counting:
    """A scripted model that numbers its replies, so a replayed reply is told apart from a fresh one."""

    def __init__(self, delay_s: float = 0.0):
        self.calls = 0
        self.delay_s = delay_s
        self.inner = ScriptedBackend(self._reply)

    def _reply(self, request: ChatRequest) -> str:
        self.calls += 1
        return f"reply {self.calls} to {request.messages[-1]['content']}"

    async def chat(self, request: ChatRequest):
        await asyncio.sleep(self.delay_s)
        return await self.inner.chat(request)


def ask(text: str, **sampling) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": text}], sampling=Sampling(**sampling), role="agent")


def run(backend, *requests):
    async def every():
        return await asyncio.gather(*(backend.chat(r) for r in requests))

    return asyncio.run(every())


def test_greedy_and_seeded_requests_are_answered_once_and_replayed_with_their_token_counts(tmp_path):
    model = Counting()
    cache = CachedBackend(model, tmp_path / "responses.jsonl", model_id="m@1")
    (first,) = run(cache, ask("2 + 2?"))
    (again,) = run(cache, ask("2 + 2?"))
    assert model.calls == 1 and again.text == first.text == "reply 1 to 2 + 2?"
    assert (again.prompt_tokens, again.completion_tokens) == (first.prompt_tokens, first.completion_tokens) != (0, 0)
    run(cache, ask("2 + 2?", temperature=0.7, seed=3), ask("2 + 2?", temperature=0.7, seed=3))
    assert model.calls == 2  # seeded: reproducible, so cached (and the twin in flight awaited the first)
    run(cache, ask("2 + 2?", temperature=0.7), ask("2 + 2?", temperature=0.7))
    assert model.calls == 4  # unseeded sampling is never replayed
    assert cache.stats.to_dict() == {"hits": 1, "misses": 2, "uncacheable": 2, "shared": 1}


def test_the_key_is_model_messages_and_every_sampling_field_not_the_role():
    base = ask("x")
    key = request_key("m@1", base)
    assert request_key("m@2", base) != key
    assert request_key("m@1", ask("y")) != key
    for change in ({"max_tokens": 128}, {"stop": ("\n",)}, {"top_p": 0.5}, {"logprobs": False}, {"thinking": True}):
        assert request_key("m@1", dataclasses.replace(base, sampling=Sampling(**change))) != key, change
    assert request_key("m@1", dataclasses.replace(base, role="router")) == key
    assert request_key("m@1", dataclasses.replace(base, tools=[{"type": "function"}])) != key
    assert cacheable(Sampling()) and cacheable(Sampling(temperature=1.0, seed=0)) and not cacheable(Sampling(0.5))


def test_a_rerun_replays_from_the_file_and_a_torn_last_line_is_set_aside(tmp_path):
    path = tmp_path / "responses.jsonl"
    model = Counting()
    cache = CachedBackend(model, path, model_id="m@1")
    run(cache, ask("a"), ask("b"))
    cache.close()
    with open(path, "ab") as f:  # a kill during the third entry's write
        f.write(b'{"key": "abc", "text": "half')
    model2 = Counting()
    again = CachedBackend(model2, path, model_id="m@1")
    texts = [r.text for r in run(again, ask("a"), ask("b"), ask("c"))]
    assert model2.calls == 1 and texts == ["reply 1 to a", "reply 2 to b", "reply 1 to c"]
    assert path.with_name("responses.jsonl.torn").exists()
    assert len(path.read_text().splitlines()) == 3
    again.close()
    other = CachedBackend(Counting(), path, model_id="m@2")  # another model's identity never replays these
    assert run(other, ask("a"))[0].text == "reply 1 to a" and other.stats.misses == 1


def test_two_writers_cannot_share_a_cache_file_and_a_bad_line_names_file_and_line(tmp_path):
    path = tmp_path / "responses.jsonl"
    one = CachedBackend(Counting(), path, model_id="m")
    run(one, ask("a"))
    with pytest.raises(RuntimeError, match="another run sharing this response cache"):
        run(CachedBackend(Counting(), path, model_id="m"), ask("b"))
    one.close()
    path.write_text(json.dumps({"key": "k", "text": "t"}) + "\n")
    with pytest.raises(CacheError, match=r"responses.jsonl:1: not a response-cache entry"):
        CachedBackend(Counting(), path, model_id="m")
    with pytest.raises(ValueError, match="model_id"):
        CachedBackend(Counting(), tmp_path / "other.jsonl", model_id="")


def test_a_failed_call_is_not_cached_and_its_twins_in_flight_see_the_error(tmp_path):
    from porch_jax.backends import BackendError

    class Failing:
        calls = 0

        async def chat(self, request):
            Failing.calls += 1
            await asyncio.sleep(0.01)
            raise BackendError("server down", kind="server", retryable=True)

    cache = CachedBackend(Failing(), tmp_path / "responses.jsonl", model_id="m")

    async def twins():
        return await asyncio.gather(cache.chat(ask("a")), cache.chat(ask("a")), return_exceptions=True)

    errors = asyncio.run(twins())
    assert all(isinstance(e, BackendError) for e in errors) and Failing.calls == 1
    assert not cache.entries and not (tmp_path / "responses.jsonl").exists()


def test_requests_count_per_scope_in_concurrent_tasks_and_outside_any(tmp_path):
    model = Counting(delay_s=0.01)
    cache = CachedBackend(model, tmp_path / "responses.jsonl", model_id="m")

    async def system(name, *texts):
        SCOPE.set(name)  # set in the task gather made for this coroutine: its calls' tasks inherit it, no one else
        return await asyncio.gather(*(cache.chat(ask(t)) for t in texts))

    async def comparison():
        await asyncio.gather(system("a", "x", "y"), system("b", "x", "z", "z"), cache.chat(ask("w")))
        assert SCOPE.get() is None
        with scope("a"):
            await cache.chat(ask("z"))
            await cache.chat(ask("u", temperature=0.7))
        await cache.chat(ask("w"))

    before = scope_counts(cache)
    asyncio.run(comparison())
    # "x" went out for a first (gathered first) and b awaited it; b's second "z" awaited its first
    assert cache.scoped == {
        "a": CacheStats(hits=1, misses=2, uncacheable=1),
        "b": CacheStats(misses=1, shared=2),
        None: CacheStats(hits=1, misses=1),
    }
    assert model.calls == 5 == sum(s.model_calls for s in cache.scoped.values()) == cache.stats.model_calls
    assert cache.stats == CacheStats(hits=2, misses=4, uncacheable=1, shared=2)
    assert before == {} and scope_counts(model) is None  # only a CachedBackend keeps scopes

    middle = scope_counts(cache)
    with scope("b"):
        run(cache, ask("x"), ask("v"))  # asyncio.run copies the caller's context: still b
    assert counts_since(middle, scope_counts(cache)) == {"b": CacheStats(hits=1, misses=1)}
    assert middle["b"] == CacheStats(misses=1, shared=2)  # a copy: later counts leave it as it was
