"""The progress line of long loops whose units take seconds to minutes (rollouts, agent calls): rate and ETA,
throttled. No JAX here, so the rollout side can use it."""

from __future__ import annotations

import time
from collections.abc import Callable


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
    (one that resumes inside itself, or reads what is cached)."""

    def __init__(self, emit: Callable[[str], None] = print):
        self.emit, self.t0 = emit, time.monotonic()

    def begin(self, name: str) -> None:
        self._announce(name, "running")

    def should_run(self, name: str, *, done: bool) -> bool:
        self._announce(name, "done, skipped" if done else "running")
        return not done

    def _announce(self, name: str, state: str) -> None:
        self.emit(f"\n=== [{time.monotonic() - self.t0:6.0f}s] {name}: {state}")
