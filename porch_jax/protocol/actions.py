"""Sub-agent actions (tool calls or communication) and orchestrator actions.

Every action maps to one tool call ``{"name": ..., "arguments": {...}}`` (``to_call``); that call
dict is also the form a parsed action takes in trajectory records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from porch_jax.protocol.harness import Harness
from porch_jax.protocol.messages import Message

# Communication action names (A_comm); environment tools may not reuse them.
SUBMIT, REVISE, STOP = "submit", "revise", "stop"
COMM_ACTIONS: tuple[str, ...] = (SUBMIT, REVISE, STOP)
# Orchestrator action names: the interleaved set (ORCHESTRATOR_ACTIONS) and the multi-agent baselines' calls
# (DELEGATE_ALL: Orchestra-o1's parallel delegation; PLAN: an offline plan, Skill-MAS / AutoAgents and MAS²).
DELEGATE, FINISH = "delegate", "finish"
DELEGATE_ALL, PLAN = "delegate_all", "plan"
ORCHESTRATOR_ACTIONS: tuple[str, ...] = (DELEGATE, REVISE, STOP, FINISH)
# Harness fields a Revise may change; ablations disable some of them.
REVISABLE_FIELDS: tuple[str, ...] = ("subgoal", "context", "tools", "budget")


# ---- sub-agent ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """A call to one of the sub-agent's environment tools."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("ToolCall.name must be a non-empty str")
        if self.name in COMM_ACTIONS:
            raise ValueError(f"tool name {self.name!r} is reserved for communication")
        if not isinstance(self.arguments, dict):
            raise TypeError("ToolCall.arguments must be a dict")


@dataclass(frozen=True)
class Submit:
    """Local task done: ``result`` goes back to the orchestrator with the message."""

    result: str
    message: Message = field(default_factory=Message)


@dataclass(frozen=True)
class ReviseRequest:
    """Ask the orchestrator to change the task scope or resources; execution pauses."""

    message: Message = field(default_factory=Message)


@dataclass(frozen=True)
class StopRequest:
    """Ask to terminate this execution path (e.g. the subgoal is infeasible)."""

    message: Message = field(default_factory=Message)


SubagentAction = ToolCall | Submit | ReviseRequest | StopRequest


# ---- orchestrator ------------------------------------------------------------------------------


def _check_agent_id(cls: str, agent_id: Any) -> None:
    if isinstance(agent_id, bool) or not isinstance(agent_id, int) or agent_id < 0:
        raise TypeError(f"{cls}.agent_id must be an int >= 0, got {agent_id!r}")


@dataclass(frozen=True)
class Delegate:
    """Start a new sub-agent with Φ^0 (so the harness version must be 0)."""

    harness: Harness

    def __post_init__(self) -> None:
        if not isinstance(self.harness, Harness):
            raise TypeError("Delegate.harness must be a Harness")
        if self.harness.version != 0:
            raise ValueError("Delegate starts a sub-agent at harness version 0")


@dataclass(frozen=True)
class DelegateAll:
    """Start several sub-agents at once (Orchestra-o1): they run concurrently, each to its end, and their
    results come back joined in one feedback."""

    harnesses: tuple[Harness, ...]

    def __post_init__(self) -> None:
        if isinstance(self.harnesses, Harness) or not isinstance(self.harnesses, (list, tuple)):
            raise TypeError(f"{type(self).__name__}.harnesses must be a list of Harness")
        if not self.harnesses:
            raise ValueError(f"{type(self).__name__} needs at least one subtask")
        for h in self.harnesses:
            Delegate(h)  # each subtask is a valid delegation (a Harness at version 0)
        object.__setattr__(self, "harnesses", tuple(self.harnesses))


@dataclass(frozen=True)
class Plan(DelegateAll):
    """A plan of sub-agents written before execution (Skill-MAS / AutoAgents, MAS²): they run one after another in
    the written order, each given the results of those before it, with no orchestrator call in between."""


@dataclass(frozen=True)
class Revise:
    """Revise live sub-agent ``agent_id``'s harness; None fields stay unchanged.

    ``context``/``tools`` replace the old lists and ``budget`` is the new total step budget, so a
    revision is unambiguous to both the model and the engine. ``note`` is free guidance that goes
    into the sub-agent's memory with the update record.
    """

    agent_id: int
    subgoal: str | None = None
    context: tuple[str, ...] | None = None
    tools: tuple[str, ...] | None = None
    budget: int | None = None
    note: str = ""

    def __post_init__(self) -> None:
        _check_agent_id("Revise", self.agent_id)
        for name in ("context", "tools"):
            v = getattr(self, name)
            if v is not None:
                if isinstance(v, str) or not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
                    raise TypeError(f"Revise.{name} must be None or a list of str")
                object.__setattr__(self, name, tuple(v))
        if self.subgoal is not None and not isinstance(self.subgoal, str):
            raise TypeError("Revise.subgoal must be None or str")
        if self.budget is not None and (
            isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 1
        ):
            raise TypeError(f"Revise.budget must be None or an int >= 1, got {self.budget!r}")
        if not isinstance(self.note, str):
            raise TypeError("Revise.note must be str")

    def changes(self) -> dict[str, Any]:
        """The harness fields this revision sets (those not None)."""
        return {k: getattr(self, k) for k in REVISABLE_FIELDS if getattr(self, k) is not None}

    def apply(self, harness: Harness) -> Harness:
        """Φ^ℓ → Φ^ℓ+1."""
        return harness.revised(**self.changes())


@dataclass(frozen=True)
class Stop:
    """Terminate sub-agent ``agent_id``; its lifecycle ends immediately."""

    agent_id: int
    reason: str = ""

    def __post_init__(self) -> None:
        _check_agent_id("Stop", self.agent_id)
        if not isinstance(self.reason, str):
            raise TypeError("Stop.reason must be str")


@dataclass(frozen=True)
class Finish:
    """End the episode with final answer y."""

    answer: str

    def __post_init__(self) -> None:
        if not isinstance(self.answer, str):
            raise TypeError("Finish.answer must be str")


OrchestratorAction = Delegate | DelegateAll | Revise | Stop | Finish
Action = SubagentAction | OrchestratorAction


def to_call(action: Action) -> dict[str, Any]:
    """The action as a tool call ``{"name", "arguments"}``; absent optional fields are omitted."""
    if isinstance(action, ToolCall):
        return {"name": action.name, "arguments": dict(action.arguments)}
    if isinstance(action, Submit):
        return {"name": SUBMIT, "arguments": {"result": action.result, **action.message.to_arguments()}}
    if isinstance(action, ReviseRequest):
        return {"name": REVISE, "arguments": action.message.to_arguments()}
    if isinstance(action, StopRequest):
        return {"name": STOP, "arguments": action.message.to_arguments()}
    if isinstance(action, Delegate):
        h = action.harness
        return {
            "name": DELEGATE,
            "arguments": {"subgoal": h.subgoal, "context": list(h.context), "tools": list(h.tools), "budget": h.budget},
        }
    if isinstance(action, DelegateAll):  # Plan included
        subtasks = [to_call(Delegate(h))["arguments"] for h in action.harnesses]
        return {"name": PLAN if isinstance(action, Plan) else DELEGATE_ALL, "arguments": {"subtasks": subtasks}}
    if isinstance(action, Revise):
        args: dict[str, Any] = {"agent_id": action.agent_id}
        for k, v in action.changes().items():
            args[k] = list(v) if isinstance(v, tuple) else v
        if action.note:
            args["note"] = action.note
        return {"name": REVISE, "arguments": args}
    if isinstance(action, Stop):
        args = {"agent_id": action.agent_id}
        if action.reason:
            args["reason"] = action.reason
        return {"name": STOP, "arguments": args}
    if isinstance(action, Finish):
        return {"name": FINISH, "arguments": {"answer": action.answer}}
    raise TypeError(f"not a protocol action: {type(action).__name__}")
