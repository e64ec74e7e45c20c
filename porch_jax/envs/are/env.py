"""An ARE scenario behind our ``Environment`` contract, so the rollout engine runs on it unchanged.

Tools are the scenario's app tools (calls go through ARE, so the judge sees them in the event log).
Notifications are ARE's message queue: user messages become ``User: ...`` and environment
notifications keep ARE's text; the engine delivers them to the running sub-agent, or to the
orchestrator with its next feedback, exactly as in the workplace suite. Time: each engine step
(one sub-agent step) is ``seconds_per_step`` of simulated time; ``SystemApp__wait_for_notification``
jumps ahead as in ARE. Scoring is ARE's: ``score`` only says so, and the runner fills the outcome
from the GAIA2 judge's verdict.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from are.simulation.notification_system import Message, MessageType
from are.simulation.types import EventType

from porch_jax.envs.are.clock import SimClock
from porch_jax.envs.are.tools import subagent_tools, tool_schema
from porch_jax.envs.base import Delivery, Environment, Score

_USER_TEXT = re.compile(r"\nMessage: (.*)\nAlready read:", re.DOTALL)
_MAX_OBSERVATION = 4000
PENDING = "pending: the GAIA2 judge scores the scenario after the run"


@dataclass(frozen=True)
class Gaia2Task:
    """One turn of a scenario: the user's request (with earlier turns quoted) for one engine episode."""

    task_id: str
    text: str
    turn: int
    seed: int = 0


def message_text(message: Message) -> str:
    """An ARE notification as the line an agent sees."""
    if message.message_type == MessageType.USER_MESSAGE:
        m = _USER_TEXT.search(message.message)
        return f"User: {m[1] if m else message.message}"
    if message.message_type == MessageType.ENVIRONMENT_STOP:
        return f"Environment stopped: {message.message}"
    return message.message


class AREEnvironment(Environment):
    name = "gaia2"

    def __init__(self, clock: SimClock, tools: list[Any], seconds_per_step: float):
        self.clock, self.seconds_per_step = clock, seconds_per_step
        self._tools = subagent_tools(tools)
        self._user_tool = next(t for t in tools if t._public_name.endswith("__send_message_to_user"))
        self._pending: list[Message] = []
        self._deliveries: list[Delivery] = []
        self._step = 0
        self.stopped = False

    def reset(self, task: Gaia2Task) -> None:
        """A new turn: the engine's step clock restarts (simulated time does not)."""
        self._step = 0
        self._deliveries = []

    def tool_names(self) -> tuple[str, ...]:
        return tuple(sorted(self._tools))

    def tool_schemas(self, names: tuple[str, ...] | list[str]) -> list[dict[str, Any]]:
        return [tool_schema(self._tools[n]) for n in names if n in self._tools]

    def call_tool(self, agent_id: int, name: str, args: dict[str, Any]) -> str:
        if self.stopped:
            return "error: the environment has stopped"
        tool = self._tools.get(name)
        if tool is None:
            return f"error: unknown tool {name!r}"
        try:
            out = str(tool(**args))
        except Exception as e:  # ARE raises on bad arguments and failed lookups: an observation
            out = f"error: {type(e).__name__}: {e}"
        finally:
            self.clock.freeze()
        return out if len(out) <= _MAX_OBSERVATION else out[:_MAX_OBSERVATION] + "…"

    def poll_notifications(self, step: int) -> list[str]:
        self.clock.advance((step - self._step) * self.seconds_per_step)
        self._step = step
        due = self._pending + self._collect()
        self._pending = []
        now = self.clock.now()
        for m in due:
            arrival = step - (now - m.timestamp.timestamp()) / self.seconds_per_step
            self._deliveries.append(Delivery(message_text(m), arrival, step, True))
        return [message_text(m) for m in due]

    def score(self, answer: str | None) -> Score:
        return Score(False, 0.0, PENDING)

    def deliveries(self) -> list[Delivery]:
        return list(self._deliveries)

    # ---- used by the ARE agent between engine episodes --------------------------------------------
    def wait_for_user(self, max_seconds: float, tick_s: float = 1.0) -> list[str]:
        """Advance time until user messages arrive (their texts) or ``max_seconds`` pass (``[]``).

        Environment notifications that arrive meanwhile are kept for the next episode's first poll.
        """
        waited = 0.0
        while not self.stopped:
            due = self._collect()
            users = [m for m in due if m.message_type == MessageType.USER_MESSAGE]
            self._pending += [m for m in due if m.message_type != MessageType.USER_MESSAGE]
            if users:
                return [message_text(m).removeprefix("User: ") for m in users]
            if waited >= max_seconds:
                break
            self.clock.advance(tick_s)
            waited += tick_s
        return []

    def send_to_user(self, content: str) -> None:
        """The orchestrator's final answer, as ARE's end-of-turn message to the user."""
        self._user_tool(content=content)
        self.clock.advance(0.0)

    def drain(self, max_seconds: float) -> None:
        """Let the scheduled environment and user events that remain happen (within ``max_seconds``),
        as if the agent waited for notifications after its last turn: scenarios validate the world
        after everything in their timeline has happened, and GAIA2 counts environment events too."""
        deadline = self.clock.now() + max_seconds
        while not self.stopped:
            due = [
                e.event_time
                for e in self.clock.env.event_queue.list_view()
                if e.event_type in (EventType.ENV, EventType.USER) and e.event_time is not None
            ]
            if not due or min(due) > deadline:
                return
            self.clock.advance(max(min(due) - self.clock.now(), 0.0))
            self._pending += self._collect()

    def _collect(self) -> list[Message]:
        due = self.clock.due_messages()
        self.stopped = self.stopped or any(m.message_type == MessageType.ENVIRONMENT_STOP for m in due)
        return due
