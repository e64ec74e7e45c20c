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

CURVES = ("ce", "opd", "pg", "reward", "logprob_gap")


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
    for ax, key in zip(axes[0], keys):
        for name, ms in runs.items():
            pts = [(m["step"], m[key]) for m in ms if key in m]
            if pts:
                ax.plot([p[0] for p in pts], _smooth([p[1] for p in pts], smooth), label=name)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_success(rows: Sequence[Summary], path: str | Path) -> Path:
    """Held-out success per method with its Wilson 95% interval."""
    fig, ax = plt.subplots(figsize=(1.3 * len(rows) + 1.5, 3.2))
    xs = range(len(rows))
    ax.bar(xs, [r.success for r in rows], color="#7aa6c2")
    ax.errorbar(xs, [r.success for r in rows], yerr=[[r.success - r.ci[0] for r in rows],
                                                     [r.ci[1] - r.success for r in rows]], fmt="none", color="k",
                capsize=4)
    ax.set_xticks(list(xs), [r.system for r in rows])
    ax.set_ylim(0, 1)
    ax.set_ylabel("held-out success (95% CI)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_seed_sets(agg: Mapping[str, Any], path: str | Path) -> Path:
    """Held-out success per method over seed sets: one dot per set, the bar at their mean."""
    methods = agg["methods"]
    fig, ax = plt.subplots(figsize=(1.3 * len(methods) + 1.5, 3.2))
    xs = range(len(methods))
    ax.bar(xs, [m["mean"] for m in methods], color="#7aa6c2")
    for x, m in zip(xs, methods):
        ax.plot([x] * len(m["success"]), m["success"], "o", color="k", markersize=3)
    ax.set_xticks(list(xs), [m["system"] for m in methods])
    ax.set_ylim(0, 1)
    ax.set_ylabel(f"held-out success ({len(agg['seed_sets'])} seed sets)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
