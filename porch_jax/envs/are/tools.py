"""ARE app tools as OpenAI function schemas, and which of them a sub-agent may hold.

Pure functions over the attributes of ARE's ``AppTool`` (``_public_name``, ``_public_description``,
``args`` with ``name``/``arg_type``/``description``/``has_default``), so they are testable without ARE.
The AgentUserInterface is not a sub-agent tool: user messages reach agents as notifications and the
orchestrator's Finish is the message to the user, as in ARE's own default agent.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

USER_APP = "AgentUserInterface"
_SCALARS = {
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "dict": "object",
    "list": "array",
    "Any": "string",
}


def json_type(arg_type: Any) -> dict[str, Any]:
    """JSON schema for an ARE argument type string such as ``list[str] | None`` or ``int``."""
    text = str(arg_type).replace("typing.", "").replace("Optional[", "").strip()
    parts = [p.strip() for p in re.split(r"\|(?![^\[]*\])", text) if p.strip() not in ("None", "NoneType")]
    base = parts[0] if parts else "str"
    m = re.fullmatch(r"(list|List|tuple|set)\[(.+)\]", base)
    if m:
        return {"type": "array", "items": json_type(m[2])}
    m = re.fullmatch(r"(dict|Dict)\[.+\]", base)
    if m:
        return {"type": "object"}
    return {"type": _SCALARS.get(base.rstrip("]"), "string")}


def tool_schema(tool: Any) -> dict[str, Any]:
    """One app tool as an OpenAI function-tool schema; arguments with defaults are optional."""
    props = {a.name: {**json_type(a.arg_type), "description": a.description or ""} for a in tool.args}
    required = [a.name for a in tool.args if not a.has_default]
    return {
        "type": "function",
        "function": {
            "name": tool._public_name,
            "description": tool._public_description or "",
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


def subagent_tools(tools: Iterable[Any]) -> dict[str, Any]:
    """The tools a harness may grant, by public name (every app tool except the user interface's)."""
    return {t._public_name: t for t in tools if t.app_name != USER_APP}
