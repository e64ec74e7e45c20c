"""SWE-bench Verified through the engine: (instance, run) pairs, concurrent, resumable, graded by swebench.

Each pair is one episode on a fresh checkout of the instance's repository at its base commit, made from a local
mirror (``repos``: a folder holding ``<owner>__<name>`` git repositories, e.g. ``django__django``; nothing is
cloned from the network). The orchestrator and its sub-agents use ``envs.swe``'s tools; the checkout's diff is
graded by swebench (``SWEConfig.grader``: its official images where a docker engine answers, else locally on a
fresh checkout, with the running interpreter first on PATH). The checkout is removed once graded; the patch stays in
the record (``meta["swe"]["patch"]``).

Policies: ``llm`` (served models) or ``gold``: an orchestrator that hands a sub-agent the instance's gold patch to
apply with ``git apply``, the check that checkouts, tools, grading and reporting agree (it resolves every gradable
instance).

Outputs in ``out_dir``: ``episodes.jsonl`` (the trajectory store), ``results.json`` / ``results.md`` (resolved rate
by repository with Wilson intervals, pass^N, pass@N, tokens per pair), ``success.png``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from porch_jax.backends import ChatRequest, ScriptedBackend
from porch_jax.backends.spec import EndpointSpec
from porch_jax.envs.swe import SWEConfig, SWEEnvironment, SWEInstance, SWETask, checkout, extract_patch
from porch_jax.eval.plots import plot_group_success
from porch_jax.protocol import Delegate, Finish, Harness, Submit, ToolCall, render_action
from porch_jax.rollout import Budgets, Engine, EngineConfig, run_episodes, system_config
from porch_jax.rollout.pairs import Pair, make_pairs, record_outcome, results_by, write_results
from porch_jax.trajectories import EpisodeRecord, TrajectoryStore
from porch_jax.typed_config import from_dict

POLICIES = ("llm", "gold")
GOLD_DELIMITER = "PORCH_GOLD_PATCH"


@dataclasses.dataclass(frozen=True)
class SWERunConfig:
    out_dir: str
    repos: str  # a folder of git mirrors named <owner>__<name>
    runs: int = 1
    concurrency: int = 2
    policy: str = "llm"
    system: str = "proactive"
    orchestrator: EndpointSpec = EndpointSpec()
    executor: EndpointSpec = EndpointSpec()  # empty: the orchestrator's endpoint
    episode_timeout_s: float = 3600.0
    swe: SWEConfig = SWEConfig()  # tools, the paper's budgets (500 steps in total, 50 per sub-agent), grader
    engine: dict[str, Any] = dataclasses.field(default_factory=dict)  # EngineConfig fields over the SWE budgets

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy: one of {POLICIES}, got {self.policy!r}")
        if self.runs < 1 or self.concurrency < 1:
            raise ValueError(f"runs and concurrency must be >= 1, got runs={self.runs}, concurrency={self.concurrency}")
        if self.policy == "llm" and not self.orchestrator.configured:
            raise ValueError("policy 'llm' needs an orchestrator endpoint (its model, and urls for a served one)")

    def engine_config(self) -> EngineConfig:
        budgets = Budgets(self.swe.total_steps, 10, self.swe.agent_steps)
        return system_config(
            self.system, from_dict(EngineConfig, self.engine, path="engine", base=EngineConfig(budgets=budgets))
        )


def mirror(repos: str | Path, instance: SWEInstance) -> Path:
    """The local mirror of the instance's repository; a clear error when it is not there."""
    path = Path(repos, instance.repo.replace("/", "__"))
    if not (path / ".git").exists() and not (path / "HEAD").exists():
        raise FileNotFoundError(
            f"{instance.instance_id}: no git mirror of {instance.repo} at {path} (clone it there, e.g. "
            f"`git clone https://github.com/{instance.repo} {path}`, where a network is reachable)"
        )
    return path


def _gold_orchestrator(request: ChatRequest) -> str:
    view = request.state
    if not view.turns:
        patch = view.task.instance.patch
        return render_action(Delegate(Harness("apply the reference patch with git apply", (patch,), ("bash",), 4)))
    return render_action(Finish(view.turns[-1].feedback.result or "applied"))


def _gold_subagent(request: ChatRequest) -> str:
    view = request.state
    if any(m.kind == "call" for m in view.memory):
        return render_action(Submit("applied the reference patch"))
    patch = view.harness.context[0]
    command = f"git apply <<'{GOLD_DELIMITER}'\n{patch}{'' if patch.endswith(chr(10)) else chr(10)}{GOLD_DELIMITER}\n"
    return render_action(ToolCall("bash", {"command": command}))


def _backends(cfg: SWERunConfig, seed: int) -> tuple[Any, Any]:
    if cfg.policy == "gold":
        return ScriptedBackend(_gold_orchestrator), ScriptedBackend(_gold_subagent)
    orchestrator = cfg.orchestrator.backend(seed=seed)
    executor = (cfg.executor if cfg.executor.configured else cfg.orchestrator).backend(seed=seed)
    return orchestrator, executor


def grading_env() -> dict[str, str]:
    """Local grading's environment: the running interpreter's folder first on PATH (its pytest runs the tests)."""
    return {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


async def run_swe(cfg: SWERunConfig, instances: Sequence[SWEInstance], *, progress: bool = True) -> dict[str, Any]:
    """Every (instance, run) pair not finished in ``out_dir/episodes.jsonl``; then the tables from the whole store
    (by repository); returns the results JSON's content."""
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sources = {i.instance_id: mirror(cfg.repos, i) for i in instances}  # every mirror is there before any work
    store = TrajectoryStore(out / "episodes.jsonl")
    orchestrator, executor = _backends(cfg, seed=0)
    engine = Engine(lambda: SWEEnvironment(cfg.swe), orchestrator, executor, cfg.engine_config())

    async def episode(pair: Pair) -> EpisodeRecord:
        instance = pair.task
        work = out / "work" / pair.episode_id.replace("/", "_")
        shutil.rmtree(work, ignore_errors=True)  # an attempt interrupted before starts again from the base commit
        source = sources[instance.instance_id]
        await asyncio.to_thread(checkout, source, instance.base_commit, work)
        task = SWETask(instance, str(work), source=str(source), grading={"env": grading_env()})
        try:
            record = await engine.run(task, seed=pair.run - 1, episode_id=pair.episode_id)
            patch = await asyncio.to_thread(extract_patch, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        record.meta["swe"] = {"instance_id": instance.instance_id, "repo": instance.repo, "run": pair.run}
        record.meta["swe"]["patch"] = patch
        return record

    pairs = make_pairs(instances, cfg.runs, lambda i: i.instance_id)
    summary = await run_episodes(
        pairs,
        episode,
        store,
        cfg.concurrency,
        progress,
        key=lambda p: p.episode_id,
        episode_timeout_s=cfg.episode_timeout_s,
    )
    store.close()
    return report(cfg, store, wall_s=summary.wall_s)


def report(cfg: SWERunConfig, store: TrajectoryStore, *, wall_s: float = 0.0) -> dict[str, Any]:
    """The tables and plot of a run directory, from its store alone."""
    records = store.read()
    outcomes = [record_outcome(r, [r.meta.get("swe", {}).get("repo", "?")]) for r in records]
    rows = results_by(outcomes, open_retryable=len(store.retryable_ids()))
    meta = {"policy": cfg.policy, "system": cfg.system, "runs": cfg.runs, "wall_s": round(wall_s, 1)}
    path = write_results(cfg.out_dir, rows, meta, title="SWE-bench Verified (resolved)")
    plot_group_success(rows, Path(cfg.out_dir, "success.png"), "SWE-bench Verified resolved rate (95% CI)")
    return json.loads(path.read_text())


def run(cfg: SWERunConfig, instances: Sequence[SWEInstance], **kwargs: Any) -> dict[str, Any]:
    return asyncio.run(run_swe(cfg, instances, **kwargs))
