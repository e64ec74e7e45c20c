"""A served pretrained model playing the protocol freely: the baseline that training must raise.

One vLLM server on a model folder (SmolLM2-135M-Instruct by default, from the package index) serves both roles;
no structured-output forcing, so every reply is the model's own and is parsed by porch_jax.protocol. Readings:
zero-shot and few-shot (a worked exchange in each role's system message, ``EngineConfig.few_shot``) on the
workplace suite, and ARE's tutorial scenarios through ARE's runner (policy "llm"). Each reading writes
RUN_DIR/<reading>.jsonl through the resumable runner (a rerun finishes what is missing); the table is computed
from the stores alone.

Per reading: success with a Wilson 95% interval, the valid-action rate (orchestrator replies that parsed into
an action), episodes in which a sub-agent ran at least one step, tokens per episode (both roles, prompt +
completion), the orchestrator's parse errors by kind and the wall time of the reading.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from porch_jax.backends import Sampling
from porch_jax.backends.openai_chat import VLLMBackend
from porch_jax.backends.spec import EndpointSpec
from porch_jax.envs.are.client import are_python, run_gaia2
from porch_jax.envs.workplace import TaskMixture, WorkplaceEnv, make_tasks
from porch_jax.rollout.config import Budgets, EngineConfig, system_config
from porch_jax.rollout.engine import Engine
from porch_jax.rollout.pairs import wilson
from porch_jax.rollout.runner import run_episodes
from porch_jax.serving import ServerConfig, VLLMServer
from porch_jax.trajectories import EpisodeRecord, TrajectoryStore
from porch_jax.typed_config import check, claim_run_dir, resumable

READINGS = ("zero_shot", "few_shot")
KEY_ENV = "PORCH_BASELINE_KEY"  # the key of the server this run starts, passed to ARE's child through the env


@dataclasses.dataclass(frozen=True)
class ServedBaselineConfig:
    """Attributes:
    run_dir: where the stores, results.json and table.md go (a rerun resumes).
    model_dir: the Hugging Face folder to serve; empty: SmolLM2-135M-Instruct (porch_jax.models.smollm2).
    serve: how vLLM serves it (porch_jax.serving.ServerConfig).
    readings: workplace readings to run, of READINGS.
    num_tasks / seed_start: the workplace tasks (seeded, the same for every reading).
    concurrency: episodes in flight (vLLM batches them).
    engine: how an episode runs (rollout/config.py EngineConfig; its system is proactive, its few_shot each
        reading's): each role's sampling (a small model rambles: max_tokens bounds each call), the evidence kept, the
        decision cap, the step budgets (tasks carry their own) and what an over-long orchestrator context does.
    are_scenarios: ARE's registered scenarios (its tutorials) to run both roles on (skipped without the ARE venv).
    are_dataset / are_checks: a directory of GAIA2-format scenarios (ours) and their scripted checks, run in the
        same ARE reading and judged by ARE's GAIA2 judge offline (empty: none).
    are_max_decisions / are_total_steps: their caps over the engine's (a scenario at GAIA2's full budget runs for
        minutes).
    """

    run_dir: str = resumable()
    model_dir: str = ""
    serve: ServerConfig = ServerConfig(device="cpu", dtype="float32", served_model_name="policy")
    readings: tuple[Literal["zero_shot", "few_shot"], ...] = READINGS
    num_tasks: int = 50
    seed_start: int = 0
    concurrency: int = resumable(16)
    engine: EngineConfig = EngineConfig(
        budgets=Budgets(12, 3, 4),
        max_decisions=6,
        orchestrator_sampling=Sampling(max_tokens=96),
        subagent_sampling=Sampling(max_tokens=96),
        context_overflow="drop_oldest",
    )
    are_scenarios: tuple[str, ...] = ("scenario_tutorial", "scenario_apps_tutorial")
    are_dataset: str = ""
    are_checks: str = ""
    are_max_decisions: int = 4
    are_total_steps: int = 8

    def __post_init__(self):
        check(self.num_tasks > 0, "num_tasks", f"must be > 0, got {self.num_tasks}")
        check(self.concurrency > 0, "concurrency", f"must be > 0, got {self.concurrency}")
        check(not self.are_checks or bool(self.are_dataset), "are_checks", "needs are_dataset (the scenarios checked)")


@dataclasses.dataclass(frozen=True)
class Reading:
    name: str
    n: int
    success: float
    ci: tuple[float, float]
    valid_action_rate: float  # orchestrator replies that parsed into an action
    subagent_ran: int  # episodes in which a sub-agent ran at least one step
    tokens: float  # per episode, both roles, prompt + completion
    parse_errors: dict[str, int]  # orchestrator replies that did not parse, by kind
    wall_s: float


def summarize(name: str, records: Sequence[EpisodeRecord], wall_s: float) -> Reading:
    n = len(records)
    k = sum(r.outcome.success for r in records)
    decisions = sum(len(r.decisions) for r in records)
    valid = sum(d.action is not None for r in records for d in r.decisions)
    errors: Counter[str] = Counter()
    for r in records:
        errors.update(r.meta.get("invalid_kinds", {}).get("orchestrator", {}))
    ran = sum(any(d.segment for d in r.decisions) or r.meta.get("steps", 0) > 0 for r in records)
    tokens = sum(c.prompt_tokens + c.completion_tokens for r in records for c in r.cost.values()) / max(n, 1)
    return Reading(name, n, k / max(n, 1), wilson(k, n), valid / max(decisions, 1), ran, tokens, dict(errors), wall_s)


def format_table(rows: Sequence[Reading]) -> str:
    lines = [
        "| reading | episodes | success (95% CI) | valid actions | sub-agent ran | tokens / episode | parse errors | wall |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        errs = ", ".join(f"{k} {v}" for k, v in sorted(r.parse_errors.items())) or "none"
        lines.append(
            f"| {r.name} | {r.n} | {r.success:.3f} ({r.ci[0]:.2f}-{r.ci[1]:.2f}) | {r.valid_action_rate:.3f} | "
            f"{r.subagent_ran}/{r.n} | {r.tokens:.0f} | {errs} | {r.wall_s:.0f} s |"
        )
    return "\n".join(lines)


def engine_config(cfg: ServedBaselineConfig, few_shot: bool) -> EngineConfig:
    return system_config("proactive", dataclasses.replace(cfg.engine, few_shot=few_shot))


def run_workplace(server: VLLMServer, cfg: ServedBaselineConfig, reading: str, store_path: Path) -> float:
    """One workplace reading into ``store_path`` (resumed); returns this call's wall time."""

    def backend() -> VLLMBackend:
        return VLLMBackend(
            server.base_url,
            server.model,
            api_key=server.api_key,
            timeout_s=600.0,
            tools_in_prompt=not server.renders_tools,
        )

    orchestrator, subagent = backend(), backend()
    engine = Engine(
        WorkplaceEnv, orchestrator, subagent, engine_config(cfg, reading == "few_shot"), system_name=reading
    )
    tasks = make_tasks(cfg.num_tasks, TaskMixture(), start=cfg.seed_start)

    async def go():
        async with orchestrator, subagent:
            with TrajectoryStore(store_path) as store:
                return await run_episodes(
                    tasks, lambda t: engine.run(t, episode_id=t.task_id), store, concurrency=cfg.concurrency
                )

    return asyncio.run(go()).wall_s


def run_are(server: VLLMServer, cfg: ServedBaselineConfig, store_path: Path, out: Path) -> float:
    """ARE's tutorial scenarios with both roles on the server, through ARE's runner (its own venv)."""

    os.environ[KEY_ENV] = server.api_key
    endpoint = EndpointSpec(
        server.model, (server.base_url,), "vllm", KEY_ENV, timeout_s=600.0, tools_in_prompt=not server.renders_tools
    )
    start = time.perf_counter()
    engine = dataclasses.asdict(engine_config(cfg, few_shot=False))
    engine["max_decisions"] = cfg.are_max_decisions
    engine["budgets"] = {"total_steps": cfg.are_total_steps}  # GAIA2's agents and per-agent budget
    run_gaia2(
        out,
        dataset=Path(cfg.are_dataset).resolve() if cfg.are_dataset else None,
        checks=Path(cfg.are_checks).resolve() if cfg.are_checks else None,
        scenarios=cfg.are_scenarios,
        policy="llm",
        store=store_path,
        orchestrator=endpoint,
        executor=endpoint,
        engine=engine,
    )
    return time.perf_counter() - start


def run(cfg: ServedBaselineConfig, *, api_key: str) -> list[Reading]:
    """Serve the model, run every reading (resuming), write RUN_DIR/results.json and table.md; returns the rows.
    RUN_DIR/config.json records the config; a rerun with another one (but for its `resumable` fields) is refused,
    naming the keys, before the server starts."""
    run_dir = Path(cfg.run_dir)
    claim_run_dir(run_dir, cfg)
    from porch_jax.models.smollm2 import smollm2_folder  # porch_jax.models loads JAX: not while flags parse

    model_dir = cfg.model_dir or str(smollm2_folder())
    walls_file = run_dir / "wall_s.json"
    walls: dict[str, float] = json.loads(walls_file.read_text()) if walls_file.is_file() else {}
    with VLLMServer(model_dir, run_dir / "server", api_key=api_key, config=cfg.serve) as server:
        print(f"serving {model_dir} (ready in {server.startup_s:.0f} s)", flush=True)
        for reading in cfg.readings:
            walls[reading] = walls.get(reading, 0.0) + run_workplace(server, cfg, reading, run_dir / f"{reading}.jsonl")
            walls_file.write_text(json.dumps(walls))
        if (cfg.are_scenarios or cfg.are_dataset) and are_python() is not None:
            store = run_dir / "are.jsonl"
            if not store.is_file():
                walls["are"] = run_are(server, cfg, store, run_dir / "are")
                walls_file.write_text(json.dumps(walls))
    names = list(cfg.readings) + (["are"] if (run_dir / "are.jsonl").is_file() else [])
    rows = [summarize(n, TrajectoryStore(run_dir / f"{n}.jsonl").read(), walls.get(n, 0.0)) for n in names]
    (run_dir / "results.json").write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
    table = format_table(rows)
    (run_dir / "table.md").write_text(table + "\n")
    return rows
