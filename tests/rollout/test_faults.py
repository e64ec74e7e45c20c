"""Faulty backends (timeouts, errors, garbage in 20% of calls): every episode ends recorded once with an
outcome and a reason, no exception escapes the runner, a call that still times out after its retries
ends its episode as retryable, and a rerun plays exactly those episodes again."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from porch_jax.backends import FaultyBackend, RetryingBackend, ScriptedBackend
from porch_jax.envs.workplace import ScriptedExpert, ScriptedSubagent, WorkplaceEnv, make_tasks
from porch_jax.rollout import Engine, run_episodes, system_config
from porch_jax.trajectories import TrajectoryStore


@pytest.mark.parametrize(
    "system,retries",
    [
        ("proactive", 2),
        ("proactive", 0),
        ("lifecycle", 1),
        ("react", 1),
        ("orchestra_o1", 0),
        ("orchestra_o1", 1),
        ("mas2", 1),
    ],
)
def test_every_episode_ends_recorded(tmp_path, system, retries):
    def faulty(policy, seed):
        inner = FaultyBackend(ScriptedBackend(policy), rate=0.2, seed=seed)
        return inner, RetryingBackend(inner, timeout_s=0.02, max_retries=retries, backoff_s=0.0, seed=seed)

    orch_faults, orch = faulty(ScriptedExpert(), 1)
    sub_faults, sub = faulty(ScriptedSubagent(), 2)
    engine = Engine(WorkplaceEnv, orch, sub, system_config(system), system_name=system)
    tasks = make_tasks(24)
    store = TrajectoryStore(tmp_path / "faults.jsonl")

    async def episode(task):
        return await engine.run(task, episode_id=task.task_id)

    summary = asyncio.run(run_episodes(tasks, episode, store, concurrency=8, progress=False, episode_timeout_s=30))
    history = list(store)  # every line, retryable attempts included
    assert Counter(r.episode_id for r in history) == {t.task_id: 1 for t in tasks}
    assert summary.errors == 0  # the engine absorbed every fault itself
    assert all(r.outcome.reason for r in history)
    injected = orch_faults.injected + sub_faults.injected
    assert set(injected) == {"timeout", "error", "garbage"}
    assert sum(sum(r.meta["invalid"].values()) for r in history) > 0  # garbage became counted invalid actions
    retryable = {r.episode_id for r in history if r.outcome.retryable}
    assert summary.retryable == len(retryable) and store.retryable_ids() == retryable
    for r in history:
        if r.outcome.retryable:  # a call that timed out on every attempt: the backend could not answer
            assert r.outcome.reason.startswith("backend_unavailable: ") and not r.outcome.success
            timeouts = sum(k.get("timeout", 0) for k in r.meta["backend_error_kinds"].values())
            # Orchestra-o1's concurrent sub-agents may have calls in flight that time out together.
            assert timeouts == 1 or (system == "orchestra_o1" and timeouts > 1)
        else:  # injected errors (kind "other") stayed observations inside the episode
            assert not any(k.get("timeout") for k in r.meta["backend_error_kinds"].values())
    if retries == 0:
        assert retryable and sum(sum(r.meta["backend_errors"].values()) for r in history) > 0

    # The rerun, on healthy backends, plays exactly the retryable episodes and finishes every task.
    healthy = Engine(
        WorkplaceEnv, ScriptedBackend(ScriptedExpert()), ScriptedBackend(ScriptedSubagent()), system_config(system)
    )
    rerun: list[str] = []

    async def again(task):
        rerun.append(task.task_id)
        return await healthy.run(task, episode_id=task.task_id)

    second = asyncio.run(run_episodes(tasks, again, store, concurrency=8, progress=False, episode_timeout_s=30))
    assert sorted(rerun) == sorted(retryable) and second.skipped == len(tasks) - len(retryable)
    assert sorted(r.episode_id for r in store.read()) == sorted(t.task_id for t in tasks)
    assert store.retryable_ids() == set() and len(list(store)) == len(tasks) + len(retryable)
