"""The proactive communication message: status, request and evidence signals.

Status says why the sub-agent is talking (progress, uncertainty, blockage); request names what to
change (task scope or a resource) and how; evidence quotes the tool outputs that justify it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class RequestTarget(enum.StrEnum):
    """What a revise request adjusts: task scope (subgoal) or a resource (context, tools, budget)."""

    TASK = "task"
    CONTEXT = "context"
    TOOLS = "tools"
    BUDGET = "budget"


def _check_str(owner: str, name: str, value: Any, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise TypeError(f"{owner}.{name} must be str, got {type(value).__name__}")


@dataclass(frozen=True)
class Request:
    """The request signal: ``target`` to adjust and the ``operation`` (e.g. "add", "split")."""

    target: RequestTarget
    operation: str
    detail: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "target", RequestTarget(self.target))
        _check_str("Request", "operation", self.operation)
        _check_str("Request", "detail", self.detail)

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target.value, "operation": self.operation, "detail": self.detail}


@dataclass(frozen=True)
class Message:
    """A structured sub-agent message; any signal may be absent (None / empty)."""

    status: str | None = None
    request: Request | None = None
    evidence: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_str("Message", "status", self.status, optional=True)
        if self.request is not None and not isinstance(self.request, Request):
            raise TypeError("Message.request must be a Request or None")
        if isinstance(self.evidence, str) or not isinstance(self.evidence, (list, tuple)):
            raise TypeError("Message.evidence must be a list or tuple of str")
        if not all(isinstance(e, str) for e in self.evidence):
            raise TypeError("Message.evidence must contain only str")
        object.__setattr__(self, "evidence", tuple(self.evidence))

    def to_arguments(self) -> dict[str, Any]:
        """The message as tool-call arguments; absent signals are omitted to keep text short."""
        out: dict[str, Any] = {}
        if self.status is not None:
            out["status"] = self.status
        if self.request is not None:
            out["request"] = self.request.to_dict()
        if self.evidence:
            out["evidence"] = list(self.evidence)
        return out
