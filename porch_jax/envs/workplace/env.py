"""WorkplaceEnv: the apps, the notification queue and the deterministic scorer for one task.

Time is the engine's global step counter. A notice anchored on a tool starts its clock at the
first call of that tool (by anyone) and arrives ``offset`` steps later; a relevant one changes the
world (an event moves) or the user's requirement (seat count) at arrival, and the scorer judges the
final state against the requirements in force when the episode ended.
"""

from __future__ import annotations

import re
from typing import Any

from porch_jax.envs.base import Delivery, Environment, Score
from porch_jax.envs.workplace.apps import TOOLS, Apps, tool_schema
from porch_jax.envs.workplace.clauses import parse_clause
from porch_jax.envs.workplace.subagent import apply_change
from porch_jax.envs.workplace.tasks import Notice, WorkplaceTask
from porch_jax.envs.workplace.world import CURRENT_YEAR


class WorkplaceEnv(Environment):
    name = "workplace"

    def __init__(self) -> None:
        self.task: WorkplaceTask | None = None

    def reset(self, task: WorkplaceTask) -> None:
        self.task = task
        self.apps = Apps(task.world)
        self._clock = 0
        self._anchor_time: dict[str, int] = {}
        self._pending: list[Notice] = list(task.notices)
        self._delivered: list[Delivery] = []
        self._changes: dict[str, str] = {}

    def tool_names(self) -> tuple[str, ...]:
        return TOOLS

    def tool_schemas(self, names: tuple[str, ...] | list[str]) -> list[dict[str, Any]]:
        return [tool_schema(n) for n in names if n in TOOLS]

    def call_tool(self, agent_id: int, name: str, args: dict[str, Any]) -> str:
        self._anchor_time.setdefault(name, self._clock)
        return self.apps.call(agent_id, name, args)

    def _arrival(self, notice: Notice) -> float | None:
        start = 0 if notice.anchor is None else self._anchor_time.get(notice.anchor)
        return None if start is None else start + notice.offset

    def poll_notifications(self, step: int) -> list[str]:
        self._clock = step
        out, keep = [], []
        for n in self._pending:
            arrival = self._arrival(n)
            if arrival is not None and arrival <= step:
                self._deliver(n, arrival, step)
                out.append(n.text)
            else:
                keep.append(n)
        self._pending = keep
        return out

    def _deliver(self, n: Notice, arrival: float, step: int) -> None:
        self._delivered.append(Delivery(n.text, arrival, step, n.relevant))
        if not n.relevant:
            return
        change = dict(n.change)
        self._changes.update(change)
        if "venue" in change:
            m = re.fullmatch(r"User: (.+) moved to .+", n.text)
            place, time = change["venue"].split(" at ")
            self.apps.move_event(m[1], place, time)

    def deliveries(self) -> list[Delivery]:
        return list(self._delivered)

    # ---- scoring ---------------------------------------------------------------------------------
    def score(self, answer: str | None) -> Score:
        """Every write the task asks for, exactly, and nothing else; plus the answer if one is asked."""
        assert self.task is not None, "reset() first"
        checks: list[tuple[str, bool]] = []
        clauses = [parse_clause(c) for c in self._requested()]
        active = [b for b in self.apps.bookings.values() if b.active]
        good_ref = None
        cab = next((c for c in clauses if c.kind == "cab"), None)
        if cab is not None:
            ev = next(e for e in self.apps.events.values() if e.title == cab.args["event"])
            seats = int(self._changes.get("seats", cab.args["seats"]))
            ok = len(active) == 1 and (active[0].place, active[0].time, active[0].seats) == (ev.place, ev.time, seats)
            good_ref = active[0].ref if ok else None
            checks.append((f"one booking to {ev.place} at {ev.time} for {seats}", ok))
        else:
            checks.append(("no bookings", not active))
        text = next((c for c in clauses if c.kind == "text"), None)
        if text is not None:
            phone = self.task.world.contact(text.args["person"]).phone
            value = good_ref if text.args["key"] == "cab booking" else self._item_value(text.args["key"], clauses)
            ok = (
                bool(self.apps.sent)
                and value is not None
                and all(to == phone and re.search(rf"\b{re.escape(value)}\b", body) for to, body in self.apps.sent)
            )
            checks.append((f"text {text.args['person']} the {text.args['key']}", ok))
        else:
            checks.append(("no texts", not self.apps.sent))
        if self.task.answer_key is not None:
            want = self._answer()
            checks.append(
                (f"answer {want}", answer is not None and re.search(rf"(?<![\d.-]){want}(?![\d.])", answer) is not None)
            )
        failed = [name for name, ok in checks if not ok]
        return Score(
            not failed,
            (len(checks) - len(failed)) / len(checks),
            "ok" if not failed else "failed: " + "; ".join(failed),
        )

    def _requested(self) -> list[str]:
        """The clauses as the user wants them now (a file-item change renames what is texted too)."""
        texts = list(self.task.clauses)
        if "item" in self._changes:
            i = next(i for i, t in enumerate(texts) if parse_clause(t).kind == "file")
            f = parse_clause(texts[i]).args
            texts = apply_change(texts, i, f"find {self._changes['item']} in file {f['file']} ({f['pages']} pages)")
        return texts

    def _item_value(self, item: str, clauses: list[Any]) -> str | None:
        for c in clauses:
            if c.kind == "mail" and c.args["item"] == item:
                return next(m.value for m in self.task.world.mails if m.item == item and m.sender == c.args["person"])
            if c.kind == "file" and c.args["item"] == item:
                for page in self.task.world.files[c.args["file"]]:
                    m = re.search(rf"the {re.escape(item)} is (\w+)", page)
                    if m:
                        return m[1]
        return None

    def _answer(self) -> str:
        c = parse_clause(self.task.clauses[-1])
        fig = self.task.world.figures[(c.args["qty"], c.args["entity"])]
        return str(fig[CURRENT_YEAR] - fig[int(c.args["year"])])
