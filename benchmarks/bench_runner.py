"""Runner throughput: sequential vs concurrent episodes against a backend with fixed latency.

Each episode makes ``--calls`` backend calls that each sleep ``--latency-ms`` (a stand-in for a
served model), then is recorded (fsync included). Concurrency should hide the latency almost
completely: the target is a > 50x speed-up for 256 episodes at concurrency 256.

    python benchmarks/bench_runner.py [--episodes 256] [--calls 4] [--latency-ms 50] [--concurrency 256]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from porch_jax.backends import ChatRequest, CostMeter, MeteredBackend, ScriptedBackend
from porch_jax.protocol import Finish, parse_orchestrator_action, render_action
from porch_jax.rollout.runner import RunSummary, run_episodes
from porch_jax.trajectories import EpisodeRecord, Outcome, RoleCost, TrajectoryStore


def make_episode(calls: int, latency_s: float):
    backend = ScriptedBackend(lambda r: render_action(Finish(str(r.state))), latency_s=latency_s)

    async def episode(task: str) -> EpisodeRecord:
        meter = CostMeter()
        metered = MeteredBackend(backend, meter)
        for _ in range(calls):
            result = await metered.chat(ChatRequest([{"role": "user", "content": task}], state=task))
            parse_orchestrator_action(result.text)
        return EpisodeRecord(
            episode_id=task,
            task_id=task,
            env="bench",
            system="scripted",
            config_hash="",
            seed=0,
            outcome=Outcome(success=True, score=1.0, reason="ok"),
            cost={k: RoleCost(**v) for k, v in meter.to_dict().items()},
        )

    return episode


def bench(episodes: int, calls: int, latency_s: float, concurrency: int, root: Path) -> RunSummary:
    store = TrajectoryStore(root / f"c{concurrency}.jsonl")
    tasks = [f"t{i}" for i in range(episodes)]
    summary = asyncio.run(run_episodes(tasks, make_episode(calls, latency_s), store, concurrency, progress=False))
    store.close()
    assert summary.completed == episodes and len(store.read()) == episodes
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=256)
    p.add_argument("--calls", type=int, default=4)
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument("--concurrency", type=int, default=256)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        seq = bench(a.episodes, a.calls, a.latency_ms / 1e3, 1, Path(tmp))
        con = bench(a.episodes, a.calls, a.latency_ms / 1e3, a.concurrency, Path(tmp))
    ideal = a.episodes * a.calls * a.latency_ms / 1e3
    print(f"{a.episodes} episodes x {a.calls} calls x {a.latency_ms:g} ms (sequential ideal {ideal:.1f} s)")
    print(f"concurrency 1:   {seq.wall_s:8.2f} s  {a.episodes / seq.wall_s:8.1f} ep/s")
    print(f"concurrency {a.concurrency}: {con.wall_s:8.2f} s  {a.episodes / con.wall_s:8.1f} ep/s")
    print(f"speed-up: {seq.wall_s / con.wall_s:.1f}x (target > 50x)")


if __name__ == "__main__":
    main()
