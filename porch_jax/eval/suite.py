"""The synthetic workplace suite as an experiment configures it: task sets and engines.

``suite`` config: ``mixture`` (TaskMixture fields), ``expert`` (ExpertConfig fields), ``subagent``
(SubagentConfig fields), ``max_decisions``, ``max_evidence_chars``. A task set: ``num_tasks``,
``seed_start``, ``prefix`` and optionally its own ``mixture`` (held-out mixtures for evaluation).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from porch_jax.backends import Backend, Sampling, ScriptedBackend
from porch_jax.envs.workplace import (
    ExpertConfig,
    ScriptedExpert,
    ScriptedSubagent,
    SubagentConfig,
    TaskMixture,
    WorkplaceEnv,
    WorkplaceTask,
    make_tasks,
)
from porch_jax.rollout import Budgets, Engine, EngineConfig, system_config


def _plain(d: Any) -> dict[str, Any]:
    d = d.to_dict() if hasattr(d, "to_dict") else dict(d)
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}


def mixture(cfg: Mapping[str, Any]) -> TaskMixture:
    return TaskMixture(**_plain(cfg))


def task_set(tasks_cfg: Mapping[str, Any], suite: Mapping[str, Any]) -> list[WorkplaceTask]:
    """Seeded tasks ``seed_start .. seed_start + num_tasks``; the set's own mixture overrides the suite's."""
    mix = mixture(tasks_cfg.get("mixture") or suite["mixture"])
    return make_tasks(
        int(tasks_cfg["num_tasks"]), mix, start=int(tasks_cfg["seed_start"]), prefix=str(tasks_cfg.get("prefix", "wp"))
    )


def engine(
    orchestrator: Backend, suite: Mapping[str, Any], *, name: str, sampling: Sampling = Sampling(max_tokens=256)
) -> Engine:
    """The proactive engine with scripted sub-agents and ``orchestrator`` deciding."""
    cfg = EngineConfig(
        budgets=Budgets(),
        max_decisions=int(suite["max_decisions"]),
        max_evidence_chars=int(suite["max_evidence_chars"]),
        orchestrator_sampling=sampling,
    )
    subagent = ScriptedBackend(ScriptedSubagent(SubagentConfig(**_plain(suite["subagent"]))))
    return Engine(WorkplaceEnv, orchestrator, subagent, system_config("proactive", cfg), system_name=name)


def expert_engine(suite: Mapping[str, Any]) -> Engine:
    """The scripted expert (with its blind spots) as the orchestrator."""
    return engine(ScriptedBackend(ScriptedExpert(ExpertConfig(**_plain(suite["expert"])))), suite, name="expert")
