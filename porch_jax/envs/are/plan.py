"""The oracle plan of an ARE scenario, for the scripted (oracle-replay) policies.

Each agent event of the scenario's DAG (``OracleEvent`` or an ``AGENT``-typed event) becomes a
``PlanStep``: the tool call with its arguments, the simulated time before which it cannot happen
(the latest environment or user event it depends on), and the user messages of its turn it depends
on, which decide whether a sub-agent's harness covers it. The policies replay these steps through
the engine; they do not resolve ``{{event_id}}`` placeholders (a call with one fails as a tool error).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from typing import Any

from are.simulation.types import AbstractEvent, Event, EventType, OracleEvent

from porch_jax.envs.are.scripted import PlanStep
from porch_jax.envs.are.tools import USER_APP

SEND_TO_USER, SEND_TO_AGENT = "send_message_to_user", "send_message_to_agent"


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


def _concrete(event: AbstractEvent, env: Any) -> Event | None:
    """The concrete agent event (an OracleEvent is built inside ARE's capture mode: nothing runs)."""
    if isinstance(event, OracleEvent):
        event = event.make(env)
    if isinstance(event, Event) and event.event_type == EventType.AGENT and event.action is not None:
        return event
    return None


def _is_user_message(event: AbstractEvent) -> bool:
    action = getattr(event, "action", None)
    return action is not None and getattr(action, "function_name", "") == SEND_TO_AGENT


def _static_times(events: list[AbstractEvent], start: float) -> dict[str, tuple[float, int]]:
    """(due time, depth) of each event if every predecessor happens on time; conditions count as
    immediate. Sorting by it is a topological order (a successor is never earlier, and is deeper)."""
    times: dict[str, tuple[float, int]] = {}

    def time_of(e: AbstractEvent) -> tuple[float, int]:
        if e.event_id not in times:
            deps = [time_of(d) for d in e.dependencies]
            depth = 1 + max((d[1] for d in deps), default=0)
            if e.event_relative_time is None and e.event_time is not None:
                times[e.event_id] = (e.event_time, depth)
            else:
                base = max((d[0] for d in deps), default=start)
                times[e.event_id] = (base + (e.event_relative_time or 0.0), depth)
        return times[e.event_id]

    for e in events:
        time_of(e)
    return times


def _ancestors(event: AbstractEvent) -> Iterable[AbstractEvent]:
    seen: set[str] = set()
    stack = list(event.dependencies)
    while stack:
        e = stack.pop()
        if e.event_id not in seen:
            seen.add(e.event_id)
            yield e
            stack.extend(e.dependencies)


def oracle_plan(scenario: Any, env: Any, public_names: dict[str, str]) -> list[PlanStep]:
    """Agent steps in dependency order; ``public_names`` maps ``App__function`` to the exposed name."""
    events = list(scenario.events)
    times = _static_times(events, scenario.start_time or 0.0)
    turn_of = dict(getattr(scenario, "event_id_to_turn_idx", None) or {})
    steps = []
    for e in sorted(events, key=lambda e: times[e.event_id]):
        concrete = _concrete(e, env)
        if concrete is None:
            continue
        name = f"{concrete.action.app_name}__{concrete.action.function_name}"
        if name.startswith(f"{USER_APP}__") and not name.endswith(SEND_TO_USER):
            continue  # reading the user interface: our agents get user messages as notifications
        ancestors = list(_ancestors(e))
        turn = turn_of.get(e.event_id, 0)
        requires = tuple(
            a.action.args["content"] for a in ancestors if _is_user_message(a) and turn_of.get(a.event_id, 0) == turn
        )
        ready = max(
            (times[a.event_id][0] for a in ancestors if a.event_type in (EventType.ENV, EventType.USER)),
            default=times[e.event_id][0],
        )
        args = {k: _jsonable(v) for k, v in concrete.action.args.items() if k != "self"}
        steps.append(PlanStep(e.event_id, public_names.get(name, name), args, ready, requires, turn))
    return steps
