"""The results table: success with Wilson 95% intervals, paired differences, tokens per task.

Paired differences compare two methods on the same held-out tasks (a 95% normal interval of the
per-task success difference), which is narrower than comparing two Wilson intervals when the
methods fail on the same hard tasks; both are reported, and a claim "A beats B" is called
*separated* only when A's Wilson interval lies wholly above B's.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from porch_jax.attribution.judge import known_facts
from porch_jax.envs.workplace.clauses import KIND, parse_subgoal, work
from porch_jax.rollout.compare import Summary, summarize
from porch_jax.trajectories import EpisodeRecord

# The expert's blind spots, checked on every delegation (the mechanism OPD is meant to fix).
BLIND_SPOT_CHECKS = ("archive granted", "known facts handed over", "file budget covers the pages")


@dataclass(frozen=True)
class Comparison:
    better: str
    worse: str
    delta: tuple[float, float, float] | None  # paired: mean, lo, hi
    separated: bool  # better's Wilson interval is wholly above worse's


def summaries(records: Mapping[str, Sequence[EpisodeRecord]], reference: str | None = None) -> list[Summary]:
    """One row per method, in the given order; paired deltas against ``reference`` when given."""
    ref = records.get(reference) if reference else None
    return [summarize(m, r, ref if m != reference else None) for m, r in records.items()]


def compare(records: Mapping[str, Sequence[EpisodeRecord]], better: str, worse: str) -> Comparison:
    b, w = summarize(better, records[better], records[worse]), summarize(worse, records[worse])
    return Comparison(better, worse, b.delta, b.ci[0] > w.ci[1])


def orchestrator_tokens(records: Sequence[EpisodeRecord]) -> float:
    costs = [r.cost.get("orchestrator") for r in records]
    return sum(c.prompt_tokens + c.completion_tokens for c in costs if c) / max(len(records), 1)


def format_table(
    rows: Sequence[Summary],
    records: Mapping[str, Sequence[EpisodeRecord]],
    comparisons: Sequence[Comparison] = (),
    skipped: Mapping[str, str] | None = None,
    not_applicable: Mapping[str, str] | None = None,
) -> str:
    """A markdown table (a configured method that was not trained has a row saying why, and so has a method that does
    not apply to a framework, e.g. OPOD to one without mid-run feedback), then the claims checked."""
    ref = next((r.system for r in rows if r.delta is None), "")
    lines = [
        f"| method | n | success | 95% CI | vs {ref} (paired 95% CI) | tokens/task | orchestrator tokens/task "
        "| decisions/task | invalid |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in rows:
        d = f"{s.delta[0]:+.3f} [{s.delta[1]:+.3f}, {s.delta[2]:+.3f}]" if s.delta else ""
        recs = records[s.system]
        decisions = sum(len(r.decisions) for r in recs) / max(len(recs), 1)
        lines.append(
            f"| {s.system} | {s.n} | {s.success:.3f} | [{s.ci[0]:.3f}, {s.ci[1]:.3f}] | {d} | {s.tokens:.0f} "
            f"| {orchestrator_tokens(recs):.0f} | {decisions:.1f} | {s.invalid_rate:.3f} |"
        )
    for name, why in (skipped or {}).items():
        lines.append(f"| {name} | 0 | not trained: {why} |  |  |  |  |  |  |")
    for name, why in (not_applicable or {}).items():
        lines.append(f"| {name} | - | not applicable: {why} |  |  |  |  |  |  |")
    for c in comparisons:
        d = f"{c.delta[0]:+.3f} [{c.delta[1]:+.3f}, {c.delta[2]:+.3f}]" if c.delta else "n/a"
        verdict = "intervals separated" if c.separated else "intervals overlap"
        lines.append(f"\n{c.better} - {c.worse}: paired {d}; Wilson {verdict}")
    return "\n".join(lines)


def blind_spot_rates(records: Sequence[EpisodeRecord]) -> dict[str, tuple[int, int]]:
    """(fixed, applicable) per check over all delegations: a past year's figure gets the archive
    tool; every fact the clause needs that an earlier result showed is in the context; a file read
    gets a budget for all its pages (open, every page, submit)."""
    out = dict.fromkeys(BLIND_SPOT_CHECKS, (0, 0))

    def add(check: str, ok: bool) -> None:
        k, n = out[check]
        out[check] = (k + ok, n + 1)

    for r in records:
        for d in r.decisions:
            for args in _delegations(d.action):
                _check_delegation(args, d.context, add)
    return out


def _delegations(action: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """The harness arguments an action delegates: a delegate's, or each subtask of a joined delegation's."""
    if not action:
        return []
    args = action.get("arguments") or {}
    if action.get("name") == "delegate":
        return [args]
    if action.get("name") in ("delegate_all", "plan"):
        return [t for t in args.get("subtasks") or [] if isinstance(t, Mapping)]
    return []


def _check_delegation(
    args: Mapping[str, Any], context: Sequence[Mapping[str, Any]], add: Callable[[str, bool], None]
) -> None:
    """The blind-spot checks of one delegation's harness, made in the context it was written in."""
    for c in parse_subgoal(str(args.get("subgoal", ""))) or []:
        if c.kind == "history":
            add("archive granted", "archive" in args.get("tools", []))
        known = known_facts(context)
        needed = [k for k in KIND[c.kind].needs(c.args) if k in known]
        if needed:
            given = {line.split(": ", 1)[0] for line in args.get("context", [])}
            add("known facts handed over", set(needed) <= given)
        if c.kind == "file":
            add("file budget covers the pages", int(args.get("budget", 0)) >= work(c) + 1)


def format_blind_spots(records: Mapping[str, Sequence[EpisodeRecord]]) -> str:
    lines = ["| method | " + " | ".join(BLIND_SPOT_CHECKS) + " |", "|---|" + "---|" * len(BLIND_SPOT_CHECKS)]
    for name, recs in records.items():
        rates = blind_spot_rates(recs)
        lines.append(
            f"| {name} | " + " | ".join(f"{k / n:.2f} ({k}/{n})" if n else "-" for k, n in rates.values()) + " |"
        )
    return "\n".join(lines)


def write_results(
    rows: Sequence[Summary],
    comparisons: Sequence[Comparison],
    path: str | Path,
    skipped: Mapping[str, str] | None = None,
    not_applicable: Mapping[str, str] | None = None,
    references: Sequence[Summary] = (),
) -> None:
    """results.json: the rows and claims, the methods not trained (`skipped`) or not applicable, with why, and the
    rows that are references rather than trained methods (e.g. the demonstrator, the untrained model)."""
    Path(path).write_text(
        json.dumps(
            {
                "methods": [dataclasses.asdict(r) for r in rows],
                "references": [dataclasses.asdict(r) for r in references],
                "comparisons": [dataclasses.asdict(c) for c in comparisons],
                "not_trained": dict(skipped or {}),
                "not_applicable": dict(not_applicable or {}),
            },
            indent=1,
        )
    )
