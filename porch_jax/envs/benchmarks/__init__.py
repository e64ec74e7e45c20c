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
from porch_jax.envs.benchmarks.catalog import BENCHMARKS, load_all_tasks
from porch_jax.envs.benchmarks.splits import load_splits, load_subsets


def load_tasks(
    name: str,
    split: str | None = None,
    *,
    data_dir: pathlib.Path | str | None = None,
    source: str = "local",
    subset: bool = False,
) -> list[BenchmarkTask]:
    """A benchmark's tasks; with split="train"/"test", those of the recorded Table 4 split, in its order; with
    `subset`, only the split's recorded CPU-sized subset (splits/maca_cpu_subsets.json)."""
    tasks = load_all_tasks(name, data_dir=data_dir, source=source)
    if split is None:
        if subset:
            raise ValueError("subset=True needs a split ('train' or 'test')")
        return tasks
    wanted = (load_subsets() if subset else load_splits())[name][split]
    by_id = {t.task_id: t for t in tasks}
    missing = [i for i in wanted if i not in by_id]
    if missing:
        raise ValueError(f"{name} {split}: {len(missing)} split ids are not in the data (first: {missing[:3]})")
    return [by_id[i] for i in wanted]


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
