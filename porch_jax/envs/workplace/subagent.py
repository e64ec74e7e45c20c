"""Scripted sub-agents for the workplace suite, speaking the proactive protocol through text.

One policy, three settings read from the view: proactive (submit/revise/stop available: when
blocked or when a notification changes its goal it pauses with status, request and evidence),
lifecycle (submit only: it keeps to its harness, notes what it saw, and when blocked either keeps
trying to its budget end or submits what it has) and solo (ReAct: the agent owns the whole task and
acts on notifications itself). Its mistakes are the ones the protocol's signals exist for:
- it sometimes reads an unrelated notification as a change to its own goal (a wrong request the
  orchestrator can reject only if it sees the evidence);
- it sometimes asks for a tool to look a missing fact up itself instead of for the fact;
- it slips (a malformed action, or a wrong argument in a write or a computation) at a rate that grows with the
  number of tools it holds and the length of its history, the usual degradation of long-context
  single agents that makes delegation worth its overhead.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from porch_jax.envs.base import MemoryItem, SubagentView
from porch_jax.envs.workplace.clauses import (
    Blocked,
    Call,
    Clause,
    Done,
    ToolObs,
    parse_clause,
    parse_facts,
    parse_subgoal,
    step,
)
from porch_jax.protocol import (
    REVISE,
    Message,
    Request,
    RequestTarget,
    ReviseRequest,
    StopRequest,
    Submit,
    ToolCall,
    render_action,
)


@dataclass(frozen=True)
class SubagentConfig:
    p_misread: float = 0.3  # takes an unrelated notification for a change to its own goal (no history)
    p_detour: float = 0.3  # asks for a lookup tool instead of the missing fact
    p_persist: float = 0.5  # lifecycle: keeps retrying a blocked path to its budget end
    slip_base: float = 0.01  # slip probability per step with one tool and no history
    slip_tools: float = 0.5  # relative growth per extra tool held
    slip_history: float = 0.2  # relative growth per tool output in its history
    max_asks: int = 2  # identical requests before it gives up with a stop request


_FORMS = {
    "seats": re.compile(r"(?P<who>[^:]+): we are (?P<seats>\d+) for (?P<event>.+) now"),
    "venue": re.compile(r"(?P<who>[^:]+): (?P<event>.+) moved to (?P<place>.+) at (?P<time>\d\d:\d\d)"),
    "phone": re.compile(r"(?P<who>[^:]+): my new number is (?P<phone>\S+)"),
    "item": re.compile(r"(?P<who>[^:]+): in (?P<file>\S+) find the (?P<item>.+) instead"),
}
_LOOKUP = {"venue of ": ("find venue of ", "calendar"), "phone of ": ("find phone of ", "contacts")}
NO_RESULT = "(nothing)"  # the result of a submit that found no fact (a lifecycle sub-agent's partial return)


@dataclass(frozen=True)
class Change:
    """A notification read as a change to this agent's goal: new clauses or an updated fact."""

    notice: str
    index: int  # of the clause it changes
    clause: str | None = None
    fact: tuple[str, str] | None = None


def read_notice(text: str, clauses: list[Clause], misread: bool) -> Change | None:
    """The change ``text`` makes to these clauses; an unrelated notice counts only when ``misread``."""
    for form, pattern in _FORMS.items():  # noqa: B007 (form is read after the break)
        m = pattern.fullmatch(text)
        if m:
            break
    else:
        return None
    g = m.groupdict()
    for i, c in enumerate(clauses):
        if form in ("seats", "venue") and c.kind in ("cab", "venue"):
            if not ((g["who"] == "User" and g["event"] == c.args["event"]) or misread):
                continue
            event = c.args["event"]
            if form == "venue":
                return Change(text, i, fact=(f"venue of {event}", f"{g['place']} at {g['time']}"))
            if c.kind == "cab":
                return Change(text, i, clause=f"book cab to {event} for {g['seats']}")
        if form == "phone" and c.kind == "text":
            person = c.args["person"]
            if g["who"] == person or (misread and g["who"].split()[0] == person.split()[0]):
                return Change(text, i, fact=(f"phone of {person}", g["phone"]))
        if form == "item" and c.kind == "file" and g["who"] == "User" and g["file"] == c.args["file"]:
            return Change(text, i, clause=f"find {g['item']} in file {c.args['file']} ({c.args['pages']} pages)")
    return None


def apply_change(texts: list[str], index: int, clause: str) -> list[str]:
    """Clause texts with clause ``index`` replaced; a new file item also renames what is texted."""
    old, new = parse_clause(texts[index]), parse_clause(clause)
    out = list(texts)
    out[index] = clause
    if old is not None and new is not None and old.kind == new.kind == "file":
        out = [
            t.replace(f" the {old.args['item']}", f" the {new.args['item']}") if i != index else t
            for i, t in enumerate(out)
        ]
    return out


def _lookup_clause(key: str, tools: set[str]) -> Clause | None:
    """The clause that finds fact ``key`` with a tool the agent holds, if there is one."""
    for prefix, (verb, tool) in _LOOKUP.items():
        if key.startswith(prefix) and tool in tools:
            return parse_clause(verb + key[len(prefix) :])
    return None


def _active_bookings(obs: list[ToolObs]) -> list[str]:
    booked = [m[1] for o in obs if (m := re.match(r"booked (R\d+): (.+)", o.text))]
    cancelled = {m[1] for o in obs if (m := re.fullmatch(r"cancelled (R\d+)", o.text))}
    return [r for r in booked if r not in cancelled]


def _booking_note(obs: list[ToolObs]) -> str:
    refs = _active_bookings(obs)
    details = [
        o.text.split("booked ", 1)[1]
        for o in obs
        if o.text.startswith("booked ") and o.text.split()[1].rstrip(":") in refs
    ]
    return f"; done: booked {'; '.join(details)}" if details else ""


class ScriptedSubagent:
    """A backend policy: ``ScriptedBackend(ScriptedSubagent())``; reads ``request.state`` (SubagentView)."""

    def __init__(self, config: SubagentConfig = SubagentConfig()):
        self.cfg = config

    def __call__(self, request: Any) -> str:
        return self.act(request.state)

    # ---- the decision ----------------------------------------------------------------------------
    def act(self, view: SubagentView) -> str:
        h, cfg = view.harness, self.cfg
        proactive = REVISE in view.comm
        steps_left = h.budget - view.steps_used
        clauses = parse_subgoal(h.subgoal)
        obs = [ToolObs(m.name, m.args, m.text) for m in view.memory if m.kind == "call"]
        if clauses is None:
            msg = Message(
                "blocked: subgoal outside what I can do",
                Request(RequestTarget.TASK, "clarify", "restate it as one task clause"),
                (f"subgoal: {h.subgoal}",),
            )
            return render_action(ReviseRequest(msg) if proactive else Submit("(none)", msg))
        facts = parse_facts(h.context)
        changes = self._changes(view, clauses)
        if proactive:
            for idx, ch in changes:
                if not any(m.kind == "comm" for m in view.memory[idx + 1 :]):
                    return render_action(ReviseRequest(self._change_message(ch, clauses, obs)))
        if view.solo:
            clauses, facts = self._apply(changes, clauses, facts, view.memory)
        kind, s, left, products = self._plan(clauses, facts, obs, set(h.tools))
        notes = [ch.notice for _, ch in changes] if not proactive and not view.solo else []
        if kind == "done":
            status = "done" + "".join(f"; note: {n}" for n in notes)
            evidence = tuple(e for _, _, e in products[-1:]) + tuple(notes)
            return render_action(Submit(self._result(products), Message(status, None, evidence)))
        if kind == "blocked":
            assert isinstance(s, Blocked)
            request = self._request(s, view, set(h.tools))
            if proactive:
                if self._asked(view.memory, request) >= cfg.max_asks:
                    return render_action(StopRequest(Message(f"cannot proceed: {s.why}", None, s.evidence)))
                status = f"{s.why}; step {view.steps_used + 1}/{h.budget}"
                return render_action(ReviseRequest(Message(status, request, s.evidence)))
            rng = random.Random(f"persist:{view.seed}:{view.agent_id}")
            if steps_left > 1 and rng.random() < cfg.p_persist and obs:
                last = obs[-1]
                return render_action(ToolCall(last.name, dict(last.args)))
            return render_action(self._partial(s.why, products, request, s.evidence, notes))
        assert isinstance(s, Call)
        if left + 1 > steps_left:
            need = view.steps_used + 1 + left + 1 - h.budget
            request = Request(RequestTarget.BUDGET, "add", f"+{need}")
            if proactive and self._asked(view.memory, request) < cfg.max_asks:
                status = f"budget: {left} tool steps of work left, {steps_left} steps left"
                evidence = (obs[-1].text,) if obs else (f"subgoal: {h.subgoal}",)
                return render_action(ReviseRequest(Message(status, request, evidence)))
            if steps_left <= 1:
                why = f"budget ran out with {left} tool steps of work left"
                return render_action(self._partial(why, products, request, (), notes))
        return self._call(view, s, facts, obs)

    # ---- pieces ----------------------------------------------------------------------------------
    def _changes(self, view: SubagentView, clauses: list[Clause]) -> list[tuple[int, Change]]:
        out, seen = [], 0
        for i, m in enumerate(view.memory):
            seen += m.kind == "call"
            if m.kind == "notification":  # a longer history makes a misreading likelier, as for slips
                p = self.cfg.p_misread * (1 + self.cfg.slip_history * seen)
                misread = random.Random(f"misread:{view.seed}:{m.text}").random() < p
                ch = read_notice(m.text, clauses, misread)
                if ch is not None:
                    out.append((i, ch))
        return out

    @staticmethod
    def _change_message(ch: Change, clauses: list[Clause], obs: list[ToolObs]) -> Message:
        status = f"user change: {ch.notice}{_booking_note(obs)}"
        if ch.clause is not None:
            new = [c.text for c in clauses]
            new[ch.index] = ch.clause
            return Message(status, Request(RequestTarget.TASK, "update", "; ".join(new)), (ch.notice,))
        key, value = ch.fact  # type: ignore[misc]
        return Message(status, Request(RequestTarget.CONTEXT, "update", f"{key}: {value}"), (ch.notice,))

    @staticmethod
    def _apply(
        changes: list[tuple[int, Change]], clauses: list[Clause], facts: dict[str, str], memory: tuple[MemoryItem, ...]
    ) -> tuple[list[Clause], dict[str, str]]:
        """ReAct acts on notifications itself, cancelling bookings made before a change to the ride."""
        texts, facts = [c.text for c in clauses], dict(facts)
        for at, ch in changes:
            if ch.clause is not None:
                texts = apply_change(texts, ch.index, ch.clause)
            if ch.fact is not None:
                facts[ch.fact[0]] = ch.fact[1]
            rides = [
                i
                for i, t in enumerate(texts)
                if t.startswith("book cab to ")
                and (i == ch.index or (ch.fact and ch.fact[0] == f"venue of {t[12:].split(' for ')[0]}"))
            ]
            before = [ToolObs(m.name, m.args, m.text) for m in memory[:at] if m.kind == "call"]
            for i in rides[:1]:
                texts[i:i] = [f"cancel cab {r}" for r in _active_bookings(before) if f"cancel cab {r}" not in texts]
        return [parse_clause(t) for t in texts], facts  # type: ignore[misc]

    @staticmethod
    def _plan(
        clauses: list[Clause], facts: dict[str, str], obs: list[ToolObs], tools: set[str]
    ) -> tuple[str, Call | Blocked | None, int, list[tuple[str, str, str]]]:
        """(kind, step, tool calls left in total, products so far) for the first unfinished clause."""
        facts, products, first, left = dict(facts), [], None, 0
        for clause in clauses:
            s = step(clause, facts, obs)
            if isinstance(s, Blocked) and s.need == "context":
                lookup = _lookup_clause(s.detail, tools)
                if lookup is not None:  # look the fact up itself: local observations accumulate
                    sub = step(lookup, facts, obs)
                    if isinstance(sub, Done):
                        facts[sub.key] = sub.value
                        s = step(clause, facts, obs)
                    elif isinstance(sub, Call):
                        s = Call(sub.name, sub.args, sub.left + s.left, sub.critical)
            if isinstance(s, Done):
                facts.setdefault(s.key, s.value)  # a fact given (or changed by the user) outranks an old lookup
                if first is None:
                    products.append((s.key, s.value, s.evidence))
                continue
            if isinstance(s, Call) and s.name not in tools:
                evidence = (obs[-1].text,) if obs else (f"my tools: {', '.join(sorted(tools)) or 'none'}",)
                s = Blocked("tools", s.name, f"blocked: no tool for the next step of '{clause.text}'", evidence, s.left)
            first = first or s
            left += s.left
        if first is None:
            return "done", None, 0, products
        return ("blocked" if isinstance(first, Blocked) else "call"), first, left, products

    def _request(self, s: Blocked, view: SubagentView, tools: set[str]) -> Request:
        if s.need == "tools":
            return Request(RequestTarget.TOOLS, "add", s.detail)
        if s.need == "task":
            return Request(RequestTarget.TASK, "clarify", s.detail)
        lookup = next((t for p, (_, t) in _LOOKUP.items() if s.detail.startswith(p)), None)
        detour = random.Random(f"detour:{view.seed}:{s.detail}").random() < self.cfg.p_detour
        if lookup and lookup not in tools and detour:
            return Request(RequestTarget.TOOLS, "add", lookup)
        return Request(RequestTarget.CONTEXT, "add", s.detail)

    @staticmethod
    def _asked(memory: tuple[MemoryItem, ...], request: Request) -> int:
        return sum(m.kind == "comm" and m.message is not None and m.message.request == request for m in memory)

    @staticmethod
    def _result(products: list[tuple[str, str, str]]) -> str:
        return "\n".join(f"{k}: {v}" for k, v, _ in products) or NO_RESULT

    def _partial(
        self,
        why: str,
        products: list[tuple[str, str, str]],
        request: Request,
        evidence: tuple[str, ...],
        notes: list[str],
    ) -> Submit:
        status = f"partial: {why}" + "".join(f"; note: {n}" for n in notes)
        return Submit(self._result(products), Message(status, request, evidence + tuple(notes)))

    def _call(self, view: SubagentView, s: Call, facts: dict[str, str], obs: list[ToolObs]) -> str:
        cfg = self.cfg
        rng = random.Random(f"slip:{view.seed}:{view.agent_id}:{view.steps_used}")
        p = cfg.slip_base * (1 + cfg.slip_tools * (len(view.harness.tools) - 1)) * (1 + cfg.slip_history * len(obs))
        if rng.random() >= p:
            return render_action(ToolCall(s.name, s.args))
        args = dict(s.args)
        if s.critical and args.get("op") == "book":
            args["seats"] = args["seats"] + 1 if args["seats"] < 6 else args["seats"] - 1
        elif s.critical and args.get("op") == "send":
            key = args["text"].split(": ", 1)[0]
            args["text"] = f"{key}: {rng.randint(1000, 9999)}"
        elif s.critical and s.name == "code":
            a, _, b = args["expr"].partition(" - ")
            args["expr"] = f"{b} - {a}"
        else:
            return f'<tool_call>{{"name": "{s.name}", "arguments": {{"op": '  # a malformed action
        return render_action(ToolCall(s.name, args))
