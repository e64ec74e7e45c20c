"""The synthetic workplace suite as an experiment configures it: typed task sets and engines.

``SuiteConfig``: ``mixture`` (TaskMixture), ``expert`` (ExpertConfig), ``subagent`` (SubagentConfig),
``max_decisions``, ``max_evidence_chars``. ``TaskSet``: ``num_tasks``, ``seed_start``, ``prefix`` and optionally its
own ``mixture`` (held-out mixtures for evaluation). ``EvalConfig``: the held-out tasks and how the policy samples on
them. A launcher builds them from a config file with ``typed_config.from_dict``, which names a mistyped key.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

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
from porch_jax.typed_config import check, resumable


@dataclasses.dataclass(frozen=True)
class SuiteConfig:
    """The task mixture, the scripted expert and sub-agents, and the engine's limits. context_overflow: what an
    orchestrator context over its backend's window does (rollout/config.py EngineConfig: "observe" records the
    failed call, "drop_oldest" drops the oldest decision and its feedback and asks again)."""

    max_decisions: int
    max_evidence_chars: int
    context_overflow: Literal["observe", "drop_oldest"] = "observe"
    mixture: TaskMixture = dataclasses.field(default_factory=TaskMixture)
    expert: ExpertConfig = dataclasses.field(default_factory=ExpertConfig)
    subagent: SubagentConfig = dataclasses.field(default_factory=SubagentConfig)


@dataclasses.dataclass(frozen=True)
class TaskSet:
    """Seeded tasks ``seed_start .. seed_start + num_tasks`` named ``prefix``-..., under ``mixture`` (None: the
    suite's)."""

    num_tasks: int
    seed_start: int
    prefix: str = "wp"
    mixture: TaskMixture | None = None

    def __post_init__(self):
        check(self.num_tasks > 0, "num_tasks", f"must be > 0, got {self.num_tasks}")

    @property
    def seeds(self) -> range:
        return range(self.seed_start, self.seed_start + self.num_tasks)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation: its tasks and the policy's sampling on them (temperature 0: greedy)."""

    tasks: TaskSet
    temperature: float
    max_tokens: int
    concurrency: int = resumable()
    seed: int = 0


def task_set(tasks: TaskSet, suite: SuiteConfig) -> list[WorkplaceTask]:
    """The seeded tasks of ``tasks``; the set's own mixture overrides the suite's."""
    return make_tasks(tasks.num_tasks, tasks.mixture or suite.mixture, start=tasks.seed_start, prefix=tasks.prefix)


def engine(
    orchestrator: Backend,
    suite: SuiteConfig,
    *,
    name: str,
    sampling: Sampling = Sampling(max_tokens=256),
    system: str = "proactive",
) -> Engine:
    """The engine of ``system`` (proactive, POrchestra, by default; a framework an experiment trains, e.g.
    ``lifecycle`` or ``orchestra_o1``: rollout/config.py) with scripted sub-agents and ``orchestrator`` deciding."""
    cfg = EngineConfig(
        budgets=Budgets(),
        max_decisions=suite.max_decisions,
        max_evidence_chars=suite.max_evidence_chars,
        orchestrator_sampling=sampling,
        context_overflow=suite.context_overflow,
    )
    subagent = ScriptedBackend(ScriptedSubagent(suite.subagent))
    return Engine(WorkplaceEnv, orchestrator, subagent, system_config(system, cfg), system_name=name)


def expert_engine(suite: SuiteConfig, *, system: str = "proactive") -> Engine:
    """The scripted expert (with its blind spots) as the orchestrator, playing ``system``'s action set."""
    return engine(ScriptedBackend(ScriptedExpert(suite.expert)), suite, name="expert", system=system)
