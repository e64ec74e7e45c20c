"""Deterministic simulated time for a running ARE environment.

ARE's agent-mode event loop ticks once per real second, and its own agent pauses the environment
while the model generates. We keep the environment paused for the whole run and move time only
when the engine takes a step: ``advance(seconds)`` adds the step's simulated duration and processes
what became due, so a run's timeline depends on its steps, never on wall-clock speed. ARE itself
unpauses time in two places (``SystemApp.wait_for_notification`` and the GAIA2 turn trigger), so
every operation re-freezes afterwards.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from are.simulation.notification_system import Message
from are.simulation.types import EnvironmentState


class SimClock:
    def __init__(self, env: Any):
        self.env = env

    def freeze(self) -> None:
        """Stop time and the event loop thread (idempotent)."""
        if self.env.state == EnvironmentState.RUNNING:
            self.env.pause()
        elif not self.env.time_manager.is_paused:
            self.env.time_manager.pause()

    def now(self) -> float:
        return self.env.time_manager.time()

    def advance(self, seconds: float) -> None:
        """Move simulated time forward and process every event that became due."""
        self.freeze()
        if seconds > 0:
            self.env.time_manager.add_offset(seconds)
        if self.env.state != EnvironmentState.STOPPED:
            self.env.tick()
        self.freeze()

    def due_messages(self) -> list[Message]:
        """Notifications (user messages, environment notifications, stop) due by now, removed from the queue."""
        queue = self.env.notification_system.message_queue
        return queue.get_by_timestamp(datetime.fromtimestamp(self.now(), tz=UTC))

    def release(self) -> None:
        """Unblock the event loop thread with time still frozen, so ARE's ``stop()`` ends it."""
        self.freeze()
        if self.env.state == EnvironmentState.PAUSED:
            self.env.pause_event.clear()
            self.env.state = EnvironmentState.RUNNING
