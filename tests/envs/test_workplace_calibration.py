"""The suite's calibration: on the same seeded tasks the full protocol beats lifecycle
re-orchestration and ReAct, and every ablation costs success (the table launch/rollout.py prints,
in miniature). Plus the interval arithmetic the table uses."""

from __future__ import annotations

import asyncio

import pytest

from porch_jax.envs.workplace import make_tasks
from porch_jax.rollout import ABLATIONS
from porch_jax.rollout.compare import summarize, workplace_engine
from porch_jax.rollout.pairs import wilson


def test_wilson_matches_known_values():
    lo, hi = wilson(80, 100)
    assert lo == pytest.approx(0.7111, abs=1e-4) and hi == pytest.approx(0.8666, abs=1e-4)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0 and wilson(0, 0) == (0.0, 1.0)


@pytest.mark.slow
def test_protocol_beats_baselines_and_every_ablation_costs_success():
    tasks = make_tasks(200)

    async def run(system):
        engine = workplace_engine(system)
        return [await engine.run(t, episode_id=t.task_id) for t in tasks]

    records = {s: asyncio.run(run(s)) for s in ("proactive", "lifecycle", "react", *ABLATIONS)}
    full = summarize("proactive", records["proactive"])
    for system, recs in records.items():
        if system == "proactive":
            continue
        s = summarize(system, recs, records["proactive"])
        assert s.delta[0] < 0, (system, s.success, full.success)
        if system in ("lifecycle", "react"):  # clearly below: the paired 95% interval excludes 0
            assert s.delta[2] < 0, (system, s.delta)
    assert full.invalid_rate < 0.02 and full.errors == 0
