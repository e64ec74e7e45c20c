"""Episode records with chosen outcomes, for the report and seed-set tests (not a test module)."""

from __future__ import annotations

from collections.abc import Sequence

from porch_jax.trajectories import EpisodeRecord, Outcome, RoleCost


def records_with(successes: Sequence[int]) -> list[EpisodeRecord]:
    """One workplace episode per entry, task t{i} succeeding where the entry is 1, with fixed costs."""
    return [
        EpisodeRecord(
            episode_id=f"m/t{i}",
            task_id=f"t{i}",
            env="workplace",
            system="m",
            config_hash="h",
            seed=i,
            outcome=Outcome(bool(s), float(s), "ok" if s else "failed"),
            cost={"orchestrator": RoleCost(4, 300, 50), "subagent": RoleCost(10, 1000, 100)},
        )
        for i, s in enumerate(successes)
    ]
