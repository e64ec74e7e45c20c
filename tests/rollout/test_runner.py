"""Runner: concurrency bound, resume, failures recorded, fault injection, kill -9 and rerun."""

import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from porch_jax import faults
from porch_jax.backends import BackendError, ChatRequest, FaultyBackend, RetryingBackend, ScriptedBackend
from porch_jax.protocol import Finish, ProtocolError, parse_orchestrator_action, render_action
from porch_jax.rollout.runner import run_episodes
from porch_jax.trajectories import EpisodeRecord, Outcome, TrajectoryStore


def record(task: str, success: bool = True, reason: str = "ok") -> EpisodeRecord:
    return EpisodeRecord(
        episode_id=task,
        task_id=task,
        env="toy",
        system="scripted",
        config_hash="h",
        seed=0,
        outcome=Outcome(success=success, score=float(success), reason=reason),
    )


def run(*args, **kwargs):
    return asyncio.run(run_episodes(*args, progress=False, **kwargs))


def test_concurrency_bound_and_every_task_recorded(tmp_path):
    live = peak = 0

    async def episode(task):
        nonlocal live, peak
        live += 1
        peak = max(peak, live)
        await asyncio.sleep(0.002)
        live -= 1
        return record(task)

    store = TrajectoryStore(tmp_path / "ep.jsonl")
    summary = run([f"t{i}" for i in range(60)], episode, store, concurrency=7)
    assert peak == 7
    assert (summary.total, summary.completed, summary.succeeded, summary.skipped) == (60, 60, 60, 0)
    assert sorted(store.episode_ids()) == sorted(f"t{i}" for i in range(60))


def test_resume_skips_recorded_tasks(tmp_path):
    store = TrajectoryStore(tmp_path / "ep.jsonl")
    ran = []

    async def episode(task):
        ran.append(task)
        return record(task)

    run(["a", "b"], episode, store)
    summary = run([{"task_id": k} for k in ("a", "b", "c")], lambda t: episode(t["task_id"]), store)
    assert ran == ["a", "b", "c"] and (summary.skipped, summary.completed) == (2, 1)
    assert len(store.read()) == 3
    with pytest.raises(ValueError, match="duplicate"):
        run(["x", "x"], episode, store)


def test_failures_become_records_and_nothing_escapes(tmp_path):
    async def episode(task):
        if task == "raise":
            raise KeyError("boom")
        if task == "hang":
            await asyncio.sleep(10)
        if task == "cancel":
            raise asyncio.CancelledError()
        if task == "wrong-type":
            return "not a record"
        if task == "invalid":
            r = record(task)
            r.seed = "1"
            return r
        if task == "other-id":
            return record("someone-else")
        if task == "blank-id":
            r = record("")
            r.task_id = task
            return r
        return record(task)

    tasks = ["raise", "hang", "cancel", "wrong-type", "invalid", "other-id", "blank-id", "fine"]
    store = TrajectoryStore(tmp_path / "ep.jsonl")
    summary = run(tasks, episode, store, episode_timeout_s=0.2)
    by_id = {r.episode_id: r for r in store.read()}
    assert sorted(by_id) == sorted(tasks) and summary.completed == 8
    assert by_id["fine"].outcome.success and by_id["blank-id"].outcome.success
    for t in tasks[:6]:
        o = by_id[t].outcome
        assert not o.success and o.reason.startswith("error: "), (t, o)
        assert "Traceback" in by_id[t].meta["traceback"]
    assert "KeyError" in by_id["raise"].outcome.reason and "timed out" in by_id["hang"].outcome.reason
    assert "seed" in by_id["invalid"].outcome.reason and summary.errors == 6


def test_faulty_backend_under_retries_every_episode_recorded(tmp_path):
    """20% of calls hang, raise or return garbage; retries absorb most; a call that hangs on every attempt ends its
    episode as retryable (the backend could not answer), one that errs on every attempt as a recorded error."""
    faulty = FaultyBackend(ScriptedBackend(lambda r: render_action(Finish(f"answer-{r.state}"))), rate=0.2, seed=3)
    backend = RetryingBackend(faulty, timeout_s=0.05, max_retries=2, backoff_s=0.001, seed=0)

    async def episode(task):
        answers = []
        for _step in range(4):
            result = await backend.chat(ChatRequest([{"role": "user", "content": task}], state=task))
            try:
                answers.append(parse_orchestrator_action(result.text).answer)
            except ProtocolError as e:
                answers.append(e.kind)
        ok = answers.count(f"answer-{task}") == 4
        return record(task, ok, "all answers" if ok else f"got {answers}")

    store = TrajectoryStore(tmp_path / "ep.jsonl")
    tasks = [f"t{i}" for i in range(100)]
    summary = run(tasks, episode, store, concurrency=32)
    records = list(store)  # every line, retryable ones included
    assert sorted(r.episode_id for r in records) == sorted(tasks) and summary.completed == 100
    assert set(faulty.injected) == {"timeout", "error", "garbage"}
    assert 0 < summary.succeeded < 100  # garbage replies fail some episodes, retries save the rest
    assert summary.errors == sum(r.outcome.reason.startswith("error: BackendError") for r in records)
    retryable = [r for r in records if r.outcome.retryable]
    assert summary.retryable == len(retryable) and store.retryable_ids() == {r.episode_id for r in retryable}
    assert all(r.outcome.reason.startswith("backend_unavailable: BackendError: ") for r in retryable)
    assert all("timed out" in r.outcome.reason for r in retryable)


def test_unavailable_backends_leave_retryable_records_and_a_rerun_plays_exactly_those(tmp_path):
    """A raised failure that says the backend could not answer is recorded as retryable; any other as a finished
    error. A (task, run) pair is done only with a finished record, so the rerun plays the retryable ones alone."""
    down = {"t1": "connection", "t4": "timeout", "t6": "server"}

    async def episode(task):
        if task in down:
            raise BackendError(f"no server answered {task}", kind=down[task])
        if task == "t2":
            raise BackendError("HTTP 400: bad request")  # the request's fault: finished, not retried
        return record(task)

    store = TrajectoryStore(tmp_path / "ep.jsonl")
    tasks = [f"t{i}" for i in range(8)]
    first = run(tasks, episode, store)
    assert (first.completed, first.retryable, first.errors, first.succeeded, first.failed) == (8, 3, 1, 4, 1)
    assert store.retryable_ids() == set(down) and store.episode_ids() == set(tasks) - set(down)
    by_id = {r.episode_id: r for r in store}
    assert all(by_id[t].outcome.reason.startswith("backend_unavailable: BackendError") for t in down)
    assert not by_id["t2"].outcome.retryable and by_id["t2"].outcome.reason.startswith("error: BackendError")

    rerun: list[str] = []

    async def healthy(task):
        rerun.append(task)
        return record(task)

    second = run(tasks, healthy, store)
    assert sorted(rerun) == sorted(down) and (second.skipped, second.completed, second.retryable) == (5, 3, 0)
    assert sorted(r.episode_id for r in store.read()) == tasks and store.retryable_ids() == set()
    assert collections.Counter(r.episode_id for r in store) == {t: 1 + (t in down) for t in tasks}


@pytest.mark.parametrize("bound", [None, 0, -1.0, float("inf")])
def test_every_episode_wait_is_bounded(tmp_path, bound):
    with pytest.raises(ValueError, match="episode_timeout_s must be a finite number of seconds > 0"):
        run(["a"], lambda t: record(t), TrajectoryStore(tmp_path / "ep.jsonl"), episode_timeout_s=bound)


CHILD = textwrap.dedent("""
    import asyncio, random, sys
    from porch_jax.rollout.runner import run_episodes
    from porch_jax.trajectories import EpisodeRecord, Outcome, TrajectoryStore

    async def episode(task):
        await asyncio.sleep(random.uniform(0.01, 0.05))
        return EpisodeRecord(episode_id=task, task_id=task, env="toy", system="s", config_hash="h", seed=0,
                             outcome=Outcome(success=True, score=1.0, reason="ok"), meta={"pad": "x" * 3000})

    tasks = [f"t{i:03d}" for i in range(200)]
    print(asyncio.run(run_episodes(tasks, episode, TrajectoryStore(sys.argv[1]), concurrency=8, progress=False)))
""")


def test_kill_9_then_rerun_records_each_episode_exactly_once(tmp_path):
    """Killed by the crash point of the store's fifth write (porch_jax/faults.py): half of that batch's last line on
    disk, then SIGKILL; the rerun sets the torn line aside and plays exactly the episodes without a whole line."""
    path = tmp_path / "ep.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    killed = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)], env={**env, faults.ENV: "ep.jsonl@5"}, timeout=120
    )
    assert killed.returncode == -signal.SIGKILL
    lines = path.read_bytes().splitlines(keepends=True)
    lines_at_kill = sum(line.endswith(b"\n") for line in lines)
    assert 4 <= lines_at_kill < 200 and not lines[-1].endswith(b"\n")  # four whole writes, then a torn one
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert f"skipped={lines_at_kill}" in done.stdout
    ids = [json.loads(line)["episode_id"] for line in path.read_text().splitlines()]
    assert collections.Counter(ids) == {f"t{i:03d}": 1 for i in range(200)}
    assert (tmp_path / "ep.jsonl.torn").exists()
