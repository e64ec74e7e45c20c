"""The served-baseline table from records (porch_jax/rollout/served.py); the served run itself is exercised by
tests/serving/test_smollm2_episodes.py on the real model."""

from __future__ import annotations

import asyncio

from porch_jax.backends import ScriptedBackend
from porch_jax.envs.workplace import (
    ExpertConfig,
    ScriptedExpert,
    ScriptedSubagent,
    SubagentConfig,
    WorkplaceEnv,
    make_tasks,
)
from porch_jax.rollout import Engine
from porch_jax.rollout.served import ServedBaselineConfig, engine_config, format_table, summarize
from porch_jax.typed_config import from_dict


def _records(orchestrator, n=4):
    sub = ScriptedSubagent(SubagentConfig(slip_base=0.0, p_misread=0.0, p_detour=0.0))
    cfg = from_dict(ServedBaselineConfig, {"run_dir": "/tmp/x", "engine": {"max_decisions": 3}})
    engine = Engine(WorkplaceEnv, ScriptedBackend(orchestrator), ScriptedBackend(sub), engine_config(cfg, False))
    return [asyncio.run(engine.run(t)) for t in make_tasks(n)]


def test_the_table_counts_success_validity_subagents_and_parse_errors():
    expert = _records(ScriptedExpert(ExpertConfig(0.0, 0.0, 0.0, 0.0, blind_spots=())))
    good = summarize("expert", expert, 1.0)
    assert good.n == 4 and good.valid_action_rate == 1.0 and good.subagent_ran == 4 and good.parse_errors == {}
    assert good.success == sum(r.outcome.success for r in expert) / 4 and good.tokens > 0

    rambling = summarize("rambles", _records(lambda request: "I'm sorry for your loss."), 2.0)
    assert rambling.valid_action_rate == 0.0 and rambling.subagent_ran == 0 and rambling.success == 0.0
    assert rambling.parse_errors == {"NoToolCall": 4 * 3}  # every one of the 3 decisions per episode
    table = format_table([good, rambling])
    assert "| rambles | 4 | 0.000" in table and "NoToolCall 12" in table
