"""Render actions and observations as chat messages, compactly.

A tiny orchestrator LM is trained on these contexts with 512-1024 token windows, so every
rendered line is terse and omits absent fields. Actions are rendered exactly as Qwen/Hermes chat
templates render a tool call (``<tool_call>\\n{json}\\n</tool_call>``) so trained models emit what
vLLM's hermes parser reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
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
    Action,
    Delegate,
    Finish,
    ReviseRequest,
    StopRequest,
    Submit,
    to_call,
)
from porch_jax.protocol.harness import Harness
from porch_jax.protocol.messages import Message

# Tags that would end a call (or a think block) early if they appeared inside a JSON string; they
# are written with a JSON escape for "<" so the text parses back to the same value.
_TAGS = ("<tool_call>", "</tool_call>", "<think>", "</think>")


def render_call(call: Mapping[str, Any]) -> str:
    """A ``{"name", "arguments"}`` dict as Hermes tool-call text."""
    body = json.dumps({"name": call["name"], "arguments": call["arguments"]}, ensure_ascii=False)
    for tag in _TAGS:
        body = body.replace(tag, "\\u003c" + tag[1:])
    return f"<tool_call>\n{body}\n</tool_call>"


def render_action(action: Action) -> str:
    """An action as the assistant text a model should produce for it."""
    return render_call(to_call(action))


def assistant_message(action: Action) -> dict[str, str]:
    return {"role": "assistant", "content": render_action(action)}


def observation_message(text: str, step: int | None = None, budget: int | None = None) -> dict[str, str]:
    """An observation (tool output, feedback, error) as a user turn, optionally tagged [step/budget]."""
    prefix = f"[{step}/{budget}] " if step is not None and budget is not None else ""
    return {"role": "user", "content": prefix + text}


def _clip(text: str, max_chars: int | None) -> str:
    return text if max_chars is None or len(text) <= max_chars else text[:max_chars] + "…"


def render_harness(h: Harness) -> str:
    """Φ as compact lines."""
    lines = [f"Subgoal: {h.subgoal}"]
    if h.context:
        lines += ["Context:", *(f"- {c}" for c in h.context)]
    lines.append(f"Tools: {', '.join(h.tools) or '(none)'}")
    lines.append(f"Budget: {h.budget} steps")
    return "\n".join(lines)


# ---- sub-agent side (I_sub) ----------------------------------------------------------------------

_COMM_DOCS = {
    SUBMIT: "submit(result, status?, evidence?): done",
    REVISE: "revise(status, request{target: task|context|tools|budget, operation, detail}, evidence): "
    "ask to change your subgoal or resources",
    STOP: "stop(status, evidence?): this path cannot succeed",
}


def subagent_system_prompt(comm: Collection[str] = COMM_ACTIONS, tool_docs: Mapping[str, str] | None = None) -> str:
    """Static instructions: reply format, communication actions, and the proactive-communication cue."""
    lines = ["You are a sub-agent. One <tool_call> per reply."]
    if tool_docs:
        lines += [f"{k}: {v}" for k, v in tool_docs.items()]
    lines += [_COMM_DOCS[c] for c in COMM_ACTIONS if c in comm]
    if REVISE in comm or STOP in comm:
        lines.append(
            "When blocked (unclear task, missing tool or context, budget short), consider proactive "
            "communication; quote tool outputs as evidence."
        )
    return "\n".join(lines)


def subagent_messages(
    harness: Harness,
    memory: Sequence[Mapping[str, str]] = (),
    *,
    comm: Collection[str] = COMM_ACTIONS,
    tool_docs: Mapping[str, str] | None = None,
) -> list[dict[str, str]]:
    """I_sub: instructions, the delegated harness, then memory (the local trajectory: actions,
    observations and harness-update records, as chat messages)."""
    return [
        {"role": "system", "content": subagent_system_prompt(comm, tool_docs)},
        {"role": "user", "content": render_harness(harness)},
        *(dict(m) for m in memory),
    ]


def harness_update_text(old: Harness, new: Harness, note: str = "") -> str:
    """The communication observation a revised sub-agent finds in its memory: changed fields only."""
    parts = [f"Harness revised v{old.version}->v{new.version}."]
    if new.subgoal != old.subgoal:
        parts.append(f"Subgoal: {new.subgoal}")
    if new.context != old.context:
        parts.append("Context:" + "".join(f"\n- {c}" for c in new.context) if new.context else "Context: (none)")
    if new.tools != old.tools:
        parts.append(f"Tools: {', '.join(new.tools) or '(none)'}")
    if new.budget != old.budget:
        parts.append(f"Budget: {new.budget} steps")
    if note:
        parts.append(f"Note: {note}")
    return "\n".join(parts)


# ---- orchestrator side ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FeedbackView:
    """Which message signals the orchestrator sees (the communication-component ablation)."""

    status: bool = True
    request: bool = True
    evidence: bool = True


FULL_VIEW = FeedbackView()


def render_message(
    message: Message, view: FeedbackView = FULL_VIEW, max_evidence_chars: int | None = None
) -> list[str]:
    """The visible signals of ``message`` as lines."""
    lines = []
    if view.status and message.status is not None:
        lines.append(f"status: {message.status}")
    if view.request and message.request is not None:
        r = message.request
        lines.append(f"request: {r.target.value} {r.operation}" + (f": {r.detail}" if r.detail else ""))
    if view.evidence and message.evidence:
        lines.append("evidence:")
        lines += [f"> {_clip(e, max_evidence_chars)}" for e in message.evidence]
    return lines


def render_feedback(
    agent_id: int,
    event: str,
    *,
    message: Message | None = None,
    result: str | None = None,
    version: int | None = None,
    steps_used: int | None = None,
    budget: int | None = None,
    view: FeedbackView = FULL_VIEW,
    max_evidence_chars: int | None = None,
) -> str:
    """o^orch: what the orchestrator sees when sub-agent ``agent_id`` hands back control.

    ``event`` is the reason (submit, revise, stop, or an engine event such as "budget_exhausted").
    """
    head = f"[agent {agent_id}" + (f" v{version}" if version is not None else "") + f" {event}"
    if steps_used is not None and budget is not None:
        head += f" {steps_used}/{budget} steps"
    lines = [head + "]"]
    if result is not None:
        lines.append(f"result: {result}")
    if message is not None:
        lines += render_message(message, view, max_evidence_chars)
    return "\n".join(lines)


def comm_feedback(agent_id: int, action: Submit | ReviseRequest | StopRequest, **kwargs: Any) -> str:
    """``render_feedback`` for a sub-agent's communication action."""
    if isinstance(action, Submit):
        return render_feedback(agent_id, SUBMIT, message=action.message, result=action.result, **kwargs)
    event = REVISE if isinstance(action, ReviseRequest) else STOP
    return render_feedback(agent_id, event, message=action.message, **kwargs)


def orchestrator_system_prompt(
    tool_docs: Mapping[str, str] | Sequence[str] = (),
    *,
    revisable: Collection[str] = REVISABLE_FIELDS,
    max_agents: int | None = None,
    inline_actions: bool = True,
    actions: Collection[str] = ORCHESTRATOR_ACTIONS,
) -> str:
    """Orchestrator instructions. ``inline_actions`` lists the signatures of ``actions`` (the system's action set) in
    text (for small models and tool-less templates); turn it off when the backend passes ``orchestrator_tool_schemas``."""
    lines = ["Orchestrate sub-agents to solve the task. One <tool_call> per reply."]
    if inline_actions:
        rev = ", ".join(f"{f}?" for f in REVISABLE_FIELDS if f in revisable)
        signatures = {
            DELEGATE: "delegate(subgoal, context[], tools[], budget)",
            DELEGATE_ALL: "delegate_all(subtasks[{subgoal, context[], tools[], budget}]): the sub-agents run in "
            "parallel, each to its end; their results come back together",
            PLAN: "plan(subtasks[{subgoal, context[], tools[], budget}]): the sub-agents run in order, each given "
            "the results before it, with no call to you in between",
            REVISE: f"revise(agent_id, {rev + ', ' if rev else ''}note?): lists replace; budget is the new total",
            STOP: "stop(agent_id, reason?)",
            FINISH: "finish(answer)",
        }
        lines += [line for name, line in signatures.items() if name in actions]
    if max_agents is not None:
        lines.append(f"At most {max_agents} sub-agents.")
    if tool_docs:
        docs = tool_docs.items() if isinstance(tool_docs, Mapping) else ((t, "") for t in tool_docs)
        lines.append("Tools to grant: " + "; ".join(f"{k}: {v}" if v else k for k, v in docs))
    return "\n".join(lines)


def orchestrator_example(tool: str) -> str:
    """A worked exchange for the orchestrator's system message (few-shot): a delegation, the sub-agent's report as
    the orchestrator sees it, and the final answer, each in the exact markup the parser reads."""
    delegate = render_action(Delegate(Harness("Find the status of order 17.", (), (tool,), 3)))
    report = render_feedback(0, SUBMIT, message=Message(status="done"), result="order 17: shipped")
    finish = render_action(Finish("shipped"))
    return (
        f"Example.\nTask: Is order 17 shipped? Answer with its status.\nYou: {delegate}\nFeedback: {report}\n"
        f"You: {finish}"
    )


def subagent_example(tool: str, argument: str = "query") -> str:
    """A worked exchange for a sub-agent's system message (few-shot): a call of ``tool`` with its ``argument``, the
    output, the submission."""
    call = render_call({"name": tool, "arguments": {argument: "order 17"}})
    submit = render_action(Submit("order 17: shipped", Message(status="done", evidence=("order 17 status=shipped",))))
    return f"Example.\nYou: {call}\nObservation: order 17 status=shipped\nYou: {submit}"


def with_example(messages: Sequence[Mapping[str, Any]], example: str) -> list[dict[str, Any]]:
    """``messages`` with ``example`` appended to the first (system) message."""
    out = [dict(m) for m in messages]
    out[0]["content"] = f"{out[0]['content']}\n\n{example}"
    return out


def task_message(task: str) -> dict[str, str]:
    return {"role": "user", "content": f"Task: {task}"}


# ---- tool schemas for templates without tool support ------------------------------------------

TOOLS_PREAMBLE = (
    "You may call the tools below. Reply with exactly one call, written as\n"
    '<tool_call>\n{"name": <tool name>, "arguments": <JSON object>}\n</tool_call>'
)


def template_renders_tools(chat_template: str | None) -> bool:
    """Whether a Jinja chat template reads the ``tools`` variable. Qwen's and Llama 3's do; SmolLM2's ChatML
    template does not, and ``apply_chat_template`` (or a server) then drops the schemas without a word."""
    return bool(chat_template) and re.search(r"\btools\b", chat_template) is not None


def tools_in_system(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with the tool schemas (one JSON object a line, inside <tools>) and the call format appended to
    the system message, or in a new first system message when there is none."""
    block = TOOLS_PREAMBLE + "\n<tools>\n" + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools) + "\n</tools>"
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0]['content']}\n\n{block}"
    else:
        out.insert(0, {"role": "system", "content": block})
    return out


def chat_inputs(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None, *, template_tools: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The (messages, tools) to render: unchanged for a template that renders tools; otherwise the schemas move
    into the system message and no ``tools`` are passed, so the model sees them either way."""
    if not tools:
        return [dict(m) for m in messages], None
    if template_tools:
        return [dict(m) for m in messages], [dict(t) for t in tools]
    return tools_in_system(messages, tools), None


def prompt_ids(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    **template_kwargs: Any,
) -> list[int]:
    """The prompt's token ids through ``tokenizer``'s chat template, ending with the assistant generation prompt;
    tool schemas go where the template can show them (``chat_inputs``). Every place that renders a context
    (the embedded backend, the sampler, training rows) calls this, so training sees the prompt the model saw."""
    messages, tools = chat_inputs(
        messages, tools, template_tools=template_renders_tools(getattr(tokenizer, "chat_template", None))
    )
    encoded = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True, **template_kwargs
    )
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded  # a BatchEncoding in transformers 5
    return [int(t) for t in ids]
