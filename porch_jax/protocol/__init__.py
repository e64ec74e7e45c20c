"""POrchestra protocol: harness, messages, actions; render to chat text and parse back. Pure Python."""
from porch_jax.protocol.actions import (
    COMM_ACTIONS, DELEGATE, FINISH, ORCHESTRATOR_ACTIONS, REVISABLE_FIELDS, REVISE, STOP, SUBMIT, Action,
    Delegate, Finish, OrchestratorAction, Revise, ReviseRequest, Stop, StopRequest, SubagentAction, Submit,
    ToolCall, to_call)
from porch_jax.protocol.harness import Harness
from porch_jax.protocol.messages import Message, Request, RequestTarget
from porch_jax.protocol.parse import (
    BadArguments, MalformedJSON, MultipleToolCalls, NoToolCall, ProtocolError, ToolNotAllowed, UnknownAction,
    extract_call, orchestrator_action_from_call, parse_orchestrator_action, parse_subagent_action,
    strip_thinking, subagent_action_from_call)
from porch_jax.protocol.render import (
    FULL_VIEW, FeedbackView, assistant_message, comm_feedback, harness_update_text, observation_message,
    orchestrator_system_prompt, render_action, render_call, render_feedback, render_harness, render_message,
    subagent_messages, subagent_system_prompt, task_message)
from porch_jax.protocol.schemas import comm_tool_schemas, orchestrator_tool_schemas, subagent_tool_schemas

__all__ = [
    "COMM_ACTIONS", "DELEGATE", "FINISH", "ORCHESTRATOR_ACTIONS", "REVISABLE_FIELDS", "REVISE", "STOP", "SUBMIT",
    "Action", "Delegate", "Finish", "OrchestratorAction", "Revise", "ReviseRequest", "Stop", "StopRequest",
    "SubagentAction", "Submit", "ToolCall", "to_call", "Harness", "Message", "Request", "RequestTarget",
    "BadArguments", "MalformedJSON", "MultipleToolCalls", "NoToolCall", "ProtocolError", "ToolNotAllowed",
    "UnknownAction", "extract_call", "orchestrator_action_from_call", "parse_orchestrator_action",
    "parse_subagent_action", "strip_thinking", "subagent_action_from_call", "FULL_VIEW", "FeedbackView",
    "assistant_message", "comm_feedback", "harness_update_text", "observation_message",
    "orchestrator_system_prompt", "render_action", "render_call", "render_feedback", "render_harness",
    "render_message", "subagent_messages", "subagent_system_prompt", "task_message", "comm_tool_schemas",
    "orchestrator_tool_schemas", "subagent_tool_schemas",
]
