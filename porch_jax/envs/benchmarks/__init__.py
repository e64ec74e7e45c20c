"""MACA's six benchmarks: loaders (local files or the hub), fixed train/test splits, scorers, evaluation.

tasks = load_tasks("gsm_hard", split="test")             # ../shared/data, Table 4 split
report = evaluate(BENCHMARKS["gsm_hard"], tasks, answer_fn)  # accuracy + avg token cost
"""

from __future__ import annotations

import pathlib

from porch_jax.envs.benchmarks.base import (
    Answer,
    Benchmark,
    BenchmarkTask,
    EvalReport,
    TaskResult,
    default_data_dir,
    evaluate,
)
from porch_jax.envs.benchmarks.code_tasks import HUMANEVAL, MBPP
from porch_jax.envs.benchmarks.math_tasks import GSM_HARD, SVAMP
from porch_jax.envs.benchmarks.qa_tasks import ARC_CHALLENGE, MMLU_PRO

BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (HUMANEVAL, MBPP, GSM_HARD, SVAMP, MMLU_PRO, ARC_CHALLENGE)}


def load_all_tasks(
    name: str, *, data_dir: pathlib.Path | str | None = None, source: str = "local"
) -> list[BenchmarkTask]:
    """Every item of a benchmark, in file order. source="hub" reads the same data with `datasets`."""
    benchmark = _get(name)
    if source == "local":
        rows = benchmark.read_local(pathlib.Path(data_dir) if data_dir is not None else default_data_dir())
    elif source == "hub":
        rows = _hub_rows(benchmark)
    else:
        raise ValueError(f"source must be 'local' or 'hub', got {source!r}")
    tasks = [benchmark.to_task(row, i) for i, row in enumerate(rows)]
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{name}: duplicate task ids in the data")
    return tasks


def load_tasks(
    name: str,
    split: str | None = None,
    *,
    data_dir: pathlib.Path | str | None = None,
    source: str = "local",
) -> list[BenchmarkTask]:
    """A benchmark's tasks; with split="train"/"test", those of the recorded Table 4 split, in its order."""
    tasks = load_all_tasks(name, data_dir=data_dir, source=source)
    if split is None:
        return tasks
    from porch_jax.envs.benchmarks.splits import load_splits  # lazy: `python -m ...splits` imports us

    wanted = load_splits()[name][split]
    by_id = {t.task_id: t for t in tasks}
    missing = [i for i in wanted if i not in by_id]
    if missing:
        raise ValueError(f"{name} {split}: {len(missing)} split ids are not in the data (first: {missing[:3]})")
    return [by_id[i] for i in wanted]


def _get(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise KeyError(f"unknown benchmark {name!r}; known: {sorted(BENCHMARKS)}")
    return BENCHMARKS[name]


def _hub_rows(benchmark: Benchmark) -> list[dict]:
    if benchmark.hub is None:
        raise ValueError(f"{benchmark.name} has no hub source")
    try:
        import datasets
    except ImportError:
        raise ImportError("source='hub' needs the `datasets` package") from None
    rows: list[dict] = []
    for split in benchmark.hub.splits:
        rows.extend(dict(r) for r in datasets.load_dataset(benchmark.hub.path, benchmark.hub.name, split=split))
    return [benchmark.hub_row(r) for r in rows]


__all__ = [
    "BENCHMARKS",
    "Answer",
    "Benchmark",
    "BenchmarkTask",
    "EvalReport",
    "TaskResult",
    "default_data_dir",
    "evaluate",
    "load_all_tasks",
    "load_tasks",
]
