"""GAIA's validation set and TaskCraft as ``GaiaTask``s, from a local file or the Hugging Face hub.

Both loaders read rows in the hub's own format, so a file saved from the hub (or a fixture in
tests/fixtures/gaia/) loads exactly as the hub does: JSONL, a JSON list of rows, or parquet (pyarrow).
The hub is asked only when no file is given, ``datasets`` is importable and ``HF_HUB_OFFLINE`` is not "1":
evaluation machines run offline, and a run that would need a download says so at once instead of failing
deep inside ``datasets``. A bad row is a ``ValueError`` naming file:row and the field, because a benchmark
silently missing tasks reports a wrong score.

GAIA rows (``gaia-benchmark/GAIA``, config ``2023_all``): ``task_id``, ``Question``, ``Final answer``
(required), ``Level``, ``file_name`` (optional; ``""`` means no attachment). ``Annotator Metadata`` and
``file_path`` are not read.

TaskCraft rows (``PersonalAILab/TaskCraft``, ``pure_qa.jsonl``): the question from ``query`` (or
``question``), the truth from ``golden_answer`` (or ``answer``, the spelling of the dataset card's own
example), the level from ``valid_hop`` (tool-invocation steps; optional). Its rows carry no id, so the id
is ``task_id`` or ``id`` when present, else ``taskcraft/`` and a digest of question and truth: stable when
the file is reordered or filtered, as resuming a run by task id needs.

A task id seen twice is one task when both rows say the same, and an error when they differ.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GAIA_HUB = "gaia-benchmark/GAIA"
GAIA_CONFIG = "2023_all"
TASKCRAFT_HUB = "PersonalAILab/TaskCraft"
TASKCRAFT_FILE = "pure_qa.jsonl"


@dataclass(frozen=True)
class GaiaTask:
    """One question and its truth, as the GAIA environment runs and scores it."""

    task_id: str
    question: str
    truth: str
    level: int | None = None
    file_name: str | None = None  # GAIA's attachment, named as in the split's folder; None without one
    source: str = "gaia"

    @property
    def text(self) -> str:
        """The task as the engine states it to the orchestrator."""
        return self.question


Rows = Iterator[tuple[str, Any]]  # (where: "file:row" for error messages, row)


def load_gaia(
    path: str | os.PathLike | None = None, *, split: str = "validation", level: int | None = None
) -> list[GaiaTask]:
    """GAIA's tasks from ``path`` (hub row format), or from the hub's ``split`` when ``path`` is None;
    only ``level`` 1, 2 or 3 when given."""
    rows = _file_rows(path) if path is not None else _hub_rows(GAIA_HUB, GAIA_CONFIG, split=split)
    return _unique(((where, _gaia_task(where, row)) for where, row in _objects(rows)), level)


def load_taskcraft(path: str | os.PathLike | None = None, *, level: int | None = None) -> list[GaiaTask]:
    """TaskCraft's tasks from ``path`` (``pure_qa.jsonl`` row format), or from the hub's ``pure_qa.jsonl``
    when ``path`` is None; only those needing ``level`` tool-invocation steps when given."""
    rows = _file_rows(path) if path is not None else _hub_rows(TASKCRAFT_HUB, data_files=TASKCRAFT_FILE, split="train")
    return _unique(((where, _taskcraft_task(where, row)) for where, row in _objects(rows)), level)


def _gaia_task(where: str, row: Mapping[str, Any]) -> GaiaTask:
    return GaiaTask(
        task_id=_text(where, row, ("task_id",)),
        question=_text(where, row, ("Question",)),
        truth=_text(where, row, ("Final answer",)),
        level=_level(where, row, "Level"),
        file_name=_file_name(where, row),
        source="gaia",
    )


def _taskcraft_task(where: str, row: Mapping[str, Any]) -> GaiaTask:
    question = _text(where, row, ("query", "question"))
    truth = _text(where, row, ("golden_answer", "answer"))
    given = next((row[k] for k in ("task_id", "id") if row.get(k) not in (None, "")), None)
    digest = hashlib.sha256(json.dumps([question, truth]).encode()).hexdigest()[:16]
    task_id = str(given) if given is not None else f"taskcraft/{digest}"
    return GaiaTask(task_id, question, truth, _level(where, row, "valid_hop"), None, "taskcraft")


# ---- rows ------------------------------------------------------------------------------------------------
def _file_rows(path: str | os.PathLike) -> Rows:
    """Rows of a .json (a list), .parquet or any other (JSONL) file, numbered from 1: by line for JSONL,
    by position otherwise."""
    path = Path(path)
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportError(f"{path}: reading parquet needs pyarrow; or pass the rows as JSONL") from None
        yield from ((f"{path}:{n}", row) for n, row in enumerate(pq.read_table(path).to_pylist(), 1))
    elif path.suffix == ".json":
        rows = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(rows, list):
            raise ValueError(f"{path}: a .json task file is a list of rows, got {type(rows).__name__}")
        yield from ((f"{path}:{n}", row) for n, row in enumerate(rows, 1))
    else:
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield f"{path}:{n}", json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None


def _hub_rows(name: str, *args: str, **kwargs: str) -> Rows:
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise RuntimeError(f"HF_HUB_OFFLINE=1, so {name} cannot come from the hub: pass a local file of its rows")
    try:
        import datasets
    except ImportError:
        raise RuntimeError(f"loading {name} from the hub needs `datasets`: install it, or pass a local file") from None
    yield from ((f"{name} row {n}", row) for n, row in enumerate(datasets.load_dataset(name, *args, **kwargs), 1))


def _objects(rows: Rows) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for where, row in rows:
        if not isinstance(row, Mapping):
            raise ValueError(f"{where}: a row is a JSON object, got {type(row).__name__}")
        yield where, row


def _unique(tasks: Iterable[tuple[str, GaiaTask]], level: int | None) -> list[GaiaTask]:
    """The tasks at ``level`` (all when None), each id once; every row is checked, kept or not."""
    seen: dict[str, tuple[str, GaiaTask]] = {}
    for where, task in tasks:
        first_where, first = seen.setdefault(task.task_id, (where, task))
        if first != task:
            raise ValueError(f"{where}: task id {task.task_id!r} already names a different task ({first_where})")
    return [task for _, task in seen.values() if level is None or task.level == level]


# ---- fields ----------------------------------------------------------------------------------------------
def _text(where: str, row: Mapping[str, Any], names: tuple[str, ...]) -> str:
    """The first of ``names`` the row has, as text (numbers allowed: some truths are stored as numbers)."""
    name = next((n for n in names if row.get(n) is not None), None)
    if name is None:
        raise ValueError(f"{where}: missing field {' or '.join(map(repr, names))}")
    value = row[name]
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"{where}: field {name!r} must be text, got {type(value).__name__}")
    if not str(value).strip():
        raise ValueError(f"{where}: field {name!r} is empty")
    return str(value)


def _level(where: str, row: Mapping[str, Any], name: str) -> int | None:
    value = row.get(name)
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    raise ValueError(f"{where}: field {name!r} must be an integer, got {value!r}")


def _file_name(where: str, row: Mapping[str, Any]) -> str | None:
    value = row.get("file_name")
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"{where}: field 'file_name' must be text, got {type(value).__name__}")
    return value
