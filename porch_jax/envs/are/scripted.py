"""Scripted oracle-replay policies: run an ARE scenario through the engine with no model.

They know the scenario's oracle plan (``PlanStep``s) but act only through the protocol and the
environment's tools, so what they exercise is real: tool calls land in ARE's event log, waiting is
``SystemApp__wait_for_notification``, and a user's mid-run change reaches a sub-agent only as a
notification. Like the workplace sub-agents, a step belongs to a sub-agent when its harness quotes
the user message(s) the step depends on:
- proactive: a notification with a message the plan needs but the harness lacks makes it pause with
  a ``revise`` request (target task, the message as evidence); the orchestrator revises the subgoal;
- lifecycle (submit only): it keeps to its harness, so a step the user added mid-run is skipped;
- solo (ReAct): it owns the task and acts on user notifications itself;
- the inference baselines (Orchestra-o1's ``delegate_all``, Skill-MAS's and MAS²'s ``plan``): a turn is one subtask
  (every plan step of a turn hangs on that turn's user message(s), so there is nothing to split), written with the
  system's own first action; its sub-agent, like lifecycle's, only submits, and the orchestrator finishes with the
  joined result.
This module imports no ARE code (the plan is built by ``plan.oracle_plan``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from porch_jax.backends import ChatRequest
from porch_jax.envs.base import Feedback, OrchestratorView, SubagentView
from porch_jax.protocol import (
    DELEGATE,
    DELEGATE_ALL,
    REVISE,
    Delegate,
    DelegateAll,
    Finish,
    Harness,
    Message,
    Plan,
    Request,
    RequestTarget,
    Revise,
    ReviseRequest,
    Submit,
    ToolCall,
    render_action,
)

NOW_TOOL, WAIT_TOOL = "SystemApp__get_current_time", "SystemApp__wait_for_notification"
EARLIER, NEW = "Earlier in this conversation:", "The user's new message:"
_NOW = re.compile(r"'current_timestamp': ([0-9.]+)")


@dataclass(frozen=True)
class PlanStep:
    event_id: str
    tool: str  # public tool name; ``AgentUserInterface__send_message_to_user`` is the turn's answer
    args: dict[str, Any]
    ready_time: float  # simulated time of the latest environment or user event it depends on
    requires: tuple[str, ...]  # texts of this turn's user messages it depends on
    turn: int

    @property
    def is_answer(self) -> bool:
        return self.tool.endswith("__send_message_to_user")


def turn_text(history: list[tuple[str, str]], messages: list[str]) -> str:
    """The task text of one turn: earlier (user, answer) pairs quoted, then the new message(s)."""
    new = "\n".join(messages)
    if not history:
        return new
    earlier = "\n".join(f"User: {u}\nAssistant: {a}" for u, a in history)
    return f"{EARLIER}\n{earlier}\n\n{NEW}\n{new}"


def split_turn_text(text: str) -> tuple[str, str]:
    """(earlier conversation, new message) of a ``turn_text``."""
    if text.startswith(EARLIER) and f"\n\n{NEW}\n" in text:
        earlier, new = text.split(f"\n\n{NEW}\n", 1)
        return earlier.removeprefix(EARLIER).strip(), new
    return "", text


class ScriptedOracle:
    """``orchestrator`` and ``subagent`` policies for ``ScriptedBackend`` over one scenario's plan."""

    def __init__(self, plan: list[PlanStep], available_tools: Collection[str], *, answer_prefix: str = ""):
        """``answer_prefix``: put before every answer to the user, so it is no longer the oracle's exact text (the
        hard checks still pass; ARE's LLM soft checks then judge a reworded answer, which is what they are for)."""
        self.plan, self.available, self.answer_prefix = plan, set(available_tools), answer_prefix
        used = {s.tool for s in plan if not s.is_answer} | {NOW_TOOL, WAIT_TOOL}
        self.tools = tuple(sorted(used & self.available))

    # ---- orchestrator --------------------------------------------------------------------------
    def orchestrator(self, request: ChatRequest) -> str:
        v: OrchestratorView = request.state
        if not v.turns:
            earlier, new = split_turn_text(v.task.text)
            return render_action(
                first_action(Harness(new, (earlier,) if earlier else (), self.tools, v.default_budget), v.actions)
            )
        fb = v.turns[-1].feedback
        req = fb.message.request if fb.message is not None else None
        if fb.event == "revise" and req is not None and fb.agent_id in v.live:
            if req.target == RequestTarget.TASK:
                return render_action(
                    Revise(
                        fb.agent_id,
                        subgoal=f"{_subgoal(v, fb.agent_id)}\n{req.detail}",
                        note="The user updated the task.",
                    )
                )
            if req.target == RequestTarget.BUDGET and v.steps_left > 0:
                return render_action(Revise(fb.agent_id, budget=fb.budget + min(10, v.steps_left)))
        return render_action(Finish(self.answer_prefix + result(fb)))

    # ---- sub-agent -----------------------------------------------------------------------------
    def subagent(self, request: ChatRequest) -> str:
        v: SubagentView = request.state
        _, scope = split_turn_text(v.harness.subgoal)
        heard = [
            m.text.removeprefix("User: ") for m in v.memory if m.kind == "notification" and m.text.startswith("User: ")
        ]
        if v.solo:
            scope = "\n".join([scope, *heard])
        elif REVISE in v.comm:
            asked = {
                m.message.request.detail
                for m in v.memory
                if m.kind == "comm" and m.message is not None and m.message.request is not None
            }
            for text in heard:
                needed = any(text in s.requires for s in self.plan)
                if needed and text not in scope and text not in asked:
                    return render_action(
                        ReviseRequest(
                            Message(
                                "the user changed the task while I was working",
                                Request(RequestTarget.TASK, "update", text),
                                (f"User: {text}",),
                            )
                        )
                    )
        known = _times_read(v)
        step = self._next_step(v, scope, heard, known[-1] if known else None)
        if step is None:
            return render_action(Submit("", Message("nothing left that my task covers")))
        if step.is_answer:
            return render_action(Submit(str(step.args.get("content", ""))))
        # Before a timed step: read the clock, then wait for what is due (a notification may come first).
        early = not known or known[-1] < step.ready_time
        just_read = bool(v.memory) and v.memory[-1].kind == "call" and v.memory[-1].name == NOW_TOOL
        if early and just_read and WAIT_TOOL in v.harness.tools:
            return render_action(ToolCall(WAIT_TOOL, {"timeout": math.ceil(step.ready_time - known[-1])}))
        if early and not just_read and NOW_TOOL in v.harness.tools:
            return render_action(ToolCall(NOW_TOOL, {}))
        return render_action(ToolCall(step.tool, dict(step.args)))

    def _next_step(self, v: SubagentView, scope: str, heard: list[str], now: float | None) -> PlanStep | None:
        """The first step of my task not done yet; steps needing a message outside my harness are
        skipped once that message has come (or its time has passed) and waited for before."""
        done = [(m.name, m.args) for m in v.memory if m.kind == "call"]
        for s in self.plan:
            if not s.requires or not any(r in scope for r in s.requires):
                continue  # not my task
            if (s.tool, s.args) in done:
                done.remove((s.tool, s.args))
                continue
            missing = [r for r in s.requires if r not in scope]
            if missing and (any(r in heard for r in missing) or (now is not None and now >= s.ready_time)):
                continue  # the user asked for it, but not through my harness
            if s.is_answer or s.tool in v.harness.tools:
                return s
        return None


def first_action(harness: Harness, actions: Collection[str]) -> Delegate | DelegateAll:
    """The turn's one subtask, written with the first of delegate, delegate_all and plan the system allows."""
    if DELEGATE in actions:
        return Delegate(harness)
    if DELEGATE_ALL in actions:
        return DelegateAll((harness,))
    return Plan((harness,))


def result(fb: Feedback) -> str:
    """The answer a feedback carries: its own result, else (joined) the last of its parts' results."""
    return fb.result or next((p.result for p in reversed(fb.parts) if p.result), "")


def _subgoal(v: OrchestratorView, agent_id: int) -> str:
    """Agent ``agent_id``'s current subgoal, replayed from the orchestrator's own past actions."""
    subgoal, delegated = "", -1
    for turn in v.turns:
        a = turn.action
        if isinstance(a, Delegate):
            delegated += 1
            if delegated == agent_id:
                subgoal = a.harness.subgoal
        elif isinstance(a, Revise) and a.agent_id == agent_id and a.subgoal is not None:
            subgoal = a.subgoal
    return subgoal


def _times_read(v: SubagentView) -> list[float]:
    """The simulated times the sub-agent has read with ``SystemApp__get_current_time``, in order."""
    return [
        float(m[1])
        for item in v.memory
        if item.kind == "call" and item.name == NOW_TOOL
        for m in [_NOW.search(item.text)]
        if m
    ]
