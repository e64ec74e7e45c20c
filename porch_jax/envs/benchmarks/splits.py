"""The fixed train/test splits of MACA's Table 4, recorded as id lists in splits/maca_table4.json.

The paper gives only the sizes. Each split is a seeded sample (random.Random with a string seed, stable
across Python versions) of the benchmark's items: where train + test equals the file's size (HumanEval,
MBPP, SVAMP, ARC-C) it partitions the whole file; for GSM-Hard (1,000 of 1,319) and MMLU-Pro (1,218 of
12,032) it is a subset. MBPP's 587 + 387 covers all 974 problems, so its test split is not the standard
test ids 11-510. The file records each source file's sha256; `python -m porch_jax.envs.benchmarks.check_splits`
regenerates the splits from the data and compares.

CPU-sized runs (the real-agent MACA table) use a fixed subset of each split, recorded in
splits/maca_cpu_subsets.json: `SUBSET_SIZES` ids drawn, seeded, from the recorded split's ids (so the subset needs
no data to regenerate, only the split file), kept in the split's order.
"""

from __future__ import annotations

import functools
import hashlib
import json
import pathlib
import random

from porch_jax.envs.benchmarks.catalog import load_all_tasks

SPLITS_FILE = pathlib.Path(__file__).resolve().parent / "splits" / "maca_table4.json"
SUBSETS_FILE = SPLITS_FILE.with_name("maca_cpu_subsets.json")
SUBSET_SIZES = {"train": 16, "test": 30}
SEED = 0
# (train, test) sizes from the paper's Table 4.
TABLE4 = {
    "humaneval": (96, 68),
    "mbpp": (587, 387),
    "gsm_hard": (611, 389),
    "svamp": (593, 407),
    "mmlu_pro": (731, 487),
    "arc_challenge": (689, 483),
}
SOURCE_FILES = {
    "humaneval": "humaneval/HumanEval.jsonl.gz",
    "mbpp": "mbpp/mbpp.jsonl",
    "gsm_hard": "gsm_hard/test.parquet",
    "svamp": "svamp/SVAMP.json",
    "mmlu_pro": "mmlu_pro/test.parquet",
    "arc_challenge": "arc_challenge/arc_challenge_test.jsonl",
}


def make_splits(data_dir: pathlib.Path, seed: int = SEED) -> dict:
    out: dict = {"seed": seed, "table4_sizes": {k: list(v) for k, v in TABLE4.items()}, "benchmarks": {}}
    for name, (n_train, n_test) in TABLE4.items():
        ids = [t.task_id for t in load_all_tasks(name, data_dir=data_dir)]
        order = {task_id: i for i, task_id in enumerate(ids)}
        chosen = random.Random(f"maca-table4:{seed}:{name}").sample(ids, n_train + n_test)
        source = data_dir / SOURCE_FILES[name]
        out["benchmarks"][name] = {
            "source_file": SOURCE_FILES[name],
            "source_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
            "n_items": len(ids),
            "train": sorted(chosen[:n_train], key=order.__getitem__),
            "test": sorted(chosen[n_train:], key=order.__getitem__),
        }
    return out


@functools.cache
def _load(path: pathlib.Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def load_splits(path: pathlib.Path = SPLITS_FILE) -> dict[str, dict]:
    """{benchmark: {"train": [ids], "test": [ids], "source_sha256": ..., ...}} from the recorded file."""
    return _load(path)["benchmarks"]


def make_subsets(splits: dict[str, dict], seed: int = SEED) -> dict:
    """{"seed", "sizes", "benchmarks": {name: {"train": [ids], "test": [ids]}}} from the recorded splits."""
    out: dict = {"seed": seed, "sizes": dict(SUBSET_SIZES), "benchmarks": {}}
    for name in TABLE4:
        out["benchmarks"][name] = {}
        for split, n in SUBSET_SIZES.items():
            ids = splits[name][split]
            chosen = set(random.Random(f"maca-cpu-subset:{seed}:{name}:{split}").sample(ids, n))
            out["benchmarks"][name][split] = [i for i in ids if i in chosen]
    return out


def load_subsets(path: pathlib.Path = SUBSETS_FILE) -> dict[str, dict]:
    """{benchmark: {"train": [ids], "test": [ids]}}: the recorded CPU-sized subsets of the Table 4 splits."""
    return _load(path)["benchmarks"]
