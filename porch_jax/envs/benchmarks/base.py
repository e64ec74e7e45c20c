"""Benchmark tasks, their registry entries, data location and the evaluation loop (accuracy + cost)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import pathlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

DATA_DIR_ENV = "PORCH_JAX_DATA_DIR"


@dataclasses.dataclass(frozen=True, eq=False)
class BenchmarkTask:
    """One item. `reference` is a completion a model could write that scores as correct."""

    benchmark: str
    task_id: str
    family: str  # "code" | "math" | "qa": selects the MACA agent pool
    prompt: str
    reference: str
    data: Mapping[str, Any]  # the fields the scorer needs (tests, entry point, numeric target, ...)


@dataclasses.dataclass(frozen=True)
class HubSource:
    """Where the same data lives on the Hugging Face hub (used only with source="hub")."""

    path: str
    name: str | None
    splits: tuple[str, ...]  # concatenated in this order


@dataclasses.dataclass(frozen=True)
class Benchmark:
    name: str
    family: str
    metric: str  # "accuracy" or "pass@1"
    read_local: Callable[[pathlib.Path], list[dict]]  # raw rows from the data dir
    to_task: Callable[[dict, int], BenchmarkTask]  # (raw row, row index) -> task; same for hub rows
    check: Callable[[BenchmarkTask, str], bool]  # is this completion correct?
    hub: HubSource | None = None
    hub_row: Callable[[dict], dict] = lambda row: row  # hub schema -> local schema


@dataclasses.dataclass(frozen=True)
class Answer:
    """What an answerer returns for one task: the final text and the tokens it spent on all calls."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def cost(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclasses.dataclass(frozen=True)
class TaskResult:
    task_id: str
    correct: bool
    cost: int


@dataclasses.dataclass(frozen=True)
class EvalReport:
    benchmark: str
    metric: str
    accuracy: float  # fraction correct (pass@1 for code: one sample per task)
    avg_cost: float  # mean prompt + completion tokens per task (the paper's "Avg Cost")
    results: tuple[TaskResult, ...]


def default_data_dir() -> pathlib.Path:
    """$PORCH_JAX_DATA_DIR, else ../shared/data beside the repository checkout."""
    if os.environ.get(DATA_DIR_ENV):
        return pathlib.Path(os.environ[DATA_DIR_ENV])
    return pathlib.Path(__file__).resolve().parents[3].parent / "shared" / "data"


def read_jsonl(path: pathlib.Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_parquet(path: pathlib.Path) -> list[dict]:
    import pyarrow.parquet as pq  # optional dependency: only the parquet benchmarks need it

    return pq.read_table(path).to_pylist()


def evaluate(
    benchmark: Benchmark,
    tasks: Sequence[BenchmarkTask],
    answer_fn: Callable[[BenchmarkTask], Answer],
    *,
    workers: int = 2,
) -> EvalReport:
    """Answers every task, then scores the answers in parallel (code scoring runs subprocesses)."""
    if not tasks:
        raise ValueError(f"{benchmark.name}: no tasks to evaluate")
    answers = [answer_fn(task) for task in tasks]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        verdicts = list(pool.map(lambda ta: benchmark.check(ta[0], ta[1].text), zip(tasks, answers, strict=False)))
    results = tuple(TaskResult(t.task_id, bool(v), a.cost) for t, a, v in zip(tasks, answers, verdicts, strict=False))
    return EvalReport(
        benchmark=benchmark.name,
        metric=benchmark.metric,
        accuracy=sum(r.correct for r in results) / len(results),
        avg_cost=sum(r.cost for r in results) / len(results),
        results=results,
    )
