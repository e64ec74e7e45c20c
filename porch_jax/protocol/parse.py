"""Parse model text back into actions, Hermes/Qwen tool-call format, with typed errors.

Mirrors vLLM's hermes parser: a call is ``<tool_call>{json}</tool_call>`` (an unclosed final
``<tool_call>`` is read to the end of the text, as when generation stops at max tokens). Text
before the call and ``<think>`` blocks are ignored. Any failure raises a ``ProtocolError`` whose
``observation`` is short enough to hand back to the model as its next observation; arbitrary
input never raises anything else (``PROTOCOL_ERRORS`` lists every class).

A reply that is only whitespace is ``EmptyReply``; a final ``<tool_call>`` that never closes and
is not complete JSON is ``UnclosedToolCall``; a reply the backend cut at its token limit
(``truncated=True``: finish_reason "length") with no complete call in it is ``Truncated``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Collection
from typing import Any

from porch_jax.protocol.actions import (
    COMM_ACTIONS,
    DELEGATE,
    DELEGATE_ALL,
    FINISH,
    ORCHESTRATOR_ACTIONS,
    PLAN,
    REVISABLE_FIELDS,
    REVISE,
    STOP,
    SUBMIT,
    Delegate,
    DelegateAll,
    Finish,
    OrchestratorAction,
    Plan,
    Revise,
    ReviseRequest,
    Stop,
    StopRequest,
    SubagentAction,
    Submit,
    ToolCall,
)
from porch_jax.protocol.harness import Harness
from porch_jax.protocol.messages import Message, Request, RequestTarget


class ProtocolError(ValueError):
    """A model reply that is not exactly one valid action. ``observation`` is model-facing."""

    kind = "protocol_error"

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail

    @property
    def observation(self) -> str:
        detail = self.detail if len(self.detail) <= 300 else self.detail[:300] + "..."
        return f"Error ({self.kind}): {detail} Reply with exactly one <tool_call>."


class NoToolCall(ProtocolError):
    kind = "no_tool_call"


class EmptyReply(NoToolCall):
    """Nothing but whitespace."""

    kind = "empty_reply"


class MultipleToolCalls(ProtocolError):
    kind = "multiple_tool_calls"


class MalformedJSON(ProtocolError):
    kind = "malformed_json"


class UnclosedToolCall(MalformedJSON):
    """A final ``<tool_call>`` without ``</tool_call>`` whose body is not complete JSON."""

    kind = "unclosed_tool_call"


class Truncated(ProtocolError):
    """Cut at the token limit before a complete call (no call, or an unclosed one that does not parse)."""

    kind = "truncated"


class UnknownAction(ProtocolError):
    kind = "unknown_action"


class BadArguments(ProtocolError):
    kind = "bad_arguments"


class ToolNotAllowed(ProtocolError):
    kind = "tool_not_allowed"


# Every error a parse can raise; records count invalid replies by class name (INVALID_KINDS, the keys of an episode's
# meta["invalid_kinds"]).
PROTOCOL_ERRORS: tuple[type[ProtocolError], ...] = (
    NoToolCall,
    EmptyReply,
    MultipleToolCalls,
    MalformedJSON,
    UnclosedToolCall,
    Truncated,
    UnknownAction,
    BadArguments,
    ToolNotAllowed,
)
INVALID_KINDS: tuple[str, ...] = tuple(e.__name__ for e in PROTOCOL_ERRORS)


_THINK_END = "</think>"
_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
_MAX_SHOWN = 80


def _short(text: str) -> str:
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "..."


def strip_thinking(text: str) -> str:
    """Drop reasoning: everything up to the last ``</think>``; an unclosed ``<think>`` eats the rest."""
    if _THINK_END in text:
        return text.rsplit(_THINK_END, 1)[1]
    start = text.find("<think>")
    return text if start < 0 else text[:start]


def extract_call(text: str, *, truncated: bool = False) -> dict[str, Any]:
    """The single tool call in ``text`` as ``{"name": str, "arguments": dict}``. ``truncated``: the text stopped at
    the backend's token limit, so a missing or unfinished call is reported as ``Truncated``."""
    if not text.strip():
        raise EmptyReply("empty reply.")
    matches = list(_CALL_RE.finditer(strip_thinking(text)))
    if not matches:
        if truncated:
            raise Truncated("reply cut at the token limit before any <tool_call>; write the call first.")
        raise NoToolCall("no <tool_call> found.")
    if len(matches) > 1:
        raise MultipleToolCalls(f"{len(matches)} tool calls found; one action per reply.")
    closed = matches[0].group(1) is not None
    body = matches[0].group(1) if closed else matches[0].group(2)
    try:
        call = json.loads(body)
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError; so is a huge int
        if closed:
            raise MalformedJSON(f"tool call is not valid JSON ({_short(str(e))}).") from None
        if truncated:
            raise Truncated("reply cut at the token limit inside the <tool_call>; keep the call short.") from None
        raise UnclosedToolCall(
            f"<tool_call> is never closed and is not valid JSON ({_short(str(e))}); end it with </tool_call>."
        ) from None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise MalformedJSON('tool call must be an object {"name": str, "arguments": object}.')
    args = call.get("arguments", {})
    if isinstance(args, str):  # OpenAI-style arguments-as-string
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            raise MalformedJSON("arguments string is not valid JSON.") from None
    if not isinstance(args, dict):
        raise MalformedJSON('"arguments" must be a JSON object.')
    extra = set(call) - {"name", "arguments"}
    if extra:
        raise MalformedJSON(f"unexpected keys in tool call: {sorted(extra)}.")
    return {"name": call["name"], "arguments": args}


# ---- argument readers --------------------------------------------------------------------------


class _Args:
    """Typed access to one call's arguments; raises BadArguments naming the action and key."""

    def __init__(self, action: str, args: dict[str, Any], allowed: Collection[str]):
        extra = set(args) - set(allowed)
        if extra:
            raise BadArguments(f"{action}: unexpected arguments {sorted(extra)}; allowed {sorted(allowed)}.")
        self.action, self.args = action, args

    def _bad(self, key: str, want: str) -> BadArguments:
        return BadArguments(f"{self.action}: {key!r} must be {want}.")

    def _absent(self, key: str, required: bool) -> bool:
        """Missing, or null for an optional argument (models often write null for "not set")."""
        if key in self.args and (required or self.args[key] is not None):
            return False
        if required:
            raise BadArguments(f"{self.action}: missing required argument {key!r}.")
        return True

    def str(self, key: str, required: bool = True, default: Any = None) -> Any:
        if self._absent(key, required):
            return default
        v = self.args[key]
        if not isinstance(v, str):
            raise self._bad(key, "a string")
        return v

    def int(self, key: str, minimum: int, required: bool = True) -> Any:
        if self._absent(key, required):
            return None
        v = self.args[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self._bad(key, f"an integer >= {minimum}")
        return v

    def strs(self, key: str, required: bool = True) -> tuple[str, ...] | None:
        if self._absent(key, required):
            return None
        v = self.args[key]
        if isinstance(v, str):  # a lone string is a common model slip; accept it as one item
            return (v,)
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise self._bad(key, "a list of strings")
        return tuple(v)


_MESSAGE_KEYS = ("status", "request", "evidence")


def _message(a: _Args) -> Message:
    req = a.args.get("request")
    request = None
    if req is not None:
        if not isinstance(req, dict) or not isinstance(req.get("target"), str):
            raise BadArguments(f'{a.action}: "request" must be an object {{"target", "operation", "detail"}}.')
        r = _Args(f"{a.action}.request", req, ("target", "operation", "detail"))
        try:
            target = RequestTarget(req["target"].lower())
        except ValueError:
            raise BadArguments(
                f"{a.action}: request target must be one of {[t.value for t in RequestTarget]}."
            ) from None
        request = Request(target, r.str("operation"), r.str("detail", required=False, default=""))
    return Message(a.str("status", required=False), request, a.strs("evidence", required=False) or ())


def _check_tools(tools: tuple[str, ...] | None, available: Collection[str] | None) -> None:
    if tools is None or available is None:
        return
    unknown = [t for t in tools if t not in available]
    if unknown:
        raise ToolNotAllowed(f"unknown tools {unknown}; available: {sorted(available)}.")


# ---- calls -> actions ----------------------------------------------------------------------------

_HARNESS_KEYS = ("subgoal", "context", "tools", "budget")


def _harness(a: _Args, available_tools: Collection[str] | None) -> Harness:
    """A delegation's harness (version 0) from its arguments, its tools checked against those a harness may grant."""
    tools = a.strs("tools")
    _check_tools(tools, available_tools)
    return Harness(a.str("subgoal"), a.strs("context"), tools, a.int("budget", 1))


def _typed(build):
    """Turn a constructor's TypeError/ValueError into BadArguments: only ProtocolError escapes."""

    @functools.wraps(build)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return build(*args, **kwargs)
        except ProtocolError:
            raise
        except (TypeError, ValueError) as e:
            raise BadArguments(_short(str(e)) + ".") from None

    return wrapper


@_typed
def orchestrator_action_from_call(
    call: dict[str, Any],
    *,
    available_tools: Collection[str] | None = None,
    agent_ids: Collection[int] | None = None,
    revisable: Collection[str] = REVISABLE_FIELDS,
    actions: Collection[str] = ORCHESTRATOR_ACTIONS,
) -> OrchestratorAction:
    """Validate a tool call against the orchestrator's action set.

    ``available_tools``: tools a harness may grant; ``agent_ids``: live sub-agents that Revise/Stop
    may address; ``revisable``: harness fields a Revise may change (ablations drop some);
    ``actions``: the action names the system allows now (a baseline's set, rollout/config.py). Unchecked when None.
    """
    name, args = (call.get("name"), call.get("arguments")) if isinstance(call, dict) else (None, None)
    if not isinstance(name, str) or not isinstance(args, dict):
        raise MalformedJSON('tool call must be an object {"name": str, "arguments": object}.')
    if name not in actions:
        raise UnknownAction(f"unknown action {_short(name)!r}; use one of {list(actions)}.")
    if name == DELEGATE:
        return Delegate(_harness(_Args(name, args, _HARNESS_KEYS), available_tools))
    if name in (DELEGATE_ALL, PLAN):
        subtasks = _Args(name, args, ("subtasks",)).args.get("subtasks")
        if not isinstance(subtasks, list) or not subtasks or not all(isinstance(t, dict) for t in subtasks):
            raise BadArguments(f"{name}: 'subtasks' must be a non-empty list of {{subgoal, context, tools, budget}}.")
        harnesses = tuple(
            _harness(_Args(f"{name}.subtasks[{i}]", t, _HARNESS_KEYS), available_tools) for i, t in enumerate(subtasks)
        )
        return Plan(harnesses) if name == PLAN else DelegateAll(harnesses)
    if name == REVISE:
        a = _Args(name, args, ("agent_id", *revisable, "note"))
        agent_id = a.int("agent_id", 0)
        if agent_ids is not None and agent_id not in agent_ids:
            raise BadArguments(f"revise: no live sub-agent {agent_id}; live: {sorted(agent_ids)}.")
        tools = a.strs("tools", required=False)
        _check_tools(tools, available_tools)
        return Revise(
            agent_id,
            a.str("subgoal", required=False),
            a.strs("context", required=False),
            tools,
            a.int("budget", 1, required=False),
            a.str("note", required=False, default=""),
        )
    if name == STOP:
        a = _Args(name, args, ("agent_id", "reason"))
        agent_id = a.int("agent_id", 0)
        if agent_ids is not None and agent_id not in agent_ids:
            raise BadArguments(f"stop: no live sub-agent {agent_id}; live: {sorted(agent_ids)}.")
        return Stop(agent_id, a.str("reason", required=False, default=""))
    if name == FINISH:
        return Finish(_Args(name, args, ("answer",)).str("answer"))
    raise UnknownAction(f"unknown action {_short(name)!r}; use one of {list(ORCHESTRATOR_ACTIONS)}.")


@_typed
def subagent_action_from_call(
    call: dict[str, Any], allowed_tools: Collection[str], comm: Collection[str] = COMM_ACTIONS
) -> SubagentAction:
    """Validate a tool call against a sub-agent's tools Ω and communication actions ``comm``.

    Tool arguments are checked by the environment, not here (it owns the tool schemas).
    """
    name, args = (call.get("name"), call.get("arguments")) if isinstance(call, dict) else (None, None)
    if not isinstance(name, str) or not isinstance(args, dict):
        raise MalformedJSON('tool call must be an object {"name": str, "arguments": object}.')
    if name in COMM_ACTIONS:
        if name not in comm:
            raise UnknownAction(f"{name!r} is not available; communication actions: {sorted(comm)}.")
        if name == SUBMIT:
            a = _Args(name, args, ("result", *_MESSAGE_KEYS))
            return Submit(a.str("result"), _message(a))
        a = _Args(name, args, _MESSAGE_KEYS)
        return ReviseRequest(_message(a)) if name == REVISE else StopRequest(_message(a))
    if name not in allowed_tools:
        raise ToolNotAllowed(
            f"tool {_short(name)!r} is not in your tool set {sorted(allowed_tools)} (communication: {sorted(comm)})."
        )
    return ToolCall(name, args)


def parse_orchestrator_action(text: str, *, truncated: bool = False, **checks: Any) -> OrchestratorAction:
    """Text -> orchestrator action; ``truncated`` as in ``extract_call``, ``checks`` as in
    ``orchestrator_action_from_call``."""
    return orchestrator_action_from_call(extract_call(text, truncated=truncated), **checks)


def parse_subagent_action(
    text: str, allowed_tools: Collection[str], comm: Collection[str] = COMM_ACTIONS, *, truncated: bool = False
) -> SubagentAction:
    """Text -> sub-agent action (a tool from ``allowed_tools`` or a communication action); ``truncated`` as in
    ``extract_call``."""
    return subagent_action_from_call(extract_call(text, truncated=truncated), allowed_tools, comm)
