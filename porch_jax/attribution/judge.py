"""A scripted attribution judge for the synthetic workplace suite, and the hint follower.

``ScriptedJudge`` answers I_GRM requests like an LLM judge would, through the same backend
interface (``ScriptedBackend(ScriptedJudge())``), but by rule: it compares the decision's harness
with what the evidence in the feedback shows was needed. It reads only the attribution unit (the
context the orchestrator saw, the decision, the sub-agent segment, the feedback), never the task's
answer key. A request is attributable when the evidence supports it and the fix was knowable at
decision time: a missing fact that an earlier result had already shown, a tool the subgoal's
clause needs (archive when a page shows no figure for the asked year), a budget below the work
the sub-agent reports, a subgoal shortened from the task's clause. A user's change of
requirements, an unsupported request or a shortfall explained by the sub-agent's own slips is not.

Hints are short structured corrections ("add archive to tools", "add 'k: v' to context", "set
budget to 7", "set subgoal to '...'"). ``follow_hint`` applies one to an action: the pipeline uses
it to build the hint-following SFT examples a tiny model needs before it can serve as OPD's
self-teacher (a capable base model follows hints without them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from porch_jax.attribution.grm import Attribution, AttributionUnit, format_reply
from porch_jax.envs.workplace.clauses import KIND, parse_facts, parse_subgoal
from porch_jax.protocol import DELEGATE, REVISE, ProtocolError, extract_call

NOT_ATTRIBUTABLE = Attribution(False)
_HEAD = re.compile(r"\[agent (\d+) v(\d+) (\w+)(?: (\d+)/(\d+) steps)?\]")
_REQUEST = re.compile(r"request: (\w+) (\w+)(?:: (.*))?")
_RESULT_END = re.compile(r"\n(?:status|request|evidence): |\n\[agent ")  # a joined feedback's next agent too
_TASK = re.compile(r"Task: (.*?)(?: \(budget \d+ steps.*\))?$", re.DOTALL)


class ScriptedJudge:
    """A backend policy: ``ScriptedBackend(ScriptedJudge())``; reads ``request.state`` (AttributionUnit)."""

    def __call__(self, request: Any) -> str:
        return format_reply(judge(request.state))


def judge(unit: AttributionUnit) -> Attribution:
    """FLAG and hint for one attribution unit (see the module docstring for the rules)."""
    try:
        call = extract_call(unit.action_text)
    except ProtocolError:
        return NOT_ATTRIBUTABLE
    if call["name"] not in (DELEGATE, REVISE):
        return NOT_ATTRIBUTABLE
    lines = unit.feedback.split("\n")
    head = _HEAD.match(lines[0]) if lines else None
    req = next((m for line in lines if (m := _REQUEST.fullmatch(line))), None)
    status = next((line[len("status: ") :] for line in lines if line.startswith("status: ")), "")
    if head is None or req is None or status.startswith("user change") or head[3] not in ("revise", "submit"):
        return NOT_ATTRIBUTABLE
    target, detail = req[1], req[3] or ""
    evidence = [line[2:] for line in lines if line.startswith("> ")]
    facts = known_facts(unit.context)
    if target == "context" or (target == "tools" and _lacks(evidence)):
        key = detail if target == "context" else _lacks(evidence)
        return _hint(f"add '{key}: {facts[key]}' to context") if key in facts else NOT_ATTRIBUTABLE
    if target == "tools":
        return _tool_hint(detail, call, status, evidence)
    if target == "budget":
        return _budget_hint(detail, head, unit)
    if target == "task" and req[2] == "clarify":
        return _subgoal_hint(call, unit.context)
    return NOT_ATTRIBUTABLE


def _hint(text: str) -> Attribution:
    return Attribution(True, text)


def _lacks(evidence: Sequence[str]) -> str | None:
    """The fact a sub-agent's evidence says its context lacks (a detour request for a tool)."""
    return next((m[1] for e in evidence if (m := re.search(r"context lacks '(.+?)'", e))), None)


def known_facts(context: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Facts the orchestrator had seen: the ``key: value`` lines of every earlier result (each agent's, in a joined
    feedback)."""
    facts: dict[str, str] = {}
    for m in context:
        text = str(m.get("content") or "")
        if m.get("role") == "user" and "\nresult: " in text:
            for part in text.split("\nresult: ")[1:]:
                facts.update(parse_facts([_RESULT_END.split(part, 1)[0]]))
    return facts


def _tool_hint(tool: str, call: Mapping[str, Any], status: str, evidence: Sequence[str]) -> Attribution:
    if tool == "archive" and any(re.search(r"no \d{4} figure on the current page", e) for e in evidence):
        return _hint("add archive to tools")
    clause = re.search(r"next step of '(.+?)'", status)
    subgoal = clause[1] if clause else str(call["arguments"].get("subgoal", ""))
    clauses = parse_subgoal(subgoal) or []
    needed = {t for c in clauses for t in KIND[c.kind].tools}
    return _hint(f"add {tool} to tools") if tool in needed else NOT_ATTRIBUTABLE


def _budget_hint(detail: str, head: re.Match[str], unit: AttributionUnit) -> Attribution:
    """Attributable when even a slip-free run could not fit: tool steps done + work left + submit > budget."""
    extra = re.fullmatch(r"\+(\d+)", detail.strip())
    left = re.search(r"budget: (\d+) tool steps of work left", unit.feedback)
    if extra is None or left is None or head[5] is None:
        return NOT_ATTRIBUTABLE
    budget = int(head[5])
    agent, version = int(head[1]), int(head[2])
    done = sum(s.kind == "tool" and s.agent_id == agent and s.harness_version == version for s in unit.segment)
    earlier = _steps_before(unit, agent, version)
    if earlier + done + int(left[1]) + 1 <= budget:
        return NOT_ATTRIBUTABLE
    return _hint(f"set budget to {budget + int(extra[1])}")


def _steps_before(unit: AttributionUnit, agent: int, version: int) -> int:
    """Productive tool steps this agent took under earlier harness versions (a revised agent keeps its history).

    The engine's feedback reports steps used so far; what is not in this segment happened before it.
    """
    head = _HEAD.match(unit.feedback.split("\n")[0])
    used = int(head[4]) if head and head[4] else 0
    in_segment = sum(s.agent_id == agent for s in unit.segment if s.kind != "notification")
    return max(0, used - in_segment)


def _subgoal_hint(call: Mapping[str, Any], context: Sequence[Mapping[str, Any]]) -> Attribution:
    """A subgoal that shortened the task's clause (dropped a surname, a seat count, a sender)."""
    subgoal = str(call["arguments"].get("subgoal", "")).strip()
    task = next((str(m.get("content")) for m in context if str(m.get("content", "")).startswith("Task: ")), "")
    m = _TASK.match(task)
    if not subgoal or m is None:
        return NOT_ATTRIBUTABLE
    clauses = [c.strip() for c in re.split(r"(?:^|\s)\d+\)\s", m[1]) if c.strip()]
    longer = [c for c in clauses if c.startswith(subgoal + " ")]
    return _hint(f"set subgoal to '{longer[0]}'") if len(longer) == 1 else NOT_ATTRIBUTABLE


# ---- following a hint -------------------------------------------------------------------------------

_HINTS = (
    (re.compile(r"add (\w+) to tools"), "tools"),
    (re.compile(r"add '(.+?): (.+)' to context"), "context"),
    (re.compile(r"set budget to (\d+)"), "budget"),
    (re.compile(r"set subgoal to '(.+)'"), "subgoal"),
)


def follow_hint(call: Mapping[str, Any], hint: str) -> dict[str, Any] | None:
    """The action ``call`` corrected as ``hint`` says, in the expert's conventions (sorted tools,
    context sorted by key); None when the hint does not apply to it (a revise that does not set
    the field a hint adds to, an action that is not a delegate or revise, an unknown hint)."""
    if call.get("name") not in (DELEGATE, REVISE):
        return None
    args = dict(call.get("arguments", {}))
    for pattern, field in _HINTS:
        m = pattern.fullmatch(hint.strip())
        if m is None:
            continue
        if field == "budget":
            args["budget"] = int(m[1])
        elif field == "subgoal":
            args["subgoal"] = m[1]
        elif field not in args:
            return None
        elif field == "tools":
            args["tools"] = sorted(set(args["tools"]) | {m[1]})
        else:
            lines = {line.split(": ", 1)[0]: line for line in args["context"]}
            lines[m[1]] = f"{m[1]}: {m[2]}"
            args["context"] = [lines[k] for k in sorted(lines)]
        return {"name": call["name"], "arguments": args}
    return None
