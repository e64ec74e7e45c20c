"""Environments: tools with JSON schemas, asynchronous notifications and a scorer behind one contract."""

from porch_jax.envs.base import Delivery, Environment, Feedback, MemoryItem, OrchestratorView, Score, SubagentView, Turn

__all__ = ["Delivery", "Environment", "Feedback", "MemoryItem", "OrchestratorView", "Score", "SubagentView", "Turn"]
