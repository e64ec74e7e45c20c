"""Seed sets as the reported unit of the OPOD pipeline (launch/pipeline.py, `seed_sets`).

One pipeline run draws every source of training randomness once (initial weights, batch order, rollouts,
OPD and GRPO samples); on the quickstart single runs moved with float-level rounding (README). Running the
loop once per seed set and reporting the sets' mean and spread, with paired differences whose intervals are
taken over sets, is the claim that survives that. Each set's config is `porch_jax.opod.config.with_seed_set`
(or `--config=experiments/quickstart.py:seed_set=k`); this module aggregates the sets' results.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats


def aggregate(results: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Seed sets as the reported unit: `results` maps each seed set to its run's results.json.

    One run per seed set measures one draw of every source of training randomness (initial weights,
    batch order, rollouts, OPD samples). Per method: mean, sample sd and range of held-out success over
    the sets. Per comparison: the mean of the sets' paired differences with a 95% t-interval over sets
    (the sets, not the tasks, are the independent units: every set is evaluated on the same held-out
    tasks), and the number of sets whose own paired interval lies above zero. Both intervals are clipped to
    the values' range.
    """
    if not results:
        raise ValueError("no seed-set results to aggregate")
    sets = sorted(results)
    named = {k: {m["system"]: m for m in results[k]["methods"]} for k in sets}
    paired = {
        k: {(c["better"], c["worse"]): c for c in results[k]["comparisons"] if c["delta"] is not None} for k in sets
    }
    # A method a set could not train (no data) is left out of every set's mean and named in `partial`.
    names = list(dict.fromkeys(name for k in sets for name in named[k]))
    common = [name for name in names if all(name in named[k] for k in sets)]
    out: dict[str, Any] = {
        "seed_sets": sets,
        "methods": [],
        "comparisons": [],
        "partial": {name: [k for k in sets if name in named[k]] for name in names if name not in common},
    }
    for name in common:
        values = [named[k][name]["success"] for k in sets]
        out["methods"].append({"system": name, "success": values, **_spread(values, bounds=(0.0, 1.0))})
    for pair in dict.fromkeys(pair for k in sets for pair in paired[k]):
        if all(pair in paired[k] for k in sets):
            deltas = [paired[k][pair]["delta"][0] for k in sets]
            above = sum(paired[k][pair]["delta"][1] > 0 for k in sets)
            out["comparisons"].append(
                {
                    "better": pair[0],
                    "worse": pair[1],
                    "delta": deltas,
                    **_spread(deltas, bounds=(-1.0, 1.0)),
                    "sets_above_zero": above,
                }
            )
    return out


def _spread(values: Sequence[float], bounds: tuple[float, float]) -> dict[str, Any]:
    """Mean, sample sd, range and the 95% t-interval of the mean (None for a single value), clipped to
    `bounds`: a success rate's mean cannot pass 1, yet three sets at 1.0, 1.0 and 0.9 give a t-interval
    reaching 1.11; the clipped end says "up to the bound", which is what the data support."""
    v = np.asarray(values, float)
    mean = float(v.mean())
    if len(v) < 2:
        return {"mean": mean, "sd": 0.0, "min": mean, "max": mean, "ci": None}
    sd = float(v.std(ddof=1))
    half = float(stats.t.ppf(0.975, len(v) - 1)) * sd / len(v) ** 0.5
    lo, hi = bounds
    return {
        "mean": mean,
        "sd": sd,
        "min": float(v.min()),
        "max": float(v.max()),
        "ci": [max(mean - half, lo), min(mean + half, hi)],
    }


def format_table(agg: Mapping[str, Any]) -> str:
    """Markdown tables of `aggregate`: success per set, then the paired differences."""
    sets = agg["seed_sets"]
    head = " | ".join(f"set {k}" for k in sets)
    lines = [
        f"Held-out success over {len(sets)} seed sets (one run each):",
        "",
        f"| method | mean | sd | 95% CI of the mean (within [0, 1]) | {head} |",
        "|---|---|---|---|" + "---|" * len(sets),
    ]
    for m in agg["methods"]:
        ci = f"[{m['ci'][0]:.3f}, {m['ci'][1]:.3f}]" if m["ci"] else ""
        lines.append(
            f"| {m['system']} | {m['mean']:.3f} | {m['sd']:.3f} | {ci} | "
            + " | ".join(f"{s:.3f}" for s in m["success"])
            + " |"
        )
    for name, present in agg.get("partial", {}).items():
        lines.append(f"\n{name}: trained in seed sets {present} only (no training data in the others); left out")
    if not agg["comparisons"]:
        return "\n".join(lines)
    lines += [
        "",
        "Paired differences on the same held-out tasks, mean over seed sets (95% t-interval over sets):",
        "",
        f"| comparison | mean | 95% CI over sets | sets with a paired CI above 0 | {head} |",
        "|---|---|---|---|" + "---|" * len(sets),
    ]
    for c in agg["comparisons"]:
        ci = f"[{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}]" if c["ci"] else ""
        lines.append(
            f"| {c['better']} - {c['worse']} | {c['mean']:+.3f} | {ci} | {c['sets_above_zero']}/{len(sets)} | "
            + " | ".join(f"{d:+.3f}" for d in c["delta"])
            + " |"
        )
    return "\n".join(lines)
