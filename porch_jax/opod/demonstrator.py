"""The scripted expert as the experiment's demonstrator, and whether it can succeed from what its records keep.

Under the policy's context window the engine drops old turns from what the orchestrator is shown, while the
expert's view still holds the whole history; its recorded decision keeps only the window. The expert therefore
writes only what its window shows (envs/workplace/expert.py, ``sees="context"``). Whether the task survives that is
a property of the window: `expert_success` plays the expert on a task set with and without it, which the start
check (preflight.py) compares with `preflight.min_expert_success` before any stage runs.
"""

from __future__ import annotations

import asyncio
from typing import Any

from porch_jax.backends import Backend, ScriptedBackend
from porch_jax.backends.window import ContextWindow
from porch_jax.envs.workplace import ScriptedExpert
from porch_jax.eval import suite as suite_lib
from porch_jax.eval.suite import TaskSet
from porch_jax.opod.config import ExperimentConfig


def expert_engine(cfg: ExperimentConfig, tokenizer: Any, *, window: bool = True, system: str = "proactive") -> Any:
    """The scripted expert's engine, playing `system`'s action set (POrchestra's, or a framework's the experiment
    trains). Under the policy's context window (`window` and policy.context_tokens) it decides under that window and
    writes only what the window shows, so every recorded decision is one a policy could make from its record;
    `tokenizer` measures the window (None without one)."""
    windowed = window and bool(cfg.policy.context_tokens)
    expert: Backend = ScriptedBackend(ScriptedExpert(cfg.suite.expert, sees="context" if windowed else "history"))
    if windowed:
        expert = ContextWindow(expert, tokenizer, cfg.policy.context_tokens)
    return suite_lib.engine(expert, cfg.suite, name="expert", system=system)


def expert_success(cfg: ExperimentConfig, tokenizer: Any, tasks: TaskSet, *, window: bool) -> float:
    """The expert's success rate on `tasks`, under the window (information-limited) or without it."""
    engine = expert_engine(cfg, tokenizer, window=window)
    todo = suite_lib.task_set(tasks, cfg.suite)

    async def play() -> list[Any]:
        return await asyncio.gather(*(engine.run(t, episode_id=t.task_id) for t in todo))

    records = asyncio.run(play())
    return sum(r.outcome.success for r in records) / len(records)
