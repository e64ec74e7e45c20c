"""The synthetic workplace suite: GAIA2-like tasks over seeded apps, scripted sub-agents and expert."""

from porch_jax.envs.workplace.apps import TOOL_DOCS, TOOLS
from porch_jax.envs.workplace.clauses import Clause, parse_clause, parse_facts, parse_subgoal, work
from porch_jax.envs.workplace.env import WorkplaceEnv
from porch_jax.envs.workplace.expert import BLIND_SPOTS, ExpertConfig, ScriptedExpert
from porch_jax.envs.workplace.subagent import ScriptedSubagent, SubagentConfig
from porch_jax.envs.workplace.tasks import (
    Notice,
    TaskMixture,
    WorkplaceTask,
    make_probe,
    make_task,
    make_tasks,
    nominal_steps,
)

__all__ = [
    "TOOL_DOCS",
    "TOOLS",
    "Clause",
    "parse_clause",
    "parse_facts",
    "parse_subgoal",
    "work",
    "WorkplaceEnv",
    "BLIND_SPOTS",
    "ExpertConfig",
    "ScriptedExpert",
    "ScriptedSubagent",
    "SubagentConfig",
    "Notice",
    "TaskMixture",
    "WorkplaceTask",
    "make_probe",
    "make_task",
    "make_tasks",
    "nominal_steps",
]
