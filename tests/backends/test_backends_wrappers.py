"""Scripted backend, cost metering through nested meters, retries/timeouts and fault injection."""

import asyncio
import time

import pytest

from porch_jax.backends import (
    BackendError,
    ChatRequest,
    ChatResult,
    CostMeter,
    FaultyBackend,
    MeteredBackend,
    RetryingBackend,
    Sampling,
    ScriptedBackend,
)


def req(text="a b c", role="orchestrator", **sampling):
    return ChatRequest(messages=[{"role": "user", "content": text}], sampling=Sampling(**sampling), role=role)


class Flaky:
    """Fails (or hangs) the first ``failures`` calls, then answers."""

    def __init__(self, failures, exc=None, hang=False):
        self.failures, self.exc, self.hang, self.calls = failures, exc, hang, 0

    async def chat(self, request):
        self.calls += 1
        if self.calls <= self.failures:
            if self.hang:
                await asyncio.sleep(10)
            raise self.exc
        return ChatResult(text="ok", prompt_tokens=1, completion_tokens=1)


def test_scripted_counts_and_async_policy():
    async def policy(r):
        return f"echo {r.state}"

    result = asyncio.run(ScriptedBackend(policy).chat(ChatRequest([{"role": "user", "content": "one two"}], state=7)))
    assert (result.text, result.prompt_tokens, result.completion_tokens, result.token_ids) == ("echo 7", 2, 2, [])
    with pytest.raises(BackendError, match="n=2"):
        asyncio.run(ScriptedBackend(lambda r: "x").chat(req(n=2)))


def test_cost_meter_rolls_up_nested_subagents():
    episode = CostMeter()
    sub = episode.child()
    nested = sub.child()
    backend = ScriptedBackend(lambda r: "w1 w2 w3")

    async def run():
        await MeteredBackend(backend, episode).chat(req("p1 p2", "orchestrator"))
        await MeteredBackend(backend, sub).chat(req("p1", "subagent"))
        await MeteredBackend(backend, nested).chat(req("p1 p2 p3", "subagent"))

    asyncio.run(run())
    assert episode.to_dict() == {
        "orchestrator": {"calls": 1, "prompt_tokens": 2, "completion_tokens": 3},
        "subagent": {"calls": 2, "prompt_tokens": 4, "completion_tokens": 6},
    }
    assert sub.to_dict() == {"subagent": {"calls": 2, "prompt_tokens": 4, "completion_tokens": 6}}
    assert episode.total_tokens() == 15 and episode.total_tokens("orchestrator") == 5


def test_retry_recovers_from_timeouts_and_retryable_errors():
    hang = Flaky(2, hang=True)
    r = RetryingBackend(hang, timeout_s=0.02, max_retries=2, backoff_s=0.001, seed=0)
    assert asyncio.run(r.chat(req())).text == "ok" and hang.calls == 3 and r.retries == 2
    err = Flaky(1, BackendError("overloaded", retryable=True))
    assert asyncio.run(RetryingBackend(err, 1.0, 1, 0.001).chat(req())).text == "ok"
    conn = Flaky(1, ConnectionResetError())
    assert asyncio.run(RetryingBackend(conn, 1.0, 1, 0.001).chat(req())).text == "ok"


def test_retry_exhaustion_and_non_retryable():
    hang = Flaky(10, hang=True)
    with pytest.raises(BackendError, match="timed out on all 3 attempts") as info:
        asyncio.run(RetryingBackend(hang, timeout_s=0.01, max_retries=2, backoff_s=0.001).chat(req()))
    assert isinstance(info.value.__cause__, TimeoutError) and not info.value.retryable
    bad = Flaky(10, ValueError("prompt too long"))
    with pytest.raises(ValueError):
        asyncio.run(RetryingBackend(bad, 1.0, 5, 0.001).chat(req()))
    assert bad.calls == 1


def test_backoff_grows_exponentially():
    err = Flaky(3, BackendError("busy", retryable=True))
    t0 = time.perf_counter()
    asyncio.run(RetryingBackend(err, 1.0, 3, backoff_s=0.02, seed=0).chat(req()))
    assert time.perf_counter() - t0 >= 0.5 * (0.02 + 0.04 + 0.08)


def test_faulty_backend_is_seeded_and_hits_its_rate():
    def run(seed):
        faulty = FaultyBackend(ScriptedBackend(lambda r: "fine"), rate=0.2, seed=seed, hang_s=0.002)
        outs = []

        async def go():
            for _ in range(500):
                try:
                    outs.append((await faulty.chat(req())).text)
                except BackendError as e:
                    outs.append(str(e))

        asyncio.run(go())
        return outs, faulty.injected

    a, counts = run(1)
    assert a == run(1)[0] != run(2)[0]
    assert set(counts) == {"timeout", "error", "garbage"} and 60 <= sum(counts.values()) <= 140
    with pytest.raises(ValueError):
        FaultyBackend(ScriptedBackend(lambda r: ""), rate=1.5)
