"""Crash points: named places where a fault test kills this process with SIGKILL, as a crash would.

``PORCH_JAX_CRASH_AT="NAME@N"`` makes the N-th pass of this process through the crash point NAME end it with
SIGKILL (no cleanup, no atexit, no flush: what ``kill -9`` or the OOM killer does). Unset, as in every real run,
a crash point costs one dictionary lookup. The points:

- ``<file name>`` (``expert.jsonl``, ``attribution.jsonl``, ...): a write of an append-only store
  (porch_jax/trajectories/jsonl.py). The N-th write is torn: half its bytes reach the disk, then the kill, so a
  resumed run meets a torn last line and a stage left half done.
- ``<trainer folder>.step`` (``sft.step``, ``opod.step``): after a trainer step, its checkpoint (when the step
  has one) written; the steps since the last checkpoint are lost and replayed on resume.

A kill at a chosen point is what makes a crash test deterministic: a stage that lasts milliseconds (a scripted
judge's attribution) is still killed inside, not before or after.
"""

from __future__ import annotations

import os
import signal

ENV = "PORCH_JAX_CRASH_AT"
_passes: dict[str, int] = {}


def _target() -> tuple[str, int] | None:
    spec = os.environ.get(ENV, "")
    if not spec:
        return None
    name, sep, count = spec.rpartition("@")
    if not sep or not name or not count.isdigit() or int(count) < 1:
        raise ValueError(f"${ENV}={spec!r}: expected NAME@N with N >= 1 (e.g. attribution.jsonl@2)")
    return name, int(count)


def due(name: str) -> bool:
    """Counts a pass through crash point `name`; True on the pass $PORCH_JAX_CRASH_AT names (the caller may leave
    a half-done write behind, then calls `crash`)."""
    target = _target()
    if target is None or target[0] != name:
        return False
    _passes[name] = _passes.get(name, 0) + 1
    return _passes[name] == target[1]


def crash() -> None:
    """SIGKILL this process now."""
    os.kill(os.getpid(), signal.SIGKILL)


def point(name: str) -> None:
    """Crash point `name`: SIGKILL here on the pass $PORCH_JAX_CRASH_AT names."""
    if due(name):
        crash()
