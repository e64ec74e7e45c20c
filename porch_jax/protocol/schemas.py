"""OpenAI function-tool JSON schemas for the orchestrator actions and sub-agent communication.

Passed as ``tools`` to a chat template or an OpenAI-compatible server (vLLM), they describe the
same calls that ``parse`` accepts; descriptions are kept short because templates inline them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
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
)
from porch_jax.protocol.messages import RequestTarget

_STR = {"type": "string"}
_STRS = {"type": "array", "items": {"type": "string"}}
_BUDGET = {"type": "integer", "minimum": 1, "description": "step budget"}
_AGENT = {"type": "integer", "minimum": 0}


def _tool(name: str, description: str, properties: dict[str, Any], required: Sequence[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(required),
                "additionalProperties": False,
            },
        },
    }


def _tools_prop(available_tools: Collection[str] | None) -> dict[str, Any]:
    if available_tools is None:
        return _STRS
    return {"type": "array", "items": {"type": "string", "enum": sorted(available_tools)}}


def orchestrator_tool_schemas(
    available_tools: Collection[str] | None = None,
    revisable: Collection[str] = REVISABLE_FIELDS,
    actions: Collection[str] = ORCHESTRATOR_ACTIONS,
) -> list[dict[str, Any]]:
    """The schemas of ``actions`` (Delegate / Revise / Stop / Finish by default; a baseline's set names
    delegate_all or plan). ``available_tools`` become an enum; ``revisable`` limits the fields a revise may set
    (revision ablations)."""
    tools = _tools_prop(available_tools)
    harness = {"subgoal": _STR, "context": _STRS, "tools": tools, "budget": _BUDGET}
    revise_props = {"agent_id": _AGENT, **{k: v for k, v in harness.items() if k in revisable}, "note": _STR}
    subtask = {"type": "object", "properties": harness, "required": list(harness), "additionalProperties": False}
    subtasks = {"subtasks": {"type": "array", "items": subtask, "minItems": 1}}
    schemas = [
        _tool(DELEGATE, "Start a sub-agent.", harness, ("subgoal", "context", "tools", "budget")),
        _tool(
            DELEGATE_ALL,
            "Start sub-agents that run in parallel; their results come back together.",
            subtasks,
            ("subtasks",),
        ),
        _tool(PLAN, "Run sub-agents in order, each given the results before it.", subtasks, ("subtasks",)),
        _tool(
            REVISE,
            "Change a paused sub-agent's harness; lists replace, budget is the new total.",
            revise_props,
            ("agent_id",),
        ),
        _tool(STOP, "End a sub-agent.", {"agent_id": _AGENT, "reason": _STR}, ("agent_id",)),
        _tool(FINISH, "Give the final answer.", {"answer": _STR}, ("answer",)),
    ]
    return [s for s in schemas if s["function"]["name"] in actions]


_MESSAGE_PROPS = {
    "status": {"type": "string", "description": "progress, uncertainty or blockage"},
    "request": {
        "type": "object",
        "properties": {
            "target": {"type": "string", "enum": [t.value for t in RequestTarget]},
            "operation": {"type": "string", "description": "e.g. add, remove, split, update, extend"},
            "detail": _STR,
        },
        "required": ["target", "operation"],
        "additionalProperties": False,
    },
    "evidence": {"type": "array", "items": {"type": "string"}, "description": "quoted tool outputs"},
}


def comm_tool_schemas(comm: Collection[str] = COMM_ACTIONS) -> list[dict[str, Any]]:
    """Schemas of the communication actions in ``comm``."""
    out = []
    if SUBMIT in comm:
        out.append(
            _tool(SUBMIT, "Local task done: return the result.", {"result": _STR, **_MESSAGE_PROPS}, ("result",))
        )
    if REVISE in comm:
        out.append(_tool(REVISE, "Ask to change your subgoal, context, tools or budget.", _MESSAGE_PROPS, ()))
    if STOP in comm:
        out.append(_tool(STOP, "This path cannot succeed: end it.", _MESSAGE_PROPS, ()))
    return out


def subagent_tool_schemas(
    tools: Sequence[Mapping[str, Any]] = (), comm: Collection[str] = COMM_ACTIONS
) -> list[dict[str, Any]]:
    """The sub-agent's environment tool schemas followed by its communication actions."""
    names = [t.get("function", t).get("name") for t in tools]
    clash = sorted(set(names) & set(COMM_ACTIONS))
    if clash:
        raise ValueError(f"environment tools {clash} clash with communication action names")
    return [dict(t) for t in tools] + comm_tool_schemas(comm)
