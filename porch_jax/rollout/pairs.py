"""(task, run) pairs: the unit every benchmark runner records, resumes and reports.

A benchmark runs each task N times (GAIA2's leaderboard runs 3). Pair ``(task, r)`` is the episode id
``<task id>#run<r>``, so the trajectory store's rules are the pairs' rules: a pair is finished when the store holds
a finished record for it; a retryable failure (server gone, timeout: ``outcome.retryable``) is recorded and is not
finished, so a rerun redoes exactly those pairs and nothing else (``rollout.runner.run_episodes``).

Results are grouped (by capability, level, source): success over pairs with a Wilson 95% interval, the tasks
solved in every run (pass^N) and in any run (pass@N), tokens per pair, retryable pairs still open. This module is
pure Python (no JAX, no plotting): the GAIA2 runner imports it inside ARE's virtualenv.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from porch_jax.trajectories import EpisodeRecord

RUN_SEP = "#run"
ALL = "all"


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials."""
    if n == 0:
        return (0.0, 1.0)
    p, d = k / n, 1 + z * z / n
    centre, half = (p + z * z / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, centre - half), min(1.0, centre + half))


def pair_id(task_id: str, run: int) -> str:
    """The episode id of run ``run`` (1-based) of a task."""
    if run < 1:
        raise ValueError(f"run numbers start at 1, got {run}")
    return f"{task_id}{RUN_SEP}{run}"


def split_pair_id(episode_id: str) -> tuple[str, int]:
    """(task id, run) of a pair's episode id; raises naming the id when it is not one."""
    task_id, sep, run = episode_id.rpartition(RUN_SEP)
    if not sep or not task_id or not run.isdigit():
        raise ValueError(f"{episode_id!r} is not a (task, run) episode id (expected '<task id>{RUN_SEP}<n>')")
    return task_id, int(run)


@dataclass(frozen=True)
class Pair:
    task: Any
    task_id: str
    run: int

    @property
    def episode_id(self) -> str:
        return pair_id(self.task_id, self.run)


def make_pairs(tasks: Iterable[Any], runs: int, task_id: Callable[[Any], str]) -> list[Pair]:
    """Every task ``runs`` times, run-major (run 1 of every task before run 2), so a partial run covers all tasks."""
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    tasks = list(tasks)
    ids = [task_id(t) for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate task ids: {sorted({i for i in ids if ids.count(i) > 1})[:5]}")
    return [Pair(t, i, r) for r in range(1, runs + 1) for t, i in zip(tasks, ids, strict=True)]


@dataclass(frozen=True)
class GroupResult:
    group: str
    pairs: int  # finished pairs
    tasks: int
    success: float  # over finished pairs
    ci: tuple[float, float]
    pass_all: float  # share of tasks solved in every one of their finished runs (pass^N)
    pass_any: float  # share of tasks solved in at least one run (pass@N)
    tokens: float  # per pair, every role's prompt + completion tokens
    open_retryable: int  # pairs with only retryable attempts: a rerun plays them


@dataclass(frozen=True)
class PairOutcome:
    """A finished pair as the tables count it (from an episode record, or from a judge's verdict ledger)."""

    task_id: str
    run: int
    success: bool
    tokens: int = 0
    groups: tuple[str, ...] = ()  # e.g. a GAIA2 scenario's capabilities, a GAIA task's level


def record_tokens(record: EpisodeRecord) -> int:
    return sum(c.prompt_tokens + c.completion_tokens for c in record.cost.values())


def record_outcome(record: EpisodeRecord, groups: Sequence[str] = (), success: bool | None = None) -> PairOutcome:
    """The outcome of a pair whose episode id is a pair id (``pair_id``)."""
    task_id, run = split_pair_id(record.episode_id)
    ok = record.outcome.success if success is None else success
    return PairOutcome(task_id, run, ok, record_tokens(record), tuple(groups))


def results_by(outcomes: Sequence[PairOutcome], *, open_retryable: int = 0) -> list[GroupResult]:
    """One row per group (an outcome may sit in several), then "all". ``open_retryable``: pairs with only retryable
    attempts (a pair with no finished outcome has nothing to group it by: counted in "all")."""
    groups: dict[str, list[PairOutcome]] = defaultdict(list)
    for o in outcomes:
        for g in o.groups:
            groups[g].append(o)
    groups[ALL] = list(outcomes)
    rows = []
    for g in [*sorted(k for k in groups if k != ALL), ALL]:
        os_ = groups[g]
        by_task: dict[str, list[bool]] = defaultdict(list)
        for o in os_:
            by_task[o.task_id].append(o.success)
        k = sum(o.success for o in os_)
        rows.append(
            GroupResult(
                group=g,
                pairs=len(os_),
                tasks=len(by_task),
                success=k / len(os_) if os_ else 0.0,
                ci=wilson(k, len(os_)),
                pass_all=sum(all(v) for v in by_task.values()) / len(by_task) if by_task else 0.0,
                pass_any=sum(any(v) for v in by_task.values()) / len(by_task) if by_task else 0.0,
                tokens=sum(o.tokens for o in os_) / len(os_) if os_ else 0.0,
                open_retryable=open_retryable if g == ALL else 0,
            )
        )
    return rows


def markdown_table(rows: Sequence[GroupResult], *, title: str = "group") -> str:
    """The results as a Markdown table (success with its interval, pass^N / pass@N, tokens per pair)."""
    lines = [
        f"| {title} | pairs | tasks | success | 95% CI | pass^N | pass@N | tokens/pair | retryable open |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.group} | {r.pairs} | {r.tasks} | {r.success:.3f} | [{r.ci[0]:.3f}, {r.ci[1]:.3f}] | "
            f"{r.pass_all:.3f} | {r.pass_any:.3f} | {r.tokens:,.0f} | {r.open_retryable} |"
        )
    return "\n".join(lines) + "\n"


def write_results(
    out_dir: str | Path,
    rows: Sequence[GroupResult],
    meta: dict[str, Any],
    *,
    title: str,
    extra: dict[str, Sequence[GroupResult]] | None = None,
) -> Path:
    """``results.json`` (rows, the run's meta, any ``extra`` tables) and ``results.md`` beside it; returns the JSON
    path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    tables = {name: [asdict(r) for r in table] for name, table in (extra or {}).items()}
    path.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows], **tables}, indent=1))
    (out / "results.md").write_text(markdown_table(rows, title=title))
    return path
