"""The subgoal grammar of the workplace suite and the tool program behind each clause.

A subgoal is clauses joined by "; ". Each clause kind names the tools it uses, the context facts it
needs ("key: value" lines), the fact it produces and a program: from the agent's own tool outputs
so far, the next call, done, or blocked. Programs read only text an LLM sub-agent would see
(subgoal, context, tool outputs), so what the scripted agents do follows from what is rendered.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Clause:
    kind: str
    args: Mapping[str, str]
    text: str


@dataclass(frozen=True)
class ToolObs:
    """One of the agent's own tool calls and its output."""

    name: str
    args: Mapping[str, Any]
    text: str


@dataclass(frozen=True)
class Call:
    name: str
    args: dict[str, Any]
    left: int  # tool calls this clause still needs, this one included (worst case)
    critical: bool = False  # a slip here corrupts an argument (a wrong write or result), not just a step


@dataclass(frozen=True)
class Done:
    key: str
    value: str
    evidence: str


@dataclass(frozen=True)
class Blocked:
    need: str  # "tools" | "context" | "task"
    detail: str  # the tool, the fact key, or the question to resolve
    why: str
    evidence: tuple[str, ...]
    left: int


Step = Call | Done | Blocked
Program = Callable[[Mapping[str, str], Mapping[str, str], Sequence[ToolObs]], Step]


@dataclass(frozen=True)
class Kind:
    name: str
    pattern: re.Pattern[str]
    tools: tuple[str, ...]
    needs: Callable[[Mapping[str, str]], tuple[str, ...]]
    product: Callable[[Mapping[str, str]], str]
    program: Program
    optional: tuple[str, ...] = field(default=())  # args a mis-scoped clause may lack


def _q(s: str) -> str:
    return re.escape(s)


def _last(obs: Sequence[ToolObs], pattern: str) -> re.Match[str] | None:
    for o in reversed(obs):
        m = re.fullmatch(pattern, o.text)
        if m:
            return m
    return None


def _missing(key: str, facts: Mapping[str, str], left: int, evidence: str = "") -> Blocked:
    have = ", ".join(facts) or "nothing"
    ev = (f"context lacks '{key}' (have: {have})",) + ((evidence,) if evidence else ())
    return Blocked("context", key, f"blocked: missing context '{key}'", ev, left)


def _lookup(tool: str, entity: str, prefix: str, obs: Sequence[ToolObs], key: str, what: str) -> Step:
    """search -> read for calendar/contacts: ``found <id>: <name>`` then ``<id> <name>: <value>``."""
    done = _last(obs, rf"({prefix}\d+) {_q(entity)}: (.+)")
    if done:
        return Done(key, done[2], done[0])
    for o in reversed(obs):
        if o.name == tool and o.text.startswith("found "):
            hit = re.search(rf"({prefix}\d+): {_q(entity)}(?= \||$)", o.text)
            if hit:
                return Call(tool, {"op": "read", "id": hit[1]}, 1)
            if o.args.get("q") == entity:
                names = ", ".join(re.findall(rf"{prefix}\d+: ([^|]+?)(?= \||$)", o.text))
                return Blocked("task", f"which {what}: {names}?", f"blocked: '{entity}' is ambiguous", (o.text,), 1)
    return Call(tool, {"op": "search", "q": entity}, 2)


def _venue(a: Mapping[str, str], facts: Mapping[str, str], obs: Sequence[ToolObs]) -> Step:
    return _lookup("calendar", a["event"], "ev", obs, f"venue of {a['event']}", "event")


def _phone(a: Mapping[str, str], facts: Mapping[str, str], obs: Sequence[ToolObs]) -> Step:
    return _lookup("contacts", a["person"], "c", obs, f"phone of {a['person']}", "person")


def _mail(a: Mapping[str, str], facts: Mapping[str, str], obs: Sequence[ToolObs]) -> Step:
    item, person = a["item"], a.get("person")
    found = next((o.text for o in reversed(obs) if o.name == "mail" and o.text.startswith("found ")), None)
    if person:
        done = _last(obs, rf"(m\d+) from {_q(person)}: the {_q(item)} is (\S+)")
        if done:
            return Done(item, done[2], done[0])
        hit = re.search(rf"(m\d+) from {_q(person)}: ", found or "")
        if hit:
            return Call("mail", {"op": "read", "id": hit[1]}, 1)
    elif found:
        senders = ", ".join(re.findall(r"m\d+ from ([^:]+):", found))
        return Blocked("task", f"which sender: {senders}?", "blocked: several mails match", (found,), 1)
    return Call("mail", {"op": "search", "q": item}, 2)


def _file(a: Mapping[str, str], facts: Mapping[str, str], obs: Sequence[ToolObs]) -> Step:
    item, name, pages = a["item"], a["file"], int(a["pages"])
    done = _last(obs, rf"{_q(name)} p\d+: .*the {_q(item)} is (\w+)(?:;.*)?")
    if done:
        return Done(item, done[1], done[0])
    read = {int(m[1]) for o in obs if (m := re.match(rf"{_q(name)} p(\d+): ", o.text))}
    opened = any(o.text.startswith(f"opened {name}:") for o in obs)
    if not opened:
        return Call("files", {"op": "open", "name": name}, 1 + pages)
    nxt = next((p for p in range(1, pages + 1) if p not in read), pages)
    return Call("files", {"op": "read", "name": name, "page": nxt}, pages - len(read))


def _web(a: Mapping[str, str], facts: Mapping[str, str], obs: Sequence[ToolObs]) -> Step:
    qty, ent, year = a["qty"], a["entity"], a.get("year")
    if year:
        done = _last(obs, rf"{_q(qty)} of {_q(ent)} in {year}: (\d+)")
        if done:
            return Done(f"{qty} of {ent} in {year}", done[1], done[0])
        gap = _last(obs, rf"{_q(qty)} of {_q(ent)}: \d+ \(2025\); no {year} figure on the current page")
        if gap:
            return Call("archive", {"url": f"wiki/{ent}", "year": int(year), "q": qty}, 1)
    else:
        done = _last(obs, rf"{_q(qty)} of {_q(ent)}: (\d+) \(2025\)")
        if done:
            return Done(f"{qty} of {ent}", done[1], done[0])
    url = _last(obs, rf"found (wiki/{_q(ent)})")
    if url:
        return Call("extract", {"url": url[1], "q": f"{qty} in {year}" if year else qty}, 2 if year else 1)
    return Call("search", {"q": f"{qty} of {ent}"}, 3 if year else 2)


def _compute(a: Mapping[str, str], facts: Mapping[str, str], obs: Sequence[ToolObs]) -> Step:
    old, new = f"{a['qty']} of {a['entity']} in {a['year']}", f"{a['qty']} of {a['entity']}"
    for key in (old, new):
        if key not in facts:
            return _missing(key, facts, 1)
    expr = f"{facts[new]} - {facts[old]}"
    done = next((o for o in reversed(obs) if o.name == "code" and o.text.startswith("= ")), None)
    if done:  # the agent trusts its own computation
        return Done(f"change in {a['qty']} of {a['entity']} since {a['year']}", done.text[2:], done.text)
    return Call("code", {"expr": expr}, 1, critical=True)


def _cab(a: Mapping[str, str], facts: Mapping[str, str], obs: Sequence[ToolObs]) -> Step:
    key = f"venue of {a['event']}"
    if key not in facts:
        return _missing(key, facts, 4)
    m = re.fullmatch(r"(.+) at (\d\d:\d\d)", facts[key])
    if not m:
        return Blocked("context", key, f"blocked: cannot read '{key}'", (facts[key],), 4)
    place, time, seats = m[1], m[2], a.get("seats")
    if seats is None:
        err = _last(obs, r"error: seats required")
        if err:
            return Blocked("task", "how many seats?", "blocked: subgoal gives no seat count", (err[0],), 4)
        return Call("cab", {"op": "quote", "to": place, "at": time}, 4)
    booked = _last(obs, rf"booked (R\d+): {_q(place)} {time}, {seats} seats")
    if booked:
        ref = booked[1]
        checks = sum(o.text.startswith(f"{ref}: ") for o in obs)
        if checks >= 2:
            return Done("cab booking", ref, booked[0])
        return Call("cab", {"op": "status", "ref": ref}, 2 - checks)
    if _last(obs, rf"q\d+: {_q(place)} {time}, \d seats, \$\d+"):  # a quote for this ride, any seat count
        return Call("cab", {"op": "book", "to": place, "at": time, "seats": int(seats)}, 3, critical=True)
    return Call("cab", {"op": "quote", "to": place, "at": time, "seats": int(seats)}, 4)


def _cancel(a: Mapping[str, str], facts: Mapping[str, str], obs: Sequence[ToolObs]) -> Step:
    done = _last(obs, rf"cancelled {a['ref']}")
    if done:
        return Done(f"cancelled {a['ref']}", "yes", done[0])
    return Call("cab", {"op": "cancel", "ref": a["ref"]}, 1, critical=True)


def _text(a: Mapping[str, str], facts: Mapping[str, str], obs: Sequence[ToolObs]) -> Step:
    person, key = a["person"], a["key"]
    pkey = f"phone of {person}"
    if pkey not in facts:
        return _missing(pkey, facts, 3)
    phone = facts[pkey]
    thread = _last(obs, rf"thread (t\d+) with {_q(phone)}")
    if not thread:
        return Call("messaging", {"op": "open", "to": phone}, 3)
    if key not in facts:
        return _missing(key, facts, 2, thread[0])
    sent = _last(obs, rf"sent (s\d+) to {_q(phone)}")
    if not sent:
        return Call("messaging", {"op": "send", "thread": thread[1], "text": f"{key}: {facts[key]}"}, 2, critical=True)
    if _last(obs, rf"{sent[1]}: delivered"):
        return Done(f"texted {person}", key, sent[0])
    return Call("messaging", {"op": "check", "id": sent[1]}, 1)


def _none(a: Mapping[str, str]) -> tuple[str, ...]:
    return ()


KINDS: tuple[Kind, ...] = (
    Kind(
        "venue",
        re.compile(r"find venue of (?P<event>.+)"),
        ("calendar",),
        _none,
        lambda a: f"venue of {a['event']}",
        _venue,
    ),
    Kind(
        "phone",
        re.compile(r"find phone of (?P<person>.+)"),
        ("contacts",),
        _none,
        lambda a: f"phone of {a['person']}",
        _phone,
    ),
    Kind(
        "mail",
        re.compile(r"find (?P<item>.+?) in mail(?: from (?P<person>.+))?"),
        ("mail",),
        _none,
        lambda a: a["item"],
        _mail,
        ("person",),
    ),
    Kind(
        "file",
        re.compile(r"find (?P<item>.+?) in file (?P<file>\S+) \((?P<pages>\d+) pages\)"),
        ("files",),
        _none,
        lambda a: a["item"],
        _file,
    ),
    Kind(
        "history",
        re.compile(r"find (?P<qty>\w+) of (?P<entity>\w+) in (?P<year>\d{4})"),
        ("search", "extract", "archive"),
        _none,
        lambda a: f"{a['qty']} of {a['entity']} in {a['year']}",
        _web,
    ),
    Kind(
        "web",
        re.compile(r"find (?P<qty>\w+) of (?P<entity>\w+)"),
        ("search", "extract"),
        _none,
        lambda a: f"{a['qty']} of {a['entity']}",
        _web,
    ),
    Kind(
        "compute",
        re.compile(r"compute change in (?P<qty>\w+) of (?P<entity>\w+) since (?P<year>\d{4})"),
        ("code",),
        lambda a: (f"{a['qty']} of {a['entity']} in {a['year']}", f"{a['qty']} of {a['entity']}"),
        lambda a: f"change in {a['qty']} of {a['entity']} since {a['year']}",
        _compute,
    ),
    Kind(
        "cab",
        re.compile(r"book cab to (?P<event>.+?)(?: for (?P<seats>\d+))?"),
        ("cab",),
        lambda a: (f"venue of {a['event']}",),
        lambda a: "cab booking",
        _cab,
        ("seats",),
    ),
    Kind(
        "cancel", re.compile(r"cancel cab (?P<ref>R\d+)"), ("cab",), _none, lambda a: f"cancelled {a['ref']}", _cancel
    ),
    Kind(
        "text",
        re.compile(r"text (?P<person>.+?) the (?P<key>.+)"),
        ("messaging",),
        lambda a: (f"phone of {a['person']}", a["key"]),
        lambda a: f"texted {a['person']}",
        _text,
    ),
)
KIND = {k.name: k for k in KINDS}


def parse_clause(text: str) -> Clause | None:
    text = text.strip()
    for kind in KINDS:
        m = kind.pattern.fullmatch(text)
        if m:
            return Clause(kind.name, {k: v for k, v in m.groupdict().items() if v is not None}, text)
    return None


def parse_subgoal(subgoal: str) -> list[Clause] | None:
    """Clauses of a subgoal ("a; b" or a numbered task "1) a 2) b"), or None if any is outside the grammar."""
    clauses = [parse_clause(part) for part in re.split(r";|(?:^|\s)\d+\)\s", subgoal) if part.strip()]
    return clauses if clauses and all(c is not None for c in clauses) else None  # type: ignore[return-value]


def parse_facts(lines: Sequence[str]) -> dict[str, str]:
    """``key: value`` lines (context items, submit results) as a dict; other lines are ignored."""
    out = {}
    for line in lines:
        for part in line.split("\n"):
            key, sep, value = part.partition(": ")
            if sep and key.strip() and value.strip():
                out[key.strip()] = value.strip()
    return out


def step(clause: Clause, facts: Mapping[str, str], obs: Sequence[ToolObs]) -> Step:
    return KIND[clause.kind].program(clause.args, facts, obs)


def work(clause: Clause) -> int:
    """Tool calls a fresh agent needs for ``clause`` given its context (the horizon less the submit)."""
    kind = KIND[clause.kind]
    stand_in = {"venue": "Room 1 at 09:00", "phone": "+1-555-0100"}  # only the format matters here
    facts = {k: stand_in.get(k.split(" of ")[0], "1") for k in kind.needs(clause.args)}
    s = kind.program(clause.args, facts, ())
    return s.left if isinstance(s, (Call, Blocked)) else 0
