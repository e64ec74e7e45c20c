"""Training metrics to TensorBoard and stdout, with a progress line (rate, ETA).

Only process 0 writes. Throughput excludes the first step of each run, which pays for compiling.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

import jax

from porch_jax.progress import format_duration


class NonFiniteError(FloatingPointError):
    """A step produced NaN or inf; the message names the step, the metrics and the last good checkpoint."""


# Metrics that must be finite for a step's new state to be kept.
GUARDED = ("loss", "grad_norm", "update_norm")


def check_finite(step: int, metrics: Mapping[str, float], last_good: int | None) -> None:
    bad = {k: metrics[k] for k in GUARDED if k in metrics and not math.isfinite(metrics[k])}
    if bad:
        where = f"last good checkpoint: step {last_good}" if last_good is not None else "no checkpoint was saved"
        raise NonFiniteError(f"non-finite values at step {step}: {bad}; stopping without saving this state ({where})")


class MetricsLogger:
    """Logs per-step scalars; `every` controls the stdout line (none without a stream), TensorBoard gets every step."""

    def __init__(
        self, logdir: str | Path | None, total_steps: int, *, every: int = 1, stream: TextIO | None = sys.stdout
    ):
        self.total, self.every, self.stream = total_steps, max(every, 1), stream
        self.enabled = jax.process_index() == 0
        self.writer = None
        if self.enabled and logdir is not None:
            from tensorboardX import SummaryWriter

            self.writer = SummaryWriter(str(logdir))
        self._t0: float | None = None
        self._steps_timed = 0
        self._tokens_timed = 0.0
        self._last = time.perf_counter()

    def log(self, step: int, metrics: Mapping[str, float]) -> dict[str, float]:
        """Records step `step` (1-based, after its update); returns the metrics with rates added."""
        now = time.perf_counter()
        dt, self._last = now - self._last, now
        out = dict(metrics)
        out["step_time_s"] = dt
        if self._t0 is None:  # the first step of a run includes compilation
            self._t0 = now
        else:
            self._steps_timed += 1
            self._tokens_timed += float(metrics.get("tokens", 0.0))
            elapsed = now - self._t0
            out["steps_per_s"] = self._steps_timed / elapsed
            out["tokens_per_s"] = self._tokens_timed / elapsed
        if not self.enabled:
            return out
        if self.writer is not None:
            for k, v in out.items():
                self.writer.add_scalar(f"train/{k}", v, step)
        if self.stream is not None and (step % self.every == 0 or step == self.total):
            print(self._line(step, out), file=self.stream, flush=True)
        return out

    def _line(self, step: int, m: Mapping[str, float]) -> str:
        parts = [f"step {step}/{self.total} ({100 * step / max(self.total, 1):.0f}%)", f"loss {m['loss']:.4f}"]
        parts += [f"{k} {m[k]:.4f}" for k in ("ce", "rwr", "opd", "pg", "kl", "logprob_gap") if k in m]
        parts += [f"grad_norm {m['grad_norm']:.3f}", f"lr {m['learning_rate']:.2e}"]
        if "steps_per_s" in m:
            rate = m["steps_per_s"]
            parts += [
                f"{m['tokens_per_s']:,.0f} tok/s",
                f"{rate:.2f} it/s",
                f"ETA {format_duration((self.total - step) / rate)}",
            ]
        return " | ".join(parts)

    def text(self, message: str) -> None:
        if self.enabled:
            if self.stream is not None:
                print(message, file=self.stream, flush=True)
            if self.writer is not None:
                self.writer.add_text("train/log", message)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
