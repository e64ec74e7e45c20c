"""Agent pools: the candidate agents of MACA's Table 5, one JSON file per task family.

A pool file is {"family": str, "description": str, "agents": [{"name", "description", "prompt"}]}.
`description` is what the sentence encoder embeds as the agent's e_i (Eq. 4); `prompt` is the system
prompt the agent runs with. Users extend a pool by passing their own files to `load_pool`.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Iterable, Iterator

import numpy as np

POOL_DIR = pathlib.Path(__file__).resolve().parent / "pools"
TASK_FAMILIES = ("qa", "math", "code")
FAMILIES = (*TASK_FAMILIES, "auxiliary")


@dataclasses.dataclass(frozen=True)
class Agent:
    name: str
    family: str
    description: str
    prompt: str

    @property
    def profile(self) -> str:
        """The text embedded as the agent's representation e_i."""
        return f"{self.name}: {self.description}"


@dataclasses.dataclass(frozen=True)
class AgentPool:
    """An ordered agent set O; an agent's position is its action index (STOP comes after all agents)."""

    agents: tuple[Agent, ...]

    def __post_init__(self) -> None:
        names = [a.name for a in self.agents]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"agent names must be unique in a pool; repeated: {duplicates}")

    def __len__(self) -> int:
        return len(self.agents)

    def __iter__(self) -> Iterator[Agent]:
        return iter(self.agents)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.agents)

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise KeyError(f"no agent named {name!r} in the pool") from None

    def family_mask(self, families: str | Iterable[str]) -> np.ndarray:
        """bool [N]: which agents belong to the given families."""
        wanted = {families} if isinstance(families, str) else set(families)
        return np.array([a.family in wanted for a in self.agents], dtype=bool)


def load_family(path: pathlib.Path | str) -> tuple[Agent, ...]:
    """Reads one pool file; a malformed file raises ValueError naming the file and the field."""
    path = pathlib.Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    family = _field(raw, "family", path, "")
    agents = raw.get("agents") if isinstance(raw, dict) else None
    if not isinstance(agents, list) or not agents:
        raise ValueError(f"{path}: 'agents' must be a non-empty list")
    return tuple(
        Agent(
            name=_field(a, "name", path, f"agents[{i}]."),
            family=family,
            description=_field(a, "description", path, f"agents[{i}]."),
            prompt=_field(a, "prompt", path, f"agents[{i}]."),
        )
        for i, a in enumerate(agents)
    )


def _field(obj: object, key: str, path: pathlib.Path, where: str) -> str:
    value = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{path}: {where}{key} must be a non-empty string")
    return value


def load_pool(families: Iterable[str] = FAMILIES, *, extra_files: Iterable[pathlib.Path | str] = ()) -> AgentPool:
    """The shipped pools of `families` (in that order), then the agents of any user pool files."""
    agents: list[Agent] = []
    for family in families:
        path = POOL_DIR / f"{family}.json"
        if not path.exists():
            raise KeyError(
                f"no shipped pool for family {family!r}; shipped: {sorted(p.stem for p in POOL_DIR.glob('*.json'))}"
            )
        agents.extend(load_family(path))
    for path in extra_files:
        agents.extend(load_family(path))
    return AgentPool(tuple(agents))
