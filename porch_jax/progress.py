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
