"""The sub-agent harness Φ = (subgoal g, context C, tools Ω, budget B), versioned by ℓ.

Frozen so a recorded decision can never be mutated after the fact; every revision produces a new
value with ``version + 1`` (the paper's Φ^ℓ → Φ^ℓ+1).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


def _str_tuple(value: Any, field: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise TypeError(f"Harness.{field} must be a list or tuple of str, got {type(value).__name__}")
    if not all(isinstance(v, str) for v in value):
        raise TypeError(f"Harness.{field} must contain only str")
    return tuple(value)


@dataclass(frozen=True)
class Harness:
    """Φ: what a sub-agent is asked to do, with what context, tools and step budget."""

    subgoal: str
    context: tuple[str, ...]
    tools: tuple[str, ...]
    budget: int
    version: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.subgoal, str):
            raise TypeError(f"Harness.subgoal must be str, got {type(self.subgoal).__name__}")
        # Lists are accepted for convenience and frozen to tuples so the value stays hashable.
        object.__setattr__(self, "context", _str_tuple(self.context, "context"))
        object.__setattr__(self, "tools", _str_tuple(self.tools, "tools"))
        for name in ("budget", "version"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"Harness.{name} must be int, got {type(v).__name__}")
        if self.budget < 1:
            raise ValueError(f"Harness.budget must be >= 1, got {self.budget}")
        if self.version < 0:
            raise ValueError(f"Harness.version must be >= 0, got {self.version}")

    def revised(self, **changes: Any) -> Harness:
        """A copy with ``changes`` applied and the version bumped (even if nothing changed)."""
        if "version" in changes:
            raise ValueError("version is bumped by revised(); do not pass it")
        return dataclasses.replace(self, **changes, version=self.version + 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "subgoal": self.subgoal,
            "context": list(self.context),
            "tools": list(self.tools),
            "budget": self.budget,
            "version": self.version,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Harness:
        return cls(d["subgoal"], tuple(d["context"]), tuple(d["tools"]), d["budget"], d.get("version", 0))
