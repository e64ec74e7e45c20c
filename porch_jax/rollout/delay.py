"""Intervention delay: steps from a mismatch's emergence to the orchestrator's first chance to act.

The appendix proposition: with lifecycle re-orchestration the orchestrator can act only when the
sub-agent's H-step lifecycle ends, so a mismatch arriving uniformly over [0, H) waits H/2 steps on
average; with proactive communication the sub-agent pauses at its next step, so the delay does not
grow with H. Measured on the workplace probe (one sub-agent whose work lasts exactly H steps, a goal
change arriving at a stratified-uniform time), from the recorded arrival times and decision clocks.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
from dataclasses import dataclass

from porch_jax.backends import ScriptedBackend
from porch_jax.envs.workplace import (
    ExpertConfig,
    ScriptedExpert,
    ScriptedSubagent,
    SubagentConfig,
    WorkplaceEnv,
    make_probe,
)
from porch_jax.rollout.config import system_config
from porch_jax.rollout.engine import Engine
from porch_jax.trajectories import EpisodeRecord


@dataclass(frozen=True)
class DelayStats:
    horizon: int
    mean: float
    sem: float
    n: int


def intervention_delays(record: EpisodeRecord) -> list[float]:
    """For each relevant notification: first decision clock at or after its arrival, minus the arrival."""
    clocks = record.meta["decision_clock"]
    out = []
    for d in record.meta["deliveries"]:
        after = [c for c in clocks if c >= d["arrival"]]
        if d["relevant"] and after:
            out.append(min(after) - d["arrival"])
    return out


def probe_engine(system: str) -> Engine:
    """A flawless expert that budgets exactly the work (so lifecycles last H) and slip-free sub-agents:
    only the protocol's timing differs between systems."""
    expert = ExpertConfig(0.0, 0.0, 0.0, 0.0, blind_spots=(), budget_margin=0)
    return Engine(
        WorkplaceEnv,
        ScriptedBackend(ScriptedExpert(expert)),
        ScriptedBackend(ScriptedSubagent(SubagentConfig(slip_base=0.0))),
        system_config(system),
        system_name=system,
    )


async def measure_delay(system: str, horizon: int, episodes: int, seed: int = 0) -> DelayStats:
    """Mean delay over ``episodes`` probes; arrivals are stratified over [0, horizon) (uniform, low variance)."""
    engine, rng = probe_engine(system), random.Random(f"delay:{seed}:{horizon}")
    delays: list[float] = []
    for i in range(episodes):
        arrival = horizon * (i + rng.random()) / episodes
        delays += intervention_delays(await engine.run(make_probe(seed + i, horizon, arrival=arrival)))
    sem = statistics.stdev(delays) / math.sqrt(len(delays)) if len(delays) > 1 else float("nan")
    return DelayStats(horizon, statistics.fmean(delays), sem, len(delays))


def delay_table(
    horizons: tuple[int, ...] = (10, 30, 90), episodes: int = 200, systems: tuple[str, ...] = ("proactive", "lifecycle")
) -> dict[str, list[DelayStats]]:
    return {s: [asyncio.run(measure_delay(s, h, episodes)) for h in horizons] for s in systems}


if __name__ == "__main__":  # python -m porch_jax.rollout.delay
    for name, rows in delay_table().items():
        print(name, "  ".join(f"H={r.horizon}: {r.mean:.2f} (H/2={r.horizon / 2:g})" for r in rows))
