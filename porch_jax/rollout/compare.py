"""Run several systems over the same seeded workplace tasks and compare them with intervals.

Each system writes its own JSONL store in the run directory through the resumable runner, so a
rerun finishes only what is missing. Systems run in parallel processes (the scripted episodes are
CPU-bound); the table is computed from the stores alone, so it can be rebuilt without rerunning.
Success intervals are Wilson 95% intervals; ablation deltas are paired (same tasks) 95% intervals.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from porch_jax.backends import ScriptedBackend
from porch_jax.envs.workplace import (
    ExpertConfig,
    ScriptedExpert,
    ScriptedSubagent,
    SubagentConfig,
    TaskMixture,
    WorkplaceEnv,
    make_tasks,
)
from porch_jax.rollout.config import Budgets, EngineConfig, system_config
from porch_jax.rollout.engine import Engine
from porch_jax.rollout.runner import run_episodes
from porch_jax.trajectories import EpisodeRecord, TrajectoryStore


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials."""
    if n == 0:
        return (0.0, 1.0)
    p, d = k / n, 1 + z * z / n
    centre, half = (p + z * z / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True)
class Summary:
    system: str
    n: int
    success: float
    ci: tuple[float, float]
    tokens: float  # per task, every orchestrator and sub-agent call (prompt + completion)
    steps: float  # sub-agent steps per task
    invalid_rate: float  # unparseable replies per model call
    errors: int  # episodes recorded with an "error: ..." reason
    delta: tuple[float, float, float] | None = None  # paired success difference to the reference: mean, lo, hi


def summarize(
    system: str, records: Sequence[EpisodeRecord], reference: Sequence[EpisodeRecord] | None = None
) -> Summary:
    n = len(records)
    k = sum(r.outcome.success for r in records)
    calls = sum(c.calls for r in records for c in r.cost.values())
    invalid = sum(sum(r.meta.get("invalid", {}).values()) for r in records)
    delta = None
    if reference is not None:
        ref = {r.task_id: r.outcome.success for r in reference}
        diffs = [int(r.outcome.success) - int(ref[r.task_id]) for r in records if r.task_id in ref]
        if len(diffs) > 1:
            mean = sum(diffs) / len(diffs)
            sd = math.sqrt(sum((x - mean) ** 2 for x in diffs) / (len(diffs) - 1))
            half = 1.96 * sd / math.sqrt(len(diffs))
            delta = (mean, mean - half, mean + half)
    return Summary(
        system,
        n,
        k / n if n else 0.0,
        wilson(k, n),
        sum(c.prompt_tokens + c.completion_tokens for r in records for c in r.cost.values()) / max(n, 1),
        sum(r.meta.get("steps", 0) for r in records) / max(n, 1),
        invalid / max(calls, 1),
        sum(r.outcome.reason.startswith("error:") for r in records),
        delta,
    )


def format_table(rows: Sequence[Summary]) -> str:
    head = (
        f"{'system':<12} {'success':>7} {'95% CI':>15} {'vs proactive':>22} {'tokens':>8} {'steps':>6} {'invalid':>7}"
    )
    lines = [head, "-" * len(head)]
    for s in rows:
        d = f"{s.delta[0]:+.3f} [{s.delta[1]:+.3f},{s.delta[2]:+.3f}]" if s.delta else ""
        lines.append(
            f"{s.system:<12} {s.success:>7.3f} {f'[{s.ci[0]:.3f},{s.ci[1]:.3f}]':>15} {d:>22} "
            f"{s.tokens:>8.0f} {s.steps:>6.1f} {s.invalid_rate:>7.3f}"
        )
    return "\n".join(lines)


# ---- running ---------------------------------------------------------------------------------------


def workplace_engine(system: str, settings: Mapping[str, Any]) -> Engine:
    """The engine for ``system`` with the scripted expert and sub-agents configured by ``settings``
    (keys ``expert``, ``subagent``, ``budgets``, ``max_decisions``; plain dicts)."""
    expert = ScriptedExpert(ExpertConfig(**_tuples(settings.get("expert", {}))))
    subagent = ScriptedSubagent(SubagentConfig(**settings.get("subagent", {})))
    base = EngineConfig(
        budgets=Budgets(**settings.get("budgets", {})),
        max_decisions=settings.get("max_decisions", EngineConfig.max_decisions),
    )
    return Engine(
        WorkplaceEnv,
        ScriptedBackend(expert),
        ScriptedBackend(subagent),
        system_config(system, base),
        system_name=system,
    )


def _tuples(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}


def mixture(settings: Mapping[str, Any]) -> TaskMixture:
    m = dict(settings.get("mixture", {}))
    if "slack" in m:
        m["slack"] = tuple(m["slack"])
    return TaskMixture(**m)


def _run_system(system: str, settings: dict[str, Any], run_dir: str) -> None:
    tasks = make_tasks(settings["num_tasks"], mixture(settings), start=settings.get("seed_start", 0))
    engine = workplace_engine(system, settings)

    async def episode(task: Any) -> EpisodeRecord:
        return await engine.run(task, episode_id=task.task_id)

    with TrajectoryStore(Path(run_dir) / f"{system}.jsonl") as store:
        asyncio.run(
            run_episodes(
                tasks,
                episode,
                store,
                settings.get("concurrency", 16),
                progress=False,
                episode_timeout_s=settings.get("episode_timeout_s"),
            )
        )


def run_comparison(
    systems: Sequence[str], settings: dict[str, Any], run_dir: str | Path, processes: int = 2
) -> list[Summary]:
    """Run (or resume) every system into ``run_dir``, then summarize against ``proactive`` if present."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "settings.json").write_text(json.dumps({"systems": list(systems), **settings}, indent=1))
    if processes > 1:
        with ProcessPoolExecutor(processes) as pool:
            for f in [pool.submit(_run_system, s, settings, str(run_dir)) for s in systems]:
                f.result()
    else:
        for s in systems:
            _run_system(s, settings, str(run_dir))
    records = {s: TrajectoryStore(run_dir / f"{s}.jsonl").read() for s in systems}
    ref = records.get("proactive")
    return [summarize(s, records[s], ref if s != "proactive" else None) for s in systems]


def write_results(rows: Sequence[Summary], path: str | Path) -> None:
    Path(path).write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
