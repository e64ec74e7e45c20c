"""Rollout: the interleaved orchestrator / sub-agent engine, its baselines and ablations, and the
concurrent resumable episode runner."""

from porch_jax.rollout.config import (
    ABLATIONS,
    BASELINE_ACTIONS,
    BASELINES,
    BUDGETS,
    CORE_SYSTEMS,
    MESSAGE_ABLATIONS,
    REVISION_ABLATIONS,
    SOLO_TOOLS,
    SYSTEMS,
    Budgets,
    EngineConfig,
    system_config,
)
from porch_jax.rollout.engine import Engine
from porch_jax.rollout.runner import RunSummary, error_record, run_episodes, task_key

__all__ = [
    "ABLATIONS",
    "BASELINE_ACTIONS",
    "BASELINES",
    "BUDGETS",
    "CORE_SYSTEMS",
    "MESSAGE_ABLATIONS",
    "REVISION_ABLATIONS",
    "SOLO_TOOLS",
    "SYSTEMS",
    "Budgets",
    "EngineConfig",
    "system_config",
    "Engine",
    "RunSummary",
    "error_record",
    "run_episodes",
    "task_key",
]
