"""The generative reward model (GRM) of OPOD: the I_GRM prompt, its reply format, the teacher context.

Whenever a sub-agent's feedback o_t comes back, a frozen model judges under a fixed instruction
whether the issue it reveals is attributable to the orchestration decision a_t (FLAG) and, if so,
writes a natural-language gradient H_t: what the decision should have done instead. The prompt
holds exactly the paper's inputs: the orchestration state (the context the orchestrator saw), the
decision, the sub-agent segment between the decision and the feedback, and the feedback.

The self-teacher sees s_t ⊕ H_t: the same context with the hint appended as one more user turn
(``teacher_context``); the student keeps s_t. Any reply that is not exactly one FLAG and, when
FLAG is true, a non-empty HINT raises ``GRMReplyError``: a malformed judgement is recorded as an
error, never read as "not attributable".
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from porch_jax.backends import ChatRequest, Sampling
from porch_jax.protocol import strip_thinking
from porch_jax.trajectories import DecisionRecord, SubStep

GRM_INSTRUCTION = """\
You judge one orchestration decision of a multi-agent system. You see the orchestration state \
(the context the orchestrator saw), its decision (an action: delegate, revise, stop or finish), \
what the sub-agent did afterwards, and the feedback that came back.
Decide whether the feedback gives sufficient evidence that the problem it reveals was caused by \
this decision's harness (subgoal, context, tools or budget), using only information that was \
available when the decision was made. A change of requirements that arrived later, an unrelated \
notification, or a sub-agent's own slip is not attributable.
Reply with exactly two lines:
FLAG: true or false
HINT: when true, the correction in one short sentence (e.g. "add archive to tools", \
"add 'phone of Ana Kaya: +1-555-0123' to context", "set budget to 7", "set subgoal to '...'"); \
when false, leave it empty."""

HINT_PREFIX = "Hint: "
_NONE_HINTS = {"", "none", "n/a", "-", "empty"}


class GRMReplyError(ValueError):
    """A GRM reply that is not a valid judgement; ``kind`` names what is wrong."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


@dataclass(frozen=True)
class Attribution:
    """FLAG_t (``attributable``) and H_t (``hint``, empty unless attributable)."""

    attributable: bool
    hint: str = ""

    def __post_init__(self) -> None:
        if self.attributable and not self.hint.strip():
            raise ValueError("an attributable decision needs a hint")
        if not self.attributable and self.hint:
            raise ValueError("a decision that is not attributable has no hint")


@dataclass(frozen=True)
class AttributionUnit:
    """One attribution unit: what I_GRM shows about decision t, from the trajectory only."""

    context: tuple[Mapping[str, Any], ...]
    action_text: str
    segment: tuple[SubStep, ...]
    feedback: str

    @classmethod
    def of(cls, decision: DecisionRecord) -> AttributionUnit:
        return cls(tuple(decision.context), decision.action_text, tuple(decision.segment), decision.feedback)


# ---- the prompt ---------------------------------------------------------------------------------


def render_state(context: Sequence[Mapping[str, Any]]) -> str:
    """The orchestrator's chat context as tagged turns."""
    return "\n".join(f"[{m.get('role', '?')}] {m.get('content') or ''}" for m in context)


def render_segment(segment: Sequence[SubStep]) -> str:
    """<h_k, a_k, o_k>: each sub-agent step as its action (or notification) and what came back."""
    if not segment:
        return "(no sub-agent steps)"
    lines = []
    for k, s in enumerate(segment, 1):
        head = f"{k}. agent {s.agent_id} v{s.harness_version} {s.kind}"
        lines.append(f"{head}: {' '.join(s.text.split())}")
        if s.observation:
            lines.append(f"   -> {' '.join(s.observation.split())}")
    return "\n".join(lines)


def grm_messages(unit: AttributionUnit) -> list[dict[str, str]]:
    """I_GRM(s_t, a_t, segment, o_t) as chat messages."""
    body = (
        f"## Orchestration state\n{render_state(unit.context)}\n\n"
        f"## Decision\n{unit.action_text.strip() or '(empty reply)'}\n\n"
        f"## Sub-agent execution after the decision\n{render_segment(unit.segment)}\n\n"
        f"## Feedback\n{unit.feedback.strip() or '(none)'}"
    )
    return [{"role": "system", "content": GRM_INSTRUCTION}, {"role": "user", "content": body}]


def grm_request(unit: AttributionUnit, sampling: Sampling = Sampling(max_tokens=128)) -> ChatRequest:
    """The chat request for any backend; ``state`` carries the unit for scripted judges."""
    return ChatRequest(grm_messages(unit), None, sampling, role="grm", state=unit)


# ---- the reply ------------------------------------------------------------------------------------

_FIELD = re.compile(r"^\s*\**\s*(FLAG|HINT)\s*\**\s*[:=]\s*(.*)$", re.IGNORECASE)


def format_reply(attribution: Attribution) -> str:
    """The reply text for ``attribution`` (what a scripted judge answers)."""
    return f"FLAG: {'true' if attribution.attributable else 'false'}\nHINT: {attribution.hint}"


def parse_reply(text: str) -> Attribution:
    """FLAG and HINT from a reply. The hint runs from ``HINT:`` to the end of the reply.

    Raises ``GRMReplyError`` (kinds: no_flag, duplicate_flag, bad_flag, duplicate_hint,
    missing_hint, unexpected_hint) for anything else.
    """
    if not isinstance(text, str):
        raise GRMReplyError("bad_reply", f"expected text, got {type(text).__name__}")
    lines = strip_thinking(text).strip().splitlines()
    flags, hints = [], []
    for i, line in enumerate(lines):
        m = _FIELD.match(line)
        if m:
            (flags if m[1].upper() == "FLAG" else hints).append((i, m[2].strip()))
    if not flags:
        raise GRMReplyError("no_flag", f"no 'FLAG:' line in {text[:80]!r}")
    if len(flags) > 1:
        raise GRMReplyError("duplicate_flag", f"{len(flags)} FLAG lines")
    if len(hints) > 1:
        raise GRMReplyError("duplicate_hint", f"{len(hints)} HINT lines")
    value = flags[0][1].strip("*`'\". ").lower()
    if value not in ("true", "false"):
        raise GRMReplyError("bad_flag", f"FLAG must be true or false, got {flags[0][1][:40]!r}")
    hint = ""
    if hints:
        i, first = hints[0]
        hint = "\n".join([first, *lines[i + 1 :]]).strip() if i > flags[0][0] else first
    if value == "true":
        if hint.lower() in _NONE_HINTS:
            raise GRMReplyError("missing_hint", "FLAG is true but the hint is empty")
        return Attribution(True, hint)
    if hint.lower().strip(".") not in _NONE_HINTS:
        raise GRMReplyError("unexpected_hint", f"FLAG is false but a hint was given: {hint[:60]!r}")
    return Attribution(False)


# ---- the self-teacher's context ---------------------------------------------------------------------


def hint_message(hint: str) -> dict[str, str]:
    return {"role": "user", "content": (HINT_PREFIX + hint.strip()).strip()}


def teacher_context(context: Sequence[Mapping[str, Any]], hint: str) -> list[dict[str, Any]]:
    """s ⊕ H: the stored decision context followed by the hint as one more user turn (an empty
    hint still adds the turn: the empty-hint control differs from the student only by it)."""
    return [dict(m) for m in context] + [hint_message(hint)]
