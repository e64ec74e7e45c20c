"""A small seeded world for the workplace apps: contacts, calendar, mail, web figures and files.

Names are drawn so that ambiguity exists on purpose: every first name belongs to two contacts and
every mail item appears in two senders' mails, so a subgoal that drops the surname or the sender is
mis-scoped in a way the tools expose (two matches), not silently wrong.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

FIRST = ("Ana", "Ben", "Deniz", "Ali", "Mia", "Omar", "Lena", "Ravi", "Sara", "Tom")
LAST = ("Kaya", "Aydin", "Lopez", "Chen", "Novak", "Silva", "Ito", "Berg")
EVENTS = ("Budget review", "Team lunch", "Design sync", "Board call", "Demo day", "Offsite", "Hiring panel", "Retro")
PLACES = ("Room 4", "Pier 3", "Cafe Lumen", "Hall B", "Studio 9", "Dock 7", "Atrium", "Lab 2")
ITEMS = ("door code", "gate number", "wifi code", "order id", "desk number", "locker code")
ENTITIES = ("Greenland", "Iceland", "Malta", "Fiji", "Tonga", "Samoa", "Aruba", "Palau")
QTYS = ("population", "tourists", "exports")
FILES = ("notes.txt", "report.md", "plan.doc", "minutes.txt", "brief.md")
YEARS = tuple(range(2012, 2021))
CURRENT_YEAR = 2025


@dataclass(frozen=True)
class Contact:
    cid: str
    name: str
    phone: str


@dataclass(frozen=True)
class Event:
    eid: str
    title: str
    place: str
    time: str


@dataclass(frozen=True)
class Mail:
    mid: str
    sender: str
    item: str
    value: str


@dataclass(frozen=True)
class World:
    contacts: tuple[Contact, ...]
    events: tuple[Event, ...]
    mails: tuple[Mail, ...]
    figures: Mapping[tuple[str, str], Mapping[int, int]]  # (qty, entity) -> year -> value
    files: Mapping[str, tuple[str, ...]]  # name -> page texts

    def contact(self, name: str) -> Contact:
        return next(c for c in self.contacts if c.name == name)


def random_code(rng: random.Random) -> str:
    return str(rng.randint(1000, 9999))


def random_time(rng: random.Random) -> str:
    return f"{rng.randint(8, 18):02d}:{rng.choice((0, 30)):02d}"


def make_world(rng: random.Random, *, n_pages: int = 6) -> World:
    firsts = rng.sample(FIRST, 5)
    names = [f"{f} {s}" for f in firsts for s in rng.sample(LAST, 2)]
    phones = rng.sample(range(100, 1000), len(names))
    contacts = tuple(
        Contact(f"c{i + 1}", n, f"+1-555-0{p}") for i, (n, p) in enumerate(zip(names, phones, strict=False))
    )
    events = tuple(
        Event(f"ev{i + 1}", t, p, random_time(rng))
        for i, (t, p) in enumerate(zip(rng.sample(EVENTS, 6), rng.sample(PLACES, 6), strict=False))
    )
    mails = []
    for item in ITEMS:
        for sender in rng.sample(names, 2):
            mails.append(Mail(f"m{len(mails) + 1}", sender, item, random_code(rng)))
    figures = {}
    for qty in QTYS:
        for ent in ENTITIES:
            now = rng.randint(2000, 90000)
            figures[(qty, ent)] = {
                **{y: now - rng.randint(50, 1500) * (CURRENT_YEAR - y) // 5 for y in YEARS},
                CURRENT_YEAR: now,
            }
    files = {}
    for name in FILES:
        pages = [f"{name} p{k + 1}: minutes of week {rng.randint(1, 52)}" for k in range(n_pages)]
        files[name] = tuple(pages)
    return World(contacts, events, tuple(mails), figures, files)


def with_pages(world: World, name: str, n: int) -> World:
    """The world with file ``name`` cut or padded to ``n`` pages."""
    pages = list(world.files[name][:n])
    pages += [f"{name} p{k + 1}: blank" for k in range(len(pages), n)]
    return World(world.contacts, world.events, world.mails, world.figures, {**world.files, name: tuple(pages)})


def with_file_item(world: World, name: str, item: str, value: str, page: int) -> World:
    """The world with ``the <item> is <value>`` written on ``page`` (1-based) of file ``name``."""
    pages = list(world.files[name])
    pages[page - 1] += f"; the {item} is {value}"
    return World(world.contacts, world.events, world.mails, world.figures, {**world.files, name: tuple(pages)})
