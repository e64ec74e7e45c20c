"""The workplace apps as tools over a mutable copy of the world.

One function per app with an ``op`` argument keeps the tool list short (ten names a tiny model can
learn to grant). Some state is per agent, as in a real app session: a ride can only be booked by
the agent that quoted it, a message thread and an opened file belong to their opener. So a
fresh sub-agent that replaces a stopped one must redo that work: re-delegation costs steps.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from porch_jax.envs.workplace.world import CURRENT_YEAR, ENTITIES, Event, World

TOOLS: tuple[str, ...] = (
    "mail",
    "calendar",
    "contacts",
    "messaging",
    "cab",
    "files",
    "search",
    "extract",
    "code",
    "archive",
)
TOOL_DOCS: dict[str, str] = {
    "mail": "search/read mail",
    "calendar": "search/read events",
    "contacts": "search/read people",
    "messaging": "open/send/check texts",
    "cab": "quote/book/status/cancel rides",
    "files": "open/read files",
    "search": "web search",
    "extract": "read a web page",
    "code": "run arithmetic",
    "archive": "old page revisions",
}
_OPS: dict[str, tuple[str, ...]] = {
    "mail": ("search", "read"),
    "calendar": ("search", "read"),
    "contacts": ("search", "read"),
    "messaging": ("open", "send", "check"),
    "cab": ("quote", "book", "status", "cancel"),
    "files": ("open", "read"),
}
_PROPS: dict[str, dict[str, str]] = {
    "mail": {"q": "string", "id": "string"},
    "calendar": {"q": "string", "id": "string"},
    "contacts": {"q": "string", "id": "string"},
    "messaging": {"to": "string", "thread": "string", "text": "string", "id": "string"},
    "cab": {"to": "string", "at": "string", "seats": "integer", "ref": "string"},
    "files": {"name": "string", "page": "integer"},
    "search": {"q": "string"},
    "extract": {"url": "string", "q": "string"},
    "code": {"expr": "string"},
    "archive": {"url": "string", "year": "integer", "q": "string"},
}


def tool_schema(name: str) -> dict[str, Any]:
    props: dict[str, Any] = {k: {"type": t} for k, t in _PROPS[name].items()}
    required = [k for k in props if name not in _OPS]
    if name in _OPS:
        props = {"op": {"type": "string", "enum": list(_OPS[name])}, **props}
        required = ["op"]
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": TOOL_DOCS[name],
            "parameters": {"type": "object", "properties": props, "required": required, "additionalProperties": False},
        },
    }


class ToolError(Exception):
    """A bad call; its message goes back to the agent as the observation."""


@dataclass
class Booking:
    ref: str
    place: str
    time: str
    seats: int
    active: bool = True


_ARITH = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}


def _arith(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
        return _ARITH[type(node.op)](_arith(node.left), _arith(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _ARITH:
        return _ARITH[type(node.op)](_arith(node.operand))
    raise ToolError("error: only + - * / on numbers")


class Apps:
    """Tool state for one episode."""

    def __init__(self, world: World):
        self.world = world
        self.events: dict[str, Event] = {e.eid: e for e in world.events}
        self.bookings: dict[str, Booking] = {}
        self.sent: list[tuple[str, str]] = []  # (phone, text)
        self._quoted: set[tuple[int, str, str]] = set()
        self._threads: dict[str, tuple[int, str]] = {}
        self._opened: set[tuple[int, str]] = set()
        self._status_calls: dict[str, int] = {}
        self._next = 0
        self._handlers: dict[str, Callable[[int, dict[str, Any]], str]] = {
            "mail": self._mail,
            "calendar": self._calendar,
            "contacts": self._contacts,
            "messaging": self._messaging,
            "cab": self._cab,
            "files": self._files,
            "search": self._search,
            "extract": self._extract,
            "code": self._code,
            "archive": self._archive,
        }

    def call(self, agent_id: int, name: str, args: dict[str, Any]) -> str:
        if name not in self._handlers:
            return f"error: unknown tool {name!r}"
        try:
            return self._handlers[name](agent_id, args)
        except ToolError as e:
            return str(e)
        except (KeyError, ValueError, TypeError, ZeroDivisionError, SyntaxError) as e:
            return f"error: bad arguments for {name} ({type(e).__name__})"

    def move_event(self, title: str, place: str, time: str) -> None:
        ev = next(e for e in self.events.values() if e.title == title)
        self.events[ev.eid] = Event(ev.eid, title, place, time)

    def _id(self, prefix: str) -> str:
        self._next += 1
        return f"{prefix}{self._next}"

    @staticmethod
    def _op(name: str, args: dict[str, Any]) -> str:
        op = args.get("op")
        if op not in _OPS[name]:
            raise ToolError(f"error: op must be one of {list(_OPS[name])}")
        return op

    @staticmethod
    def _arg(args: dict[str, Any], key: str, kind: type = str) -> Any:
        value = args.get(key)
        if value is None:
            raise ToolError(f"error: {key} required")
        if kind is int:
            if isinstance(value, str) and value.isdigit():
                value = int(value)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ToolError(f"error: {key} must be an integer")
        return value if kind is int else str(value)

    @staticmethod
    def _found(hits: list[str], q: str) -> str:
        return "found " + " | ".join(hits) if hits else f"no match for {q!r}"

    def _calendar(self, agent: int, args: dict[str, Any]) -> str:
        if self._op("calendar", args) == "search":
            q = self._arg(args, "q")
            return self._found([f"{e.eid}: {e.title}" for e in self.events.values() if q.lower() in e.title.lower()], q)
        e = self.events.get(self._arg(args, "id"))
        if e is None:
            raise ToolError("error: no such event")
        return f"{e.eid} {e.title}: {e.place} at {e.time}"

    def _contacts(self, agent: int, args: dict[str, Any]) -> str:
        if self._op("contacts", args) == "search":
            q = self._arg(args, "q")
            return self._found([f"{c.cid}: {c.name}" for c in self.world.contacts if q.lower() in c.name.lower()], q)
        c = next((c for c in self.world.contacts if c.cid == self._arg(args, "id")), None)
        if c is None:
            raise ToolError("error: no such contact")
        return f"{c.cid} {c.name}: {c.phone}"

    def _mail(self, agent: int, args: dict[str, Any]) -> str:
        if self._op("mail", args) == "search":
            q = self._arg(args, "q").lower()
            return self._found(
                [
                    f"{m.mid} from {m.sender}: {m.item}"
                    for m in self.world.mails
                    if q in m.item or q in m.sender.lower()
                ],
                q,
            )
        m = next((m for m in self.world.mails if m.mid == self._arg(args, "id")), None)
        if m is None:
            raise ToolError("error: no such mail")
        return f"{m.mid} from {m.sender}: the {m.item} is {m.value}"

    def _messaging(self, agent: int, args: dict[str, Any]) -> str:
        op = self._op("messaging", args)
        if op == "open":
            to = self._arg(args, "to")
            if not re.fullmatch(r"\+1-555-0\d{3}", to):
                raise ToolError("error: to must be a phone number")
            tid = self._id("t")
            self._threads[tid] = (agent, to)
            return f"thread {tid} with {to}"
        if op == "send":
            owner, to = self._threads.get(self._arg(args, "thread"), (None, ""))
            if owner != agent:
                raise ToolError("error: open the thread first")
            sid = self._id("s")
            self.sent.append((to, self._arg(args, "text")))
            return f"sent {sid} to {to}"
        return f"{self._arg(args, 'id')}: delivered"

    def _cab(self, agent: int, args: dict[str, Any]) -> str:
        op = self._op("cab", args)
        if op == "quote":
            to, at = self._arg(args, "to"), self._arg(args, "at")
            seats = self._arg(args, "seats", int)
            if not 1 <= seats <= 6:
                raise ToolError("error: 1-6 seats")
            qid = self._id("q")
            self._quoted.add((agent, to, at))
            return f"{qid}: {to} {at}, {seats} seats, ${12 + 3 * seats}"
        if op == "book":
            to, at, seats = self._arg(args, "to"), self._arg(args, "at"), self._arg(args, "seats", int)
            if (agent, to, at) not in self._quoted:
                raise ToolError("error: quote this ride first (quotes are per session)")
            ref = self._id("R")
            self.bookings[ref] = Booking(ref, to, at, seats)
            return f"booked {ref}: {to} {at}, {seats} seats"
        booking = self.bookings.get(self._arg(args, "ref"))
        if booking is None:
            raise ToolError("error: no such booking")
        if op == "cancel":
            booking.active = False
            return f"cancelled {booking.ref}"
        n = self._status_calls[booking.ref] = self._status_calls.get(booking.ref, 0) + 1
        state = "cancelled" if not booking.active else "pending" if n == 1 else "confirmed"
        return f"{booking.ref}: {state}"

    def _files(self, agent: int, args: dict[str, Any]) -> str:
        name = self._arg(args, "name")
        if name not in self.world.files:
            raise ToolError(f"error: no file {name}")
        pages = self.world.files[name]
        if self._op("files", args) == "open":
            self._opened.add((agent, name))
            return f"opened {name}: {len(pages)} pages"
        if (agent, name) not in self._opened:
            raise ToolError("error: open the file first")
        page = self._arg(args, "page", int)
        if not 1 <= page <= len(pages):
            raise ToolError(f"error: page 1-{len(pages)}")
        return pages[page - 1]

    def _entity(self, text: str) -> str:
        ent = next((e for e in ENTITIES if e.lower() in text.lower()), None)
        if ent is None:
            raise ToolError(f"no results for {text!r}")
        return ent

    def _search(self, agent: int, args: dict[str, Any]) -> str:
        return f"found wiki/{self._entity(self._arg(args, 'q'))}"

    def _page(self, args: dict[str, Any]) -> tuple[str, str]:
        url = self._arg(args, "url")
        if not url.startswith("wiki/"):
            raise ToolError("error: unknown url")
        q = self._arg(args, "q")
        qty = next((k for k, _ in self.world.figures if q.startswith(k)), None)
        if qty is None:
            raise ToolError(f"error: no {q!r} on the page")
        return self._entity(url), qty

    def _extract(self, agent: int, args: dict[str, Any]) -> str:
        ent, qty = self._page(args)
        out = f"{qty} of {ent}: {self.world.figures[(qty, ent)][CURRENT_YEAR]} ({CURRENT_YEAR})"
        year = re.search(r"\b(19|20)\d\d\b", args["q"])
        if year and int(year[0]) != CURRENT_YEAR:
            out += f"; no {year[0]} figure on the current page"
        return out

    def _archive(self, agent: int, args: dict[str, Any]) -> str:
        ent, qty = self._page(args)
        year = self._arg(args, "year", int)
        value = self.world.figures[(qty, ent)].get(year)
        if value is None:
            raise ToolError(f"error: no {year} revision")
        return f"{qty} of {ent} in {year}: {value}"

    def _code(self, agent: int, args: dict[str, Any]) -> str:
        value = _arith(ast.parse(self._arg(args, "expr"), mode="eval"))
        return f"= {int(value) if float(value).is_integer() else round(value, 4)}"
