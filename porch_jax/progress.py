"""The progress line of long loops whose units take seconds to minutes (rollouts, agent calls): rate and ETA,
throttled. No JAX here, so the rollout side can use it."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class ProgressLine:
    """Emits "<text> | <rate> <unit>/s, ETA h:mm:ss" for work of `total` units at most every `every_s` seconds
    and when the last unit is done: for loops whose units take seconds to minutes (agent calls)."""

    def __init__(
        self, total: int, emit: Callable[[str], None], *, every_s: float = 30.0, unit: str = "it", done: int = 0
    ):
        self.total, self.emit, self.every_s, self.unit, self.start = total, emit, every_s, unit, done
        self.t0 = self._shown = time.perf_counter()

    def __call__(self, done: int, text: str) -> None:
        now = time.perf_counter()
        if done < self.total and now - self._shown < self.every_s:
            return
        self._shown = now
        rate = (done - self.start) / max(now - self.t0, 1e-9)
        eta = format_duration((self.total - done) / rate) if rate > 0 else "?"
        self.emit(f"{text} | {rate:.2f} {self.unit}/s, ETA {eta}")


class Stages:
    """The stage log of a resumable experiment: each stage is announced with the seconds since the run began,
    and a stage whose output is already on disk is skipped, saying so. `should_run(name, done=...)` is the one
    resume decision (True when the stage has work to do); `begin(name)` announces a stage that always runs
    (one that resumes inside itself, or reads what is cached).

    With `record`, every announcement is also appended there (stage, state, wall time, process) and `end()` closes
    the last stage, so `stage_times(record)` can sum each stage's seconds over the processes of a resumed run."""

    def __init__(self, emit: Callable[[str], None] = print, record: str | Path | None = None):
        self.emit, self.t0 = emit, time.monotonic()
        self.record = None if record is None else Path(record)

    def begin(self, name: str) -> None:
        self._announce(name, "running")

    def should_run(self, name: str, *, done: bool) -> bool:
        self._announce(name, "done, skipped" if done else "running")
        return not done

    def end(self) -> None:
        """The last stage is over (a process that is killed leaves its last stage open: not counted)."""
        self._write(None, "end")

    def _announce(self, name: str, state: str) -> None:
        self.emit(f"\n=== [{time.monotonic() - self.t0:6.0f}s] {name}: {state}")
        self._write(name, state)

    def _write(self, name: str | None, state: str) -> None:
        if self.record is not None:
            with self.record.open("a") as f:
                f.write(json.dumps({"stage": name, "state": state, "time": time.time(), "pid": os.getpid()}) + "\n")


def stage_times(record: str | Path) -> list[tuple[str, float]]:
    """Each stage's seconds in a `Stages` record, summed over the processes that ran it, in order of first
    appearance: an announcement lasts until the same process's next one; a process's last open stage (killed, or
    still running) is not counted. Torn lines (a write cut by a kill) are skipped."""
    events = []
    for line in Path(record).read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    totals: dict[str, float] = {}
    for a, b in zip(events, events[1:], strict=False):
        if a["stage"] is not None and a["pid"] == b["pid"]:
            totals[a["stage"]] = totals.get(a["stage"], 0.0) + b["time"] - a["time"]
    return list(totals.items())
