"""Concurrent episode runner with resume: every task ends with exactly one finished record (after any retryable
attempts: one per run that the backend's outage cut short).

- Concurrency: ``concurrency`` workers pull tasks from one iterator, so at most that many
  episodes run at once (and no more coroutines exist than workers).
- Resume: a task is done when the store holds a finished record for its key (``outcome.retryable``
  False), so rerunning after a crash or a ``kill -9`` plays the remaining tasks and the retryable
  ones, and never records a finished one twice.
- Every episode ends recorded: if ``episode_fn`` raises, times out or returns a record the store
  would reject, a failure record (``success=False``, ``reason="error: ..."``) takes its place. A
  raised failure that says the backend could not answer (``backends.base.unavailable``: every
  server down or stalled past the retries) is recorded as retryable (``reason="backend_unavailable:
  ..."``), like the engine's own records of such episodes: the rerun plays it again.
- Every wait is bounded: each episode by ``episode_timeout_s`` (an episode past it is a finished
  failure, "error: episode timed out": the rerun would meet the same bound), so the run ends within
  about ceil(tasks / concurrency) of those bounds.
- One writer: workers hand records to a single writer task that appends and fsyncs in a thread,
  so lines never interleave and the event loop never blocks on disk.

A write failure (disk full, store locked) is not an episode failure: it stops the run and raises.
"""

from __future__ import annotations

import asyncio
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from porch_jax.backends.base import unavailable
from porch_jax.progress import ProgressLine
from porch_jax.trajectories import EpisodeRecord, Outcome, TrajectoryStore, encode_record

EpisodeFn = Callable[[Any], Awaitable[EpisodeRecord]]
ErrorRecordFn = Callable[[Any, str, str], EpisodeRecord]


def task_key(task: Any) -> str:
    """A task's episode id: its ``episode_id`` or ``task_id`` (attribute or key), or the str itself."""
    for name in ("episode_id", "task_id"):
        value = task.get(name) if isinstance(task, Mapping) else getattr(task, name, None)
        if value is not None:
            return str(value)
    if isinstance(task, str):
        return task
    raise TypeError(f"cannot derive an episode id from {type(task).__name__}; pass key=")


def error_record(task: Any, key: str, reason: str) -> EpisodeRecord:
    """The record of an episode that did not produce one."""

    def get(name: str, default: Any) -> Any:
        value = task.get(name) if isinstance(task, Mapping) else getattr(task, name, None)
        return default if value is None else value

    seed = get("seed", 0)
    return EpisodeRecord(
        episode_id=key,
        task_id=str(get("task_id", key)),
        env=str(get("env", "")),
        system="",
        config_hash="",
        seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else 0,
        outcome=Outcome(success=False, score=0.0, reason=reason),
    )


@dataclass
class RunSummary:
    total: int
    skipped: int  # already in the store
    completed: int  # recorded by this run, retryable attempts included
    succeeded: int
    errors: int  # recorded with an "error: ..." reason
    wall_s: float
    retryable: int = 0  # recorded as retryable (the backend could not answer): a rerun plays these again

    @property
    def failed(self) -> int:
        """Finished failures: recorded, not successful, not retryable."""
        return self.completed - self.succeeded - self.retryable


class _Progress:
    def __init__(self, todo: int, skipped: int, enabled: bool, interval_s: float):
        self.todo, self.skipped = todo, skipped
        self.done = self.ok = self.errors = self.retryable = 0
        self.line = (
            ProgressLine(
                todo, lambda s: print(f"[runner] {s}", file=sys.stderr, flush=True), every_s=interval_s, unit="ep"
            )
            if enabled
            else None
        )

    def update(self, record: EpisodeRecord) -> None:
        self.done += 1
        self.ok += record.outcome.success
        self.errors += record.outcome.reason.startswith("error:")
        self.retryable += record.outcome.retryable
        if self.line is not None:
            self.line(
                self.done,
                f"{self.done}/{self.todo} done ({self.ok} ok, {self.errors} errors, {self.retryable} retryable, "
                f"{self.skipped} skipped earlier)",
            )


async def _run_one(
    task: Any, key: str, episode_fn: EpisodeFn, timeout_s: float, on_error: ErrorRecordFn
) -> EpisodeRecord:
    retryable = False
    try:
        record = await asyncio.wait_for(episode_fn(task), timeout_s)
        if not isinstance(record, EpisodeRecord):
            raise TypeError(f"episode_fn returned {type(record).__name__}, not EpisodeRecord")
        if not record.episode_id:
            record.episode_id = key
        elif record.episode_id != key:
            raise ValueError(f"episode_fn returned episode_id {record.episode_id!r} for task key {key!r}")
        encode_record(record)  # a record the store would reject becomes an error record, not a crash
        return record
    except asyncio.CancelledError:
        task_ = asyncio.current_task()
        if task_ is not None and task_.cancelling():
            raise  # the run itself is being cancelled
        reason, tb = "error: CancelledError inside the episode", traceback.format_exc()
    except TimeoutError:
        reason, tb = f"error: episode timed out after {timeout_s}s", traceback.format_exc()
    except Exception as e:
        retryable = unavailable(e)
        label = "backend_unavailable" if retryable else "error"
        reason, tb = f"{label}: {type(e).__name__}: {e}", traceback.format_exc()
    record = on_error(task, key, reason[:2000])
    record.outcome.retryable = retryable
    record.meta.setdefault("traceback", tb[-4000:])
    return record


async def run_episodes(
    tasks: Iterable[Any],
    episode_fn: EpisodeFn,
    store: TrajectoryStore,
    concurrency: int = 32,
    progress: bool = True,
    *,
    key: Callable[[Any], str] = task_key,
    episode_timeout_s: float = 3600.0,
    on_error: ErrorRecordFn = error_record,
    progress_interval_s: float = 5.0,
) -> RunSummary:
    """Run ``episode_fn`` over the tasks not finished in ``store``; returns counts and wall time.

    Raises only for a bad call (duplicate task keys, concurrency < 1, a bound that is not a positive number of
    seconds) or a failed write.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if not (isinstance(episode_timeout_s, int | float) and 0 < episode_timeout_s < float("inf")):
        raise ValueError(f"episode_timeout_s must be a finite number of seconds > 0, got {episode_timeout_s!r}")
    t0 = time.monotonic()
    keyed = [(key(t), t) for t in tasks]
    keys = [k for k, _ in keyed]
    if len(set(keys)) != len(keys):
        dupes = sorted({k for k in keys if keys.count(k) > 1})[:5]
        raise ValueError(f"duplicate task keys (each episode id is recorded once): {dupes}")
    seen = await asyncio.to_thread(store.episode_ids)
    todo = [(k, t) for k, t in keyed if k not in seen]
    prog = _Progress(len(todo), len(keyed) - len(todo), progress, progress_interval_s)
    queue: asyncio.Queue[EpisodeRecord | None] = asyncio.Queue()
    it = iter(todo)

    async def worker() -> None:
        for k, t in it:  # one shared iterator: the loop is single-threaded, so no task runs twice
            queue.put_nowait(await _run_one(t, k, episode_fn, episode_timeout_s, on_error))

    async def writer() -> None:
        while True:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            records = [r for r in batch if r is not None]
            await asyncio.to_thread(store.append_many, records)
            for r in records:
                prog.update(r)
            if None in batch:
                return

    workers = [asyncio.create_task(worker()) for _ in range(min(concurrency, len(todo)))]
    writing = asyncio.create_task(writer())
    writing.add_done_callback(lambda t: t.cancelled() or t.exception() is None or [w.cancel() for w in workers])
    try:
        await asyncio.gather(*workers)
    finally:
        for w in workers:
            w.cancel()
        queue.put_nowait(None)  # flush whatever finished, also when cancelled
        await writing
    return RunSummary(
        total=len(keyed),
        skipped=len(keyed) - len(todo),
        completed=prog.done,
        succeeded=prog.ok,
        errors=prog.errors,
        wall_s=time.monotonic() - t0,
        retryable=prog.retryable,
    )
