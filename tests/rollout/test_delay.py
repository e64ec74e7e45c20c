"""Intervention delay (appendix proposition): lifecycle ~ H/2, proactive flat in H."""

from __future__ import annotations

import asyncio

import pytest

from porch_jax.envs.workplace import make_probe
from porch_jax.rollout.delay import intervention_delays, measure_delay, probe_engine

EPISODES = 60  # arrivals are stratified over [0, H), so the mean is stable at this size
HORIZONS = (10, 30, 90)


@pytest.mark.parametrize("horizon", HORIZONS)
def test_lifecycle_delay_is_half_the_horizon(horizon):
    stats = asyncio.run(measure_delay("lifecycle", horizon, EPISODES))
    assert stats.n == EPISODES
    assert abs(stats.mean - horizon / 2) <= 0.1 * horizon / 2, stats


def test_proactive_delay_does_not_grow_with_the_horizon():
    means = [asyncio.run(measure_delay("proactive", h, EPISODES)).mean for h in HORIZONS]
    assert max(means) < 2.0 and max(means) - min(means) < 0.3, means  # next step + the request itself


def test_delay_is_read_from_the_record():
    rec = asyncio.run(probe_engine("proactive").run(make_probe(0, 10, arrival=3.25)))
    assert intervention_delays(rec) == [pytest.approx(5 - 3.25)]  # seen before step 4, request at step 4
    assert rec.decisions[1].action["name"] == "revise"
