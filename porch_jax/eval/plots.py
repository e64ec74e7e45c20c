"""Training curves (from each run's metrics.jsonl) and held-out success with intervals, as PNGs."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on build machines
import matplotlib.pyplot as plt  # noqa: E402 (after the backend is chosen)

from porch_jax.rollout.compare import Summary  # noqa: E402

CURVES = ("ce", "rwr", "opd", "pg", "reward", "logprob_gap")


def read_metrics(path: str | Path) -> list[dict[str, float]]:
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def _smooth(values: Sequence[float], k: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v - (values[i - k] if i >= k else 0.0)
        out.append(acc / min(i + 1, k))
    return out


def plot_curves(runs: Mapping[str, Sequence[Mapping[str, float]]], path: str | Path, smooth: int = 5) -> Path:
    """One panel per loss part present in any run; one line per run (moving average over ``smooth`` steps)."""
    keys = [k for k in CURVES if any(k in m for ms in runs.values() for m in ms)] or ["loss"]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        for name, ms in runs.items():
            pts = [(m["step"], m[key]) for m in ms if key in m]
            if pts:
                ax.plot([p[0] for p in pts], _smooth([p[1] for p in pts], smooth), label=name)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    return _save(fig, path)


def plot_loss_curves(runs: Mapping[str, Sequence[Mapping[str, float]]], path: str | Path, smooth: int = 5) -> Path:
    """Training loss (moving average over ``smooth`` steps) and validation loss (its own points, where logged) per
    run, in one panel: the SFT curves an epoch and learning-rate choice is read from."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for i, (name, ms) in enumerate(runs.items()):
        color = f"C{i}"
        train = [(m["step"], m["loss"]) for m in ms if "loss" in m]
        val = [(m["step"], m["val_loss"]) for m in ms if "val_loss" in m]
        if train:
            ax.plot([p[0] for p in train], _smooth([p[1] for p in train], smooth), color=color, label=f"{name} train")
        if val:
            ax.plot([p[0] for p in val], [p[1] for p in val], "o--", color=color, label=f"{name} validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_success(rows: Sequence[Summary], path: str | Path) -> Path:
    """Held-out success per method with its Wilson 95% interval."""
    return _success_with_ci([r.system for r in rows], rows, "held-out success (95% CI)", path)


def plot_group_success(rows: Sequence[Any], path: str | Path, ylabel: str = "success (95% CI)") -> Path:
    """A benchmark run's success per group (``rollout.pairs.GroupResult``: capability, level) with its interval."""
    return _success_with_ci([r.group for r in rows], rows, ylabel, path)


def _success_with_ci(names: Sequence[str], rows: Sequence[Any], ylabel: str, path: str | Path) -> Path:
    fig, ax = _success_bars(names, [r.success for r in rows], ylabel)
    ax.errorbar(
        range(len(rows)),
        [r.success for r in rows],
        # Clamped: a Wilson bound at 0 or 1 can sit a rounding error inside the point estimate.
        yerr=[[max(0.0, r.success - r.ci[0]) for r in rows], [max(0.0, r.ci[1] - r.success) for r in rows]],
        fmt="none",
        color="k",
        capsize=4,
    )
    return _save(fig, path)


def plot_seed_sets(agg: Mapping[str, Any], path: str | Path) -> Path:
    """Held-out success per method over seed sets: one dot per set, the bar at their mean."""
    methods = agg["methods"]
    fig, ax = _success_bars(
        [m["system"] for m in methods],
        [m["mean"] for m in methods],
        f"held-out success ({len(agg['seed_sets'])} seed sets)",
    )
    for x, m in enumerate(methods):
        ax.plot([x] * len(m["success"]), m["success"], "o", color="k", markersize=3)
    return _save(fig, path)


def _success_bars(names: Sequence[str], heights: Sequence[float], ylabel: str) -> tuple[Any, Any]:
    """A bar per method on a 0-1 success axis; callers draw the spread on top."""
    fig, ax = plt.subplots(figsize=(1.3 * len(names) + 1.5, 3.2))
    ax.bar(range(len(names)), heights, color="#7aa6c2")
    ax.set_xticks(list(range(len(names))), list(names))
    ax.set_ylim(0, 1)
    ax.set_ylabel(ylabel)
    return fig, ax


def _save(fig: Any, path: str | Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
