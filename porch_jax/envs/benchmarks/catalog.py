"""The benchmarks by name and their items in file order (local files or the hub); splits.py and the package's
`load_tasks` build on it."""

from __future__ import annotations

import pathlib

from porch_jax.envs.benchmarks.base import Benchmark, BenchmarkTask, default_data_dir
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
