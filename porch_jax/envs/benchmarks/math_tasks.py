"""GSM-Hard and SVAMP: math word problems scored by numeric match of the extracted final answer."""

from __future__ import annotations

import json

from porch_jax.envs.benchmarks.answers import extract_number, format_number, numbers_match
from porch_jax.envs.benchmarks.base import Benchmark, BenchmarkTask, HubSource, read_parquet

MATH_INSTRUCTION = "Solve the problem. End with 'The answer is <number>.'"


def _math_task(benchmark: str, task_id: str, question: str, target: float, extra: dict) -> BenchmarkTask:
    return BenchmarkTask(
        benchmark=benchmark,
        task_id=task_id,
        family="math",
        prompt=f"{question.strip()}\n\n{MATH_INSTRUCTION}",
        reference=f"The answer is {format_number(target)}.",
        data={"target": float(target), "question": question, **extra},
    )


def check_math(task: BenchmarkTask, completion: str) -> bool:
    return numbers_match(extract_number(completion), task.data["target"])


def _gsm_hard_task(row: dict, index: int) -> BenchmarkTask:
    # The file has no ids: a row's position is its id (the splits file records the file's hash).
    return _math_task("gsm_hard", str(index), row["input"], row["target"], {"code": row["code"]})


def _svamp_task(row: dict, index: int) -> BenchmarkTask:
    question = f"{row['Body'].strip()} {row['Question'].strip()}"
    return _math_task("svamp", row["ID"], question, row["Answer"], {"equation": row["Equation"], "type": row["Type"]})


GSM_HARD = Benchmark(
    name="gsm_hard",
    family="math",
    metric="accuracy",
    read_local=lambda d: read_parquet(d / "gsm_hard" / "test.parquet"),
    to_task=_gsm_hard_task,
    check=check_math,
    hub=HubSource("reasoning-machines/gsm-hard", None, ("train",)),
)

SVAMP = Benchmark(
    name="svamp",
    family="math",
    metric="accuracy",
    read_local=lambda d: json.loads((d / "svamp" / "SVAMP.json").read_text(encoding="utf-8")),
    to_task=_svamp_task,
    check=check_math,
    hub=HubSource("ChilleD/SVAMP", None, ("train", "test")),
)
