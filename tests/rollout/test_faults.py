"""Faulty backends (timeouts, errors, garbage in 20% of calls): every episode ends recorded with an
outcome and a reason, and no exception escapes the runner."""

from __future__ import annotations

import asyncio

import pytest

from porch_jax.backends import FaultyBackend, RetryingBackend, ScriptedBackend
from porch_jax.envs.workplace import ScriptedExpert, ScriptedSubagent, WorkplaceEnv, make_tasks
from porch_jax.rollout import Engine, run_episodes, system_config
from porch_jax.trajectories import TrajectoryStore


@pytest.mark.parametrize("system,retries", [("proactive", 2), ("proactive", 0), ("lifecycle", 1), ("react", 1)])
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
    records = store.read()
    assert sorted(r.episode_id for r in records) == sorted(t.task_id for t in tasks)
    assert summary.errors == 0  # the engine absorbed every fault itself
    assert all(r.outcome.reason for r in records)
    injected = orch_faults.injected + sub_faults.injected
    assert set(injected) == {"timeout", "error", "garbage"}
    assert sum(sum(r.meta["invalid"].values()) for r in records) > 0  # garbage became counted invalid actions
    if retries == 0:
        assert sum(sum(r.meta["backend_errors"].values()) for r in records) > 0
