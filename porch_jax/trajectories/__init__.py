"""Trajectory records (versioned schema) and the append-only JSONL store."""

from porch_jax.trajectories.schema import (
    ROLES,
    SCHEMA_VERSION,
    DecisionKey,
    DecisionRecord,
    EpisodeRecord,
    Outcome,
    RecordError,
    RoleCost,
    SubStep,
)
from porch_jax.trajectories.store import TrajectoryStore, encode_record

__all__ = [
    "ROLES",
    "SCHEMA_VERSION",
    "DecisionKey",
    "DecisionRecord",
    "EpisodeRecord",
    "Outcome",
    "RecordError",
    "RoleCost",
    "SubStep",
    "TrajectoryStore",
    "encode_record",
]
