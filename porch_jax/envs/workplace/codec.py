"""A compact action-and-state language for the workplace suite: the "dsl" policy view.

Why: a ~1M-parameter orchestrator trained for minutes cannot copy free text (names, values found
two delegations earlier) through Hermes JSON in 500-token contexts. In this view it reads a short
structured state and writes a short action, and pointers replace copying:

    task:      c1 history c2 web c3 compute steps 10      (a clause: its kind; a file: its pages)
    feedback:  a0 revise 3/5 req tools+archive todo=c1,c2,c3
               a0 submit 5/6 r1 todo=c2,c3                (r1: the first result shown so far)
               a2 revise 1/2 req ctx+r1 todo=c3           (todo: clauses without a submitted result)
    action:    delegate c3 ctx=r1,r2 tools=code budget=3  |  revise a2 ctx=r1,r2 budget=4
               stop a1  |  finish r3  |  finish done
               delegate_all c1 tools=search budget=3 ; c2 tools=mail budget=4    (Orchestra-o1)
               plan c1 tools=search budget=3 ; c2 tools=mail budget=4            (Skill-MAS, MAS²)
    joined:    a0 submit 3/4 r1 ; a1 submit 2/2 req budget+2 todo=c2,c3
    hint:      hint tools+archive | hint ctx+r1 | hint budget=7

The baselines' joined delegations (``delegate_all``, ``plan``: rollout/config.py) write their subtasks as
delegations without the verb, separated by " ; ", in the protocol's order; their joined feedback is each
sub-agent's report in the same form, in the same order, joined by " ; ", and each sub-agent is tracked to the
clause its subtask named. A submit without a result ("(nothing)", a lifecycle sub-agent's partial return) shows no
result ref and leaves its clause to do. The tokenizer's corpus (``corpus``) has no lines of the joined forms: one
tokenizer serves every framework an experiment trains, and POrchestra's is the same with or without them (their
words, e.g. "delegate_all", take a few tokens each).

``decode_action`` turns an action into the protocol's full tool call against the stored context
(c2 -> the clause's text, r1 -> the result line "key: value"), so the engine parses, executes and
records the full action as for any backend; an action that does not decode stays as it was written
and the engine records it as an invalid action. ``encode_action`` is the inverse for stored
actions (expert demonstrations, past turns of a context), canonical (sorted tools and refs). Lossy
cases, all rare: a subgoal that is no clause's text maps to the first clause of the same kind; a
context line no result showed is dropped; an answer no result showed becomes ``finish done``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from porch_jax.envs.workplace.clauses import parse_clause, parse_subgoal
from porch_jax.envs.workplace.subagent import NO_RESULT
from porch_jax.protocol import render_call
from porch_jax.protocol.parse import extract_call

HINT_PREFIX = "Hint:"
JOINED = ("delegate_all", "plan")  # the protocol's joined delegations (Orchestra-o1; Skill-MAS, MAS²)
SUBTASK_SEP = " ; "
_TASK = re.compile(r"Task: (.*?)(?: \(budget (\d+) steps.*\))?$", re.DOTALL)
_HEAD = re.compile(r"\[agent (\d+)(?: v\d+)? (\w+)(?: (\d+)/(\d+) steps)?\]")
_REQUEST = re.compile(r"request: (\w+) (\w+)(?:: (.*))?")
_HINTS = (
    (re.compile(r"add (\w+) to tools"), "tools"),
    (re.compile(r"add '(.+)' to context"), "ctx"),
    (re.compile(r"set budget to (\d+)"), "budget"),
    (re.compile(r"set subgoal to '(.+)'"), "sub"),
)
_TARGET = {"tools": "tools", "context": "ctx", "budget": "budget", "subgoal": "sub"}


class CodecError(ValueError):
    """An action in the compact language that names no valid clause, result or field."""


class State:
    """What the pointers point to at one point of a context: the task's clauses and the results so far."""

    def __init__(self) -> None:
        self.clauses: list[str] = []
        self.results: list[str] = []
        self.agents: dict[int, int] = {}  # agent id -> index of the clause it works on
        self.done: set[int] = set()  # clauses whose agent submitted a result
        self.pending: list[int] = []  # the clauses of the last delegation(s), in order, until their agents report

    def todo(self) -> str:
        """The clauses without a submitted result: the progress a finish decision reads."""
        return ",".join(f"c{i + 1}" for i in range(len(self.clauses)) if i not in self.done) or "-"

    def clause_ref(self, subgoal: str) -> str | None:
        if subgoal in self.clauses:
            return f"c{self.clauses.index(subgoal) + 1}"
        parsed, kinds = parse_subgoal(subgoal), [parse_clause(c) for c in self.clauses]
        if parsed and len(parsed) == 1:
            for i, k in enumerate(kinds):
                if k is not None and k.kind == parsed[0].kind:
                    return f"c{i + 1}"
        return None

    def result_ref(self, line: str) -> str | None:
        line = line.strip()
        for i in range(len(self.results) - 1, -1, -1):  # the newest result with this line
            if self.results[i] == line:
                return f"r{i + 1}"
        return None

    def key_ref(self, key: str) -> str | None:
        for i in range(len(self.results) - 1, -1, -1):
            if self.results[i].split(": ", 1)[0] == key.strip():
                return f"r{i + 1}"
        return None

    def resolve(self, ref: str, prefix: str, table: Sequence[str]) -> str:
        m = re.fullmatch(prefix + r"(\d+)", ref)
        if not m or not 1 <= int(m[1]) <= len(table):
            raise CodecError(
                f"{ref!r} names no {'clause' if prefix == 'c' else 'result'} (have {prefix}1..{prefix}{len(table)})"
            )
        return table[int(m[1]) - 1]


# ---- state ------------------------------------------------------------------------------------------


def _clause_word(text: str) -> str:
    c = parse_clause(text)
    if c is None:
        return "other"
    return f"{c.kind} p{c.args['pages']}" if c.kind == "file" else c.kind


def encode_task(content: str, state: State) -> str:
    m = _TASK.fullmatch(content.strip())
    clauses = parse_subgoal(m[1]) if m else None
    if not clauses:
        return content
    state.clauses = [c.text for c in clauses]
    words = " ".join(f"c{i + 1} {_clause_word(c.text)}" for i, c in enumerate(clauses))
    return f"{words} steps {m[2]}" if m[2] else words


def encode_feedback(content: str, state: State) -> str:
    """A feedback turn: agent, event, steps; the result as a new ref; the request with a pointer. A joined feedback
    (a ``delegate_all`` or ``plan``) is each agent's report in turn, joined by " ; ", the progress once at the end."""
    lines = content.split("\n")
    head = _HEAD.fullmatch(lines[0].strip())
    if head is None:
        return "invalid" if lines[0].strip() and not lines[0].startswith("[notification]") else lines[0][:40]
    blocks: list[list[str]] = []
    for line in lines:
        if _HEAD.fullmatch(line.strip()):
            blocks.append([line])
        else:
            blocks[-1].append(line)
    out = [_encode_report(block, state) for block in blocks]
    return " ; ".join(out) + (f" todo={state.todo()}" if state.clauses else "")


def _encode_report(lines: Sequence[str], state: State) -> str:
    """One sub-agent's report (its head line and the lines under it)."""
    head = _HEAD.fullmatch(lines[0].strip())
    assert head is not None
    agent = int(head[1])
    if state.pending:  # the engine answers a delegation with its new agents' feedback, in order
        state.agents[agent] = state.pending.pop(0)
    out = [f"a{agent} {head[2]}" + (f" {head[3]}/{head[4]}" if head[3] else "")]
    for line in lines[1:]:
        if line.startswith("result: "):
            result = line[len("result: ") :].strip()
            if result == NO_RESULT:  # a return without a result: its clause is still to do
                continue
            state.results.append(result)
            out.append(f"r{len(state.results)}")
            if agent in state.agents:
                state.done.add(state.agents[agent])
        elif line.startswith("request: "):
            r = _REQUEST.fullmatch(line.strip())
            if r is None:
                continue
            target, detail = _TARGET.get(r[1], r[1]), (r[3] or "").strip()
            if target == "ctx":
                detail = state.key_ref(detail) or "?"
            elif target == "budget":
                detail = detail.lstrip("+")
            elif target != "tools":  # a question in free text: the view shows only that one was asked
                detail = ""
            out.append(f"req {target}+{detail}" if detail else f"req {target}")
    return " ".join(out)


def encode_hint(content: str, state: State) -> str:
    text = content[len(HINT_PREFIX) :].strip()
    if not text:
        return "hint"
    for pattern, field in _HINTS:
        m = pattern.fullmatch(text)
        if m is None:
            continue
        if field == "tools":
            return f"hint tools+{m[1]}"
        if field == "ctx":
            return f"hint ctx+{state.result_ref(m[1]) or state.key_ref(m[1].split(': ', 1)[0]) or '?'}"
        if field == "budget":
            return f"hint budget={m[1]}"
        return f"hint sub={state.clause_ref(m[1]) or '?'}"
    return "hint ?"


def _encode(context: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], State]:
    state, out = State(), []
    for m in context:
        role, content = m.get("role"), m.get("content") or ""
        if role == "system":
            continue
        if role == "assistant":
            text = encode_text(content, state)
            _track(text, state)
        elif role == "user" and content.startswith("Task: ") and not state.clauses:
            text = encode_task(content, state)
        elif role == "user" and content.startswith(HINT_PREFIX):
            text = encode_hint(content, state)
        elif role == "user":
            text = encode_feedback(content, state)
        else:
            text = content
        out.append({"role": role, "content": text})
    return out, state


def _track(action: str, state: State) -> None:
    """Which clause each agent works on, from the policy's own (compact) actions."""
    words = action.split()
    state.pending = []
    if len(words) > 1 and words[0] == "delegate" and re.fullmatch(r"c\d+", words[1]):
        state.pending = [int(words[1][1:]) - 1]
    elif len(words) > 1 and words[0] in JOINED:
        parts = [p.split() for p in " ".join(words[1:]).split(";")]
        if all(p and re.fullmatch(r"c\d+", p[0]) for p in parts):
            state.pending = [int(p[0][1:]) - 1 for p in parts]
    elif len(words) > 1 and words[0] == "revise" and re.fullmatch(r"a\d+", words[1]):
        for w in words[2:]:
            if re.fullmatch(r"sub=c\d+", w):
                state.agents[int(words[1][1:])] = int(w[5:]) - 1


def encode_context(context: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The policy's view of a stored context (system prompt dropped; every turn in the language)."""
    return _encode(context)[0]


def state_of(context: Sequence[Mapping[str, Any]]) -> State:
    """The clauses and results a context has shown (what refs in the next action point to)."""
    return _encode(context)[1]


# ---- actions ----------------------------------------------------------------------------------------


def _refs(items: Sequence[str], state: State) -> list[str]:
    refs = {state.result_ref(x) for x in items} - {None}
    return sorted(refs, key=lambda r: int(r[1:]))  # type: ignore[arg-type, index]


def encode_call(call: Mapping[str, Any], state: State) -> str:
    """A protocol tool call ``{"name", "arguments"}`` in the language (canonical)."""
    name, a = call.get("name"), dict(call.get("arguments") or {})
    if name == "finish":
        ref = state.result_ref(str(a.get("answer", "")))
        return f"finish {ref or 'done'}"
    if name == "stop":
        return f"stop a{a.get('agent_id')}"
    if name in JOINED:
        subtasks = a.get("subtasks") or []
        if not subtasks or not all(isinstance(t, Mapping) for t in subtasks):
            raise CodecError(f"{name} needs a non-empty list of subtasks, got {subtasks!r}")
        return f"{name} " + SUBTASK_SEP.join(_harness_words(t, state, "delegate") for t in subtasks)
    if name not in ("delegate", "revise"):
        raise CodecError(f"no compact form for action {name!r}")
    head = "delegate" if name == "delegate" else f"revise a{a.get('agent_id')}"
    return f"{head} {_harness_words(a, state, name)}" if name == "delegate" else _revise_words(head, a, state)


def _harness_words(a: Mapping[str, Any], state: State, name: str) -> str:
    """A delegation's harness without the verb: its clause, then ctx, tools and budget."""
    return " ".join([state.clause_ref(str(a.get("subgoal", ""))) or "c?", *_field_words(a, state, name)])


def _revise_words(head: str, a: Mapping[str, Any], state: State) -> str:
    parts = [head]
    if "subgoal" in a:
        parts.append(f"sub={state.clause_ref(str(a['subgoal'])) or 'c?'}")
    return " ".join(parts + _field_words(a, state, "revise"))


def _field_words(a: Mapping[str, Any], state: State, name: str) -> list[str]:
    parts = []
    if a.get("context"):
        refs = _refs(a["context"], state)
        if refs:
            parts.append("ctx=" + ",".join(refs))
    elif name == "revise" and "context" in a:
        parts.append("ctx=-")
    if a.get("tools"):
        parts.append("tools=" + ",".join(sorted(a["tools"])))
    elif name == "revise" and "tools" in a:
        parts.append("tools=-")
    if "budget" in a:
        parts.append(f"budget={a['budget']}")
    return parts


def encode_text(text: str, state: State) -> str:
    """A stored reply: its tool call in the language, or the text as it was when it held none."""
    try:
        return encode_call(extract_call(text), state)
    except (ValueError, TypeError, KeyError):  # ProtocolError, CodecError: an invalid reply is shown as written
        return text.strip()


def encode_action(call: Mapping[str, Any], context: Sequence[Mapping[str, Any]]) -> str:
    return encode_call(call, state_of(context))


_FIELD = re.compile(r"(ctx|tools|budget|sub)=(\S*)")


def decode_call(dsl: str, state: State) -> dict[str, Any]:
    """The full protocol call for an action in the language; CodecError names what is wrong."""
    words = dsl.strip().split()
    if not words:
        raise CodecError("empty action")
    verb, rest = words[0], words[1:]
    if verb == "finish":
        if len(rest) != 1:
            raise CodecError(f"finish takes one ref or 'done', got {dsl!r}")
        return {
            "name": "finish",
            "arguments": {"answer": "done" if rest[0] == "done" else state.resolve(rest[0], "r", state.results)},
        }
    if verb == "stop":
        if len(rest) != 1 or not re.fullmatch(r"a\d+", rest[0]):
            raise CodecError(f"stop takes one agent id aN, got {dsl!r}")
        return {"name": "stop", "arguments": {"agent_id": int(rest[0][1:])}}
    if verb in JOINED:
        parts = [p.split() for p in " ".join(rest).split(";")]
        if not rest or not all(parts):
            raise CodecError(f"{verb} takes subtasks 'cN [ctx=..] [tools=..] [budget=N]' joined by ';', got {dsl!r}")
        return {"name": verb, "arguments": {"subtasks": [_decode_fields("delegate", p, state, dsl) for p in parts]}}
    if verb not in ("delegate", "revise") or not rest:
        raise CodecError(f"unknown action {dsl!r} (delegate, revise, stop, finish, delegate_all, plan)")
    return {"name": verb, "arguments": _decode_fields(verb, rest, state, dsl)}


def _decode_fields(verb: str, rest: Sequence[str], state: State, dsl: str) -> dict[str, Any]:
    """A delegate's (its clause first) or a revise's (its agent first) arguments from their words."""
    args: dict[str, Any] = {}
    if verb == "delegate":
        args["subgoal"] = state.resolve(rest[0], "c", state.clauses)
    elif re.fullmatch(r"a\d+", rest[0]):
        args["agent_id"] = int(rest[0][1:])
    else:
        raise CodecError(f"revise names an agent aN first, got {rest[0]!r}")
    seen: set[str] = set()
    for word in rest[1:]:
        m = _FIELD.fullmatch(word)
        if m is None or m[1] in seen or (m[1] == "sub" and verb == "delegate"):
            raise CodecError(f"bad or repeated field {word!r} in {dsl!r}")
        seen.add(m[1])
        key, value = m[1], m[2]
        items = [] if value in ("", "-") else value.split(",")
        if key == "ctx":
            args["context"] = [state.resolve(r, "r", state.results) for r in items]
        elif key == "tools":
            args["tools"] = items
        elif key == "sub":
            args["subgoal"] = state.resolve(value, "c", state.clauses)
        elif not value.isdigit():
            raise CodecError(f"budget must be a number, got {value!r}")
        else:
            args["budget"] = int(value)
    if verb == "delegate":
        return {
            "subgoal": args["subgoal"],
            "context": args.get("context", []),
            "tools": args.get("tools", []),
            "budget": args.get("budget", 1),
        }
    order = ("agent_id", "subgoal", "context", "tools", "budget")
    return {k: args[k] for k in order if k in args}


def decode_text(dsl: str, context: Sequence[Mapping[str, Any]]) -> str:
    """The reply the engine parses: the decoded call as Hermes tool-call text, or ``dsl`` unchanged
    when it does not decode (the engine then records an invalid action, as for any unparsable reply)."""
    try:
        return render_call(decode_call(dsl, state_of(context)))
    except CodecError:
        return dsl


def decodes(dsl: str, context: Sequence[Mapping[str, Any]]) -> bool:
    """Whether ``dsl`` decodes into an action under ``context`` (what ``decode_text`` would not pass through)."""
    try:
        decode_call(dsl, state_of(context))
    except CodecError:
        return False
    return True


def corpus() -> str:
    """Lines of the language as the policy reads and writes them (every word at the start of a turn
    and after a space, "=", "," or "+"), so the BPE built over it tokenizes every word one way."""
    from porch_jax.envs.workplace.clauses import KINDS

    tools = ["mail", "calendar", "contacts", "messaging", "cab", "files", "search", "extract", "code", "archive"]
    kinds = [k.name for k in KINDS] + ["other"]
    lines = [
        "user",
        "assistant",
        "system",
        "invalid",
        "hint",
        "finish done",
        "finish r3",
        "stop a1",
        "episode finished",
        "delegate c3 ctx=r1,r2 tools=code budget=3",
        "revise a2 ctx=- tools=- sub=c2 budget=12",
        "a0 submit 3/5 r1 todo=c2,c3",
        "a2 revise 1/2 req ctx+r1 todo=c3",
        "a1 budget_exhausted 4/4 todo=-",
        "a1 stop 2/5 req task todo=c1,c2,c3",
        "req budget+2",
        "hint ctx+r1",
        "hint budget=7",
        "hint sub=c2",
    ]
    for t in tools:
        lines += [
            f"delegate c1 tools={t} budget=5",
            f"revise a0 tools=search,{t} budget=6",
            f"a0 revise 3/5 req tools+{t} todo=c1",
            f"hint tools+{t}",
            f"tools={t},{t}",
        ]
    for k in kinds:
        lines += [f"c1 {k} c2 {k} c3 file p4 steps 12", f"{k}"]
    return "\n".join(lines * 20) + "\n"
