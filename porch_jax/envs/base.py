"""The Environment contract, and the typed views the engine hands to scripted policies.

An environment owns the world a task runs in: tools (with JSON schemas), asynchronous
notifications and the scorer. Scripted policies (experts, sub-agents) see the episode through the
views below, the same information the rendered chat messages carry, so a scripted run and an LLM
run are comparable. ``Score`` mirrors ``trajectories.Outcome`` field for field (envs may import
only the protocol); the engine converts it.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Literal

from porch_jax.protocol import ORCHESTRATOR_ACTIONS, Harness, Message


@dataclass(frozen=True)
class Score:
    success: bool
    score: float
    reason: str


@dataclass(frozen=True)
class Delivery:
    """A notification as delivered: when it arrived (simulated time, in steps) and when it was seen."""

    text: str
    arrival: float
    delivered_step: int
    relevant: bool


class Environment(abc.ABC):
    """reset a task, list tools, call a tool, poll notifications, score the outcome.

    Time is the engine's global step counter: the engine polls before every sub-agent step and
    every orchestrator decision, passing the current step; each notification is returned once.
    """

    name: str = "env"

    @abc.abstractmethod
    def reset(self, task: Any) -> None: ...

    @abc.abstractmethod
    def tool_names(self) -> tuple[str, ...]:
        """Every tool a harness may grant."""

    @abc.abstractmethod
    def tool_schemas(self, names: tuple[str, ...] | list[str]) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def call_tool(self, agent_id: int, name: str, args: dict[str, Any]) -> str:
        """Run one tool call; bad arguments come back as an error observation, never an exception."""

    @abc.abstractmethod
    def poll_notifications(self, step: int) -> list[str]: ...

    @abc.abstractmethod
    def score(self, answer: str | None) -> Score: ...

    def deliveries(self) -> list[Delivery]:
        """Notifications delivered so far (for intervention-delay measurement)."""
        return []


# ---- what scripted policies see ----------------------------------------------------------------

MemoryKind = Literal["call", "comm", "update", "notification", "error"]


@dataclass(frozen=True)
class MemoryItem:
    """One entry of a sub-agent's local trajectory h_{i,l}.

    call: ``name``/``args`` and the tool ``text`` output; comm: a communication action ``name``
    with its ``message``; update: a harness-update record (``text``); notification:
    its ``text``; error: an invalid action's error observation.
    """

    kind: MemoryKind
    text: str = ""
    name: str = ""
    args: dict[str, Any] = field(default_factory=dict)
    message: Message | None = None


@dataclass(frozen=True)
class SubagentView:
    """A sub-agent's view at local step ``steps_used`` (0-based) of its harness budget."""

    agent_id: int
    harness: Harness
    steps_used: int
    memory: tuple[MemoryItem, ...]
    comm: tuple[str, ...]
    solo: bool  # ReAct: the agent owns the whole task (acts on user notifications itself)
    seed: int


@dataclass(frozen=True)
class Feedback:
    """What came back to the orchestrator after one action, with ablated message fields removed."""

    event: str  # submit | revise | stop | budget_exhausted | stopped | rejected | invalid | joined
    agent_id: int | None = None
    result: str | None = None
    message: Message | None = None
    steps_used: int = 0
    budget: int = 0
    notifications: tuple[str, ...] = ()  # delivered to the orchestrator with this feedback
    text: str = ""
    parts: tuple[Feedback, ...] = ()  # joined: one sub-agent's feedback each (delegate_all, plan), in subtask order


@dataclass(frozen=True)
class Turn:
    """One past orchestrator decision: the parsed action (None if invalid) and its feedback."""

    action: Any
    feedback: Feedback


@dataclass(frozen=True)
class OrchestratorView:
    task: Any
    turns: tuple[Turn, ...]
    live: tuple[int, ...]  # paused sub-agents that Revise/Stop may address
    agents_used: int
    max_agents: int
    steps_left: int
    default_budget: int  # the per-sub-agent budget to use when nothing says otherwise
    revisable: tuple[str, ...]
    comm: tuple[str, ...]  # the sub-agents' communication actions (lifecycle: submit only)
    seed: int
    actions: tuple[str, ...] = ORCHESTRATOR_ACTIONS  # the orchestrator's action names allowed now (the system's set)
