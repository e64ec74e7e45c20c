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
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from porch_jax.backends import Backend, ScriptedBackend
from porch_jax.backends.spec import EndpointSpec
from porch_jax.envs.workplace import (
    ExpertConfig,
    ScriptedExpert,
    ScriptedSubagent,
    SubagentConfig,
    TaskMixture,
    WorkplaceEnv,
    make_tasks,
)
from porch_jax.rollout.config import ABLATIONS, CORE_SYSTEMS, SOLO_TOOLS, SYSTEMS, EngineConfig, system_config
from porch_jax.rollout.engine import Engine
from porch_jax.rollout.pairs import wilson
from porch_jax.rollout.runner import run_episodes
from porch_jax.trajectories import EpisodeRecord, TrajectoryStore
from porch_jax.typed_config import check, claim_run_dir, resumable, to_dict


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


@dataclass(frozen=True)
class ComparisonConfig:
    """Systems compared on the same seeded workplace tasks (paired). Each role is the scripted policy unless its
    endpoint names a served model: ``orchestrator`` (default: the scripted expert decides) and ``executor`` (default:
    the scripted sub-agents), each any OpenAI-compatible provider (backends/spec.py ``EndpointSpec``; the key is
    read from the variable it names).

    python -m launch.rollout --config=experiments/workplace_compare.py (500 tasks x 10 systems). More tasks
    narrow the intervals (Wilson half-width ~ 1 / sqrt(num_tasks)) at a time linear in num_tasks x systems.

    Attributes:
    systems: proactive, lifecycle, react (the default, CORE_SYSTEMS, so that earlier run directories resume), the
        multi-agent baselines (rollout/config.py BASELINES: orchestra_o1, skill_mas, mas2; not mini_swe, whose bash
        the workplace suite lacks) or ablations of proactive (ABLATIONS).
    run_dir: RUN_DIR/<system>.jsonl (resumable), settings.json, results.json.
    processes: systems run in parallel processes (episodes are CPU-bound); 1: in this process.
    concurrency: episodes in flight per system (the runner's workers).
    episode_timeout_s: an episode past it is recorded as an error (every episode is bounded).
    engine: how an episode runs (rollout/config.py ``EngineConfig``; its ``system`` is each system's): the budgets
        (every task carries tighter ones of its own; the engine takes the smaller), the decision cap, the sampling
        of each role (max tokens, temperature, thinking), the evidence kept, the context rule, few-shot.
    orchestrator, executor: the roles' endpoints (an empty model: the scripted policy).
    mixture, expert, subagent: the suite's calibration (porch_jax/envs/workplace says what each knob does).
    """

    run_dir: str
    systems: tuple[str, ...] = CORE_SYSTEMS
    num_tasks: int = 500
    seed_start: int = 0
    processes: int = 2
    concurrency: int = resumable(16)
    episode_timeout_s: float = resumable(60.0)
    engine: EngineConfig = EngineConfig()
    orchestrator: EndpointSpec = EndpointSpec()
    executor: EndpointSpec = EndpointSpec()
    mixture: TaskMixture = TaskMixture()
    expert: ExpertConfig = ExpertConfig()
    subagent: SubagentConfig = SubagentConfig()

    def __post_init__(self):
        unknown = [s for s in self.systems if s not in SYSTEMS + ABLATIONS]
        check(not unknown, "systems", f"unknown {unknown}; choose from {', '.join(SYSTEMS + ABLATIONS)}")
        check(bool(self.systems), "systems", "must name at least one system")
        lacking = [s for s in self.systems if set(SOLO_TOOLS.get(s) or ()) - set(WorkplaceEnv().tool_names())]
        check(not lacking, "systems", f"{lacking} need tools the workplace suite lacks (mini_swe: bash, SWE-bench)")
        check(self.num_tasks > 0, "num_tasks", f"must be > 0, got {self.num_tasks}")
        check(self.seed_start >= 0, "seed_start", f"must be >= 0, got {self.seed_start}")
        check(self.processes > 0, "processes", f"must be > 0, got {self.processes}")
        check(self.concurrency > 0, "concurrency", f"must be > 0, got {self.concurrency}")
        timeout = self.episode_timeout_s
        check(timeout > 0, "episode_timeout_s", f"must be > 0, got {timeout}")


def role_backend(endpoint: EndpointSpec, scripted: Any) -> Backend:
    """The served model of ``endpoint`` where it names one, else ``scripted`` (a policy) as a backend."""
    return endpoint.backend() if endpoint.configured else ScriptedBackend(scripted)


def workplace_engine(system: str, cfg: ComparisonConfig | None = None) -> Engine:
    """The engine for ``system`` with ``cfg``'s roles (the scripted expert and sub-agents unless an endpoint names a
    model) and engine settings (None: the defaults)."""
    cfg = cfg or ComparisonConfig(run_dir="-")
    return Engine(
        WorkplaceEnv,
        role_backend(cfg.orchestrator, ScriptedExpert(cfg.expert)),
        role_backend(cfg.executor, ScriptedSubagent(cfg.subagent)),
        system_config(system, cfg.engine),
        system_name=system,
    )


def _run_system(system: str, cfg: ComparisonConfig) -> None:
    tasks = make_tasks(cfg.num_tasks, cfg.mixture, start=cfg.seed_start)
    engine = workplace_engine(system, cfg)

    async def episode(task: Any) -> EpisodeRecord:
        return await engine.run(task, episode_id=task.task_id)

    async def go() -> None:
        try:
            with TrajectoryStore(Path(cfg.run_dir) / f"{system}.jsonl") as store:
                await run_episodes(
                    tasks, episode, store, cfg.concurrency, progress=False, episode_timeout_s=cfg.episode_timeout_s
                )
        finally:
            for backend in {id(b): b for b in (engine.orchestrator, engine.subagent)}.values():
                if hasattr(backend, "aclose"):
                    await backend.aclose()

    asyncio.run(go())


def settings(cfg: ComparisonConfig) -> dict[str, Any]:
    """What RUN_DIR/settings.json records: the systems and every knob the episodes depend on (not where they are
    written nor how many processes write them)."""
    out = to_dict(cfg)
    for key in ("run_dir", "processes"):
        out.pop(key)
    return out


def run_comparison(cfg: ComparisonConfig) -> list[Summary]:
    """Run (or resume) every system into ``cfg.run_dir``, then summarize against ``proactive`` if present. A
    RUN_DIR whose settings.json records other settings (but for ComparisonConfig's `resumable` fields) is refused, naming them."""
    run_dir = Path(cfg.run_dir)
    claim_run_dir(run_dir, settings(cfg), file="settings.json", schema=ComparisonConfig)
    if cfg.processes > 1:
        with ProcessPoolExecutor(cfg.processes) as pool:
            for f in [pool.submit(_run_system, s, cfg) for s in cfg.systems]:
                f.result()
    else:
        for s in cfg.systems:
            _run_system(s, cfg)
    records = {s: TrajectoryStore(run_dir / f"{s}.jsonl").read() for s in cfg.systems}
    ref = records.get("proactive")
    return [summarize(s, records[s], ref if s != "proactive" else None) for s in cfg.systems]


def write_results(rows: Sequence[Summary], path: str | Path) -> None:
    Path(path).write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
