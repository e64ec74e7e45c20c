"""Seeded GAIA2-like workplace tasks: clause chains whose success needs the right split, hand-over,
tools and budget, with notifications that change what the user wants mid-task.

A task is the user's numbered request (one clause per sub-agent in the right split), a world, the
notifications (each arriving ``offset`` steps after the first call of its anchor tool, the offset
uniform over the horizon of the work it interrupts), and tight budgets: total steps = the nominal
steps of the right delegations + a small slack, and a few spare sub-agents.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from porch_jax.envs.workplace import world as W
from porch_jax.envs.workplace.clauses import KIND, parse_clause, work


@dataclass(frozen=True)
class Notice:
    """An asynchronous notification. ``change`` is the user's new requirement, e.g. (("seats", "3"),)."""

    text: str
    anchor: str | None  # tool whose first call starts the clock; None: the episode start
    offset: float
    relevant: bool
    change: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TaskMixture:
    """The suite's knobs: template weights, notification rates and budget tightness."""

    templates: Mapping[str, float] = field(
        default_factory=lambda: MappingProxyType(
            {"cab": 1.0, "cab_text": 1.0, "mail_text": 1.0, "history": 1.0, "file_text": 1.0}
        )
    )
    p_change: float = 0.5  # a goal-changing notification (during the cab booking or the file search)
    p_distract: float = 0.5  # an unrelated notification that looks relevant
    slack: tuple[int, int] = (2, 8)  # total budget = nominal + U{lo..hi}
    spare_agents: int = 2


@dataclass(frozen=True)
class WorkplaceTask:
    task_id: str
    seed: int
    template: str
    clauses: tuple[str, ...]
    world: W.World
    notices: tuple[Notice, ...]
    total_budget: int
    max_agents: int
    answer_key: str | None = None  # the fact whose value is the final answer
    env: str = "workplace"

    @property
    def text(self) -> str:
        return " ".join(f"{i + 1}) {c}" for i, c in enumerate(self.clauses))

    @property
    def features(self) -> tuple[str, ...]:
        """Task features the expert's blind spots key on (for analysis and mixtures)."""
        out = []
        parsed = [parse_clause(c) for c in self.clauses]
        products = [KIND[c.kind].product(c.args) for c in parsed]
        for i, c in enumerate(parsed):
            if any(products.index(k) <= i - 2 for k in KIND[c.kind].needs(c.args) if k in products):
                out.append("handover_2back")
            if c.kind == "history":
                out.append("archive")
            if c.kind == "file" and int(c.args["pages"]) >= 4:
                out.append("long_file")
        out += ["goal_change"] * any(n.relevant for n in self.notices)
        out += ["distractor"] * any(not n.relevant for n in self.notices)
        return tuple(dict.fromkeys(out))


def nominal_steps(clauses: tuple[str, ...]) -> int:
    """Steps of the right delegations: each clause's tool calls plus its submit."""
    return sum(work(parse_clause(c)) + 1 for c in clauses)


Built = tuple[tuple[str, ...], tuple[Notice, ...], W.World, "str | None"]


def _horizon(clause: str) -> int:
    return work(parse_clause(clause)) + 1


def _cab_notices(
    rng: random.Random, world: W.World, event: W.Event, seats: int, clause: str, mix: TaskMixture
) -> list[Notice]:
    out, h = [], _horizon(clause)
    if rng.random() < mix.p_change:
        if rng.random() < 0.5:
            new = rng.choice([n for n in range(1, 7) if n != seats])
            out.append(
                Notice(
                    f"User: we are {new} for {event.title} now", "cab", rng.uniform(0, h), True, (("seats", str(new)),)
                )
            )
        else:
            place = rng.choice([p for p in W.PLACES if p != event.place])
            time = W.random_time(rng)
            out.append(
                Notice(
                    f"User: {event.title} moved to {place} at {time}",
                    "cab",
                    rng.uniform(0, h),
                    True,
                    (("venue", f"{place} at {time}"),),
                )
            )
    if rng.random() < mix.p_distract:
        other = rng.choice([e for e in world.events if e.title != event.title])
        who = rng.choice(world.contacts).name
        text = (
            f"{who}: {other.title} moved to {rng.choice(W.PLACES)} at {W.random_time(rng)}"
            if rng.random() < 0.5
            else f"{who}: we are {rng.randint(2, 6)} for {other.title} now"
        )
        out.append(Notice(text, "cab", rng.uniform(0, h), False))
    return out


def _text_distractor(rng: random.Random, world: W.World, person: W.Contact, mix: TaskMixture) -> list[Notice]:
    if rng.random() >= mix.p_distract:
        return []
    first = person.name.split()[0]
    namesake = next(c for c in world.contacts if c.name.startswith(first + " ") and c.name != person.name)
    number = f"+1-555-0{rng.randint(100, 999)}"
    return [Notice(f"{namesake.name}: my new number is {number}", "messaging", rng.uniform(0, 4), False)]


def _cab(rng: random.Random, world: W.World, mix: TaskMixture, with_text: bool) -> Built:
    event, seats = rng.choice(world.events), rng.randint(1, 4)
    cab = f"book cab to {event.title} for {seats}"
    clauses = [f"find venue of {event.title}", cab]
    notices = _cab_notices(rng, world, event, seats, cab, mix)
    if with_text:
        person = rng.choice(world.contacts)
        clauses += [f"find phone of {person.name}", f"text {person.name} the cab booking"]
    return tuple(clauses), tuple(notices), world, None


def _mail_text(rng: random.Random, world: W.World, mix: TaskMixture) -> Built:
    mail = rng.choice(world.mails)
    person = rng.choice([c for c in world.contacts if c.name != mail.sender])
    clauses = (
        f"find {mail.item} in mail from {mail.sender}",
        f"find phone of {person.name}",
        f"text {person.name} the {mail.item}",
    )
    return clauses, tuple(_text_distractor(rng, world, person, mix)), world, None


def _history(rng: random.Random, world: W.World, mix: TaskMixture) -> Built:
    qty, ent, year = rng.choice(W.QTYS), rng.choice(W.ENTITIES), rng.choice(W.YEARS)
    clauses = (
        f"find {qty} of {ent} in {year}",
        f"find {qty} of {ent}",
        f"compute change in {qty} of {ent} since {year}",
    )
    return clauses, (), world, f"change in {qty} of {ent} since {year}"


def _file_text(rng: random.Random, world: W.World, mix: TaskMixture) -> Built:
    name, pages = rng.choice(W.FILES), rng.randint(2, 6)
    item, other = rng.sample(W.ITEMS, 2)
    world = W.with_pages(world, name, pages)
    for it in (item, other):
        world = W.with_file_item(world, name, it, W.random_code(rng), rng.randint(1, pages))
    person = rng.choice(world.contacts)
    clauses = (
        f"find {item} in file {name} ({pages} pages)",
        f"find phone of {person.name}",
        f"text {person.name} the {item}",
    )
    notices = _text_distractor(rng, world, person, mix)
    if rng.random() < mix.p_change:  # the user wants the other item: pages already read stay useful
        notices.append(
            Notice(
                f"User: in {name} find the {other} instead",
                "files",
                rng.uniform(0, pages + 2),
                True,
                (("item", other),),
            )
        )
    return clauses, tuple(notices), world, None


TEMPLATES: dict[str, Callable[[random.Random, W.World, TaskMixture], Built]] = {
    "cab": lambda r, w, m: _cab(r, w, m, False),
    "cab_text": lambda r, w, m: _cab(r, w, m, True),
    "mail_text": _mail_text,
    "history": _history,
    "file_text": _file_text,
}


def make_task(seed: int, mix: TaskMixture = TaskMixture(), *, prefix: str = "wp") -> WorkplaceTask:
    """The task for ``seed``: the same seed and mixture always give the same task."""
    rng = random.Random(f"workplace:{seed}")
    names = sorted(mix.templates)
    template = rng.choices(names, weights=[mix.templates[n] for n in names])[0]
    clauses, notices, world, answer = TEMPLATES[template](rng, W.make_world(rng), mix)
    budget = nominal_steps(clauses) + rng.randint(*mix.slack)
    return WorkplaceTask(
        f"{prefix}-{seed}", seed, template, clauses, world, notices, budget, len(clauses) + mix.spare_agents, answer
    )


def make_tasks(n: int, mix: TaskMixture = TaskMixture(), *, start: int = 0, prefix: str = "wp") -> list[WorkplaceTask]:
    return [make_task(s, mix, prefix=prefix) for s in range(start, start + n)]


def make_probe(seed: int, horizon: int, *, arrival: float | None = None, prefix: str = "probe") -> WorkplaceTask:
    """One sub-agent's worth of work lasting exactly ``horizon`` steps (open, read every page, submit),
    with a goal change arriving at ``arrival`` (default: uniform over [0, horizon)): the
    intervention-delay probe."""
    if horizon < 3:
        raise ValueError(f"horizon must be >= 3, got {horizon}")
    rng = random.Random(f"probe:{seed}:{horizon}")
    name, pages = rng.choice(W.FILES), horizon - 2
    first, second = rng.sample(W.ITEMS, 2)
    world = W.with_pages(W.make_world(rng, n_pages=pages), name, pages)
    world = W.with_file_item(
        W.with_file_item(world, name, first, W.random_code(rng), pages), name, second, W.random_code(rng), 1
    )
    when = rng.uniform(0, horizon) if arrival is None else arrival
    notice = Notice(f"User: in {name} find the {second} instead", None, when, True, (("item", second),))
    return WorkplaceTask(
        f"{prefix}-{horizon}-{seed}",
        seed,
        "probe",
        (f"find {first} in file {name} ({pages} pages)",),
        world,
        (notice,),
        4 * horizon,
        3,
    )
