"""Engine overhead per step with zero-latency scripted backends.

    python benchmarks/bench_engine.py [--episodes 200]

1. Runtime overhead: policies that return precomputed text (so nothing but the engine runs:
   rendering, parsing, the environment call, metering, recording), one sub-agent of horizon H.
2. The workplace comparison's scripted expert and sub-agents, per step and per episode.
Target: under 1 ms of engine time per step.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from porch_jax.backends import ScriptedBackend
from porch_jax.envs.workplace import ScriptedExpert, ScriptedSubagent, WorkplaceEnv, make_task, make_tasks
from porch_jax.protocol import Delegate, Finish, Harness, Submit, ToolCall, render_action
from porch_jax.rollout import Engine, system_config

TOOL = render_action(ToolCall("calendar", {"op": "search", "q": "Retro"}))
SUBMIT = render_action(Submit("done"))
FINISH = render_action(Finish("done"))


def trivial_engine(horizon: int) -> Engine:
    delegate = render_action(Delegate(Harness("find venue of Retro", (), ("calendar",), horizon)))
    return Engine(
        WorkplaceEnv,
        ScriptedBackend(lambda r: FINISH if r.state.turns else delegate),
        ScriptedBackend(lambda r: SUBMIT if r.state.steps_used == horizon - 1 else TOOL),
    )


async def _time(engine: Engine, tasks: list) -> tuple[float, int, int]:
    start, steps, calls = time.perf_counter(), 0, 0
    for task in tasks:
        rec = await engine.run(task)
        steps += rec.meta["steps"]
        calls += sum(c.calls for c in rec.cost.values())
    return time.perf_counter() - start, steps, calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=200)
    n = ap.parse_args().episodes
    task = make_task(0)
    print("runtime overhead, precomputed replies (one sub-agent of horizon H):")
    for horizon in (10, 30, 90):
        wall, steps, calls = asyncio.run(_time(trivial_engine(horizon), [task] * max(1, n // 4)))
        print(
            f"  H={horizon:<3} {steps / wall:8.0f} steps/s  {1e6 * wall / steps:6.0f} us/step  "
            f"{1e6 * wall / calls:6.0f} us/call"
        )
    tasks = make_tasks(n)
    print(f"scripted workplace policies ({n} tasks):")
    for system in ("proactive", "lifecycle", "react"):
        engine = Engine(
            WorkplaceEnv, ScriptedBackend(ScriptedExpert()), ScriptedBackend(ScriptedSubagent()), system_config(system)
        )
        wall, steps, calls = asyncio.run(_time(engine, tasks))
        print(
            f"  {system:<10} {steps / wall:8.0f} steps/s  {1e6 * wall / steps:6.0f} us/step  "
            f"{1e3 * wall / n:6.2f} ms/episode"
        )


if __name__ == "__main__":
    main()
