"""GAIA and TaskCraft loaders on the hub-format fixtures (tests/fixtures/gaia/: own questions, answerable
from the corpus of test_gaia_tools.py), their row checks, and the hub path with ``datasets`` faked:
nothing downloads."""

from __future__ import annotations

import json
import pathlib
import re
import sys
import types

import pytest

from porch_jax.envs.gaia import CorpusFetcher, CorpusSearch, GaiaEnvironment, GaiaTask, load_gaia, load_taskcraft

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "gaia"
GAIA = FIXTURES / "gaia_validation_sample.jsonl"
TASKCRAFT = FIXTURES / "taskcraft_sample.jsonl"


def _rows(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _jsonl(path: pathlib.Path, rows: list) -> pathlib.Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gaia_rows_become_tasks():
    tasks = load_gaia(GAIA)
    assert [t.level for t in tasks] == [1, 1, 2, 2, 3, 3]
    assert tasks[0] == GaiaTask(
        "fixture-l1-capital", "Which city is the capital of Greenland?", "Nuuk", 1, None, "gaia"
    )
    assert tasks[0].text == tasks[0].question  # what the engine shows the orchestrator
    assert tasks[-1].file_name == "fixture-l3-attachment.csv"
    assert [t.task_id for t in load_gaia(GAIA, level=2)] == ["fixture-l2-population", "fixture-l2-islands"]
    assert load_gaia(str(GAIA)) == tasks


def test_a_loaded_task_is_scored_by_gaia_rules_in_the_environment():
    tasks = {t.task_id: t for t in load_gaia(GAIA)}
    env = GaiaEnvironment(CorpusSearch([]), CorpusFetcher([]))
    for task_id, answer, expected in [
        ("fixture-l2-population", "56,000", True),
        ("fixture-l2-islands", "greenland; iceland", True),
        ("fixture-l2-islands", "Greenland", False),
        ("fixture-l1-capital", "Nuuk.", True),
    ]:
        env.reset(tasks[task_id])
        assert env.score(answer).success is expected, (task_id, answer)


def test_json_list_and_parquet_files_load_as_jsonl_does(tmp_path):
    as_list = tmp_path / "gaia.json"
    as_list.write_text(json.dumps(_rows(GAIA)))
    assert load_gaia(as_list) == load_gaia(GAIA)
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = [{k: v for k, v in r.items() if k != "Annotator Metadata"} for r in _rows(GAIA)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "gaia.parquet")
    assert load_gaia(tmp_path / "gaia.parquet") == load_gaia(GAIA)


def test_taskcraft_rows_become_tasks_with_ids_that_survive_reordering(tmp_path):
    tasks = load_taskcraft(TASKCRAFT)
    assert [t.truth for t in tasks] == ["Nuuk", "56081", "Nordic", "323919"]  # "answer" spelling; a numeric truth
    assert [t.level for t in tasks] == [1, 2, 1, 3] and {t.source for t in tasks} == {"taskcraft"}
    assert all(t.task_id.startswith("taskcraft/") and t.file_name is None for t in tasks)
    assert len({t.task_id for t in tasks}) == 4
    reversed_file = _jsonl(tmp_path / "reversed.jsonl", _rows(TASKCRAFT)[::-1])
    assert load_taskcraft(reversed_file) == tasks[::-1]
    assert [t.truth for t in load_taskcraft(TASKCRAFT, level=1)] == ["Nuuk", "Nordic"]
    with_id = _jsonl(tmp_path / "with_id.jsonl", [{"id": 7, "question": "q?", "golden_answer": "a"}])
    assert load_taskcraft(with_id) == [GaiaTask("7", "q?", "a", None, None, "taskcraft")]


GOOD = {"task_id": "t1", "Question": "q?", "Level": 1, "Final answer": "a", "file_name": ""}


@pytest.mark.parametrize(
    "bad,message",
    [
        ({k: v for k, v in GOOD.items() if k != "Final answer"}, "missing field 'Final answer'"),
        ({**GOOD, "Question": "  "}, "field 'Question' is empty"),
        ({**GOOD, "Question": ["q"]}, "field 'Question' must be text, got list"),
        ({**GOOD, "Level": "hard"}, "field 'Level' must be an integer, got 'hard'"),
        ({**GOOD, "file_name": 3}, "field 'file_name' must be text, got int"),
        (["not", "an", "object"], "a row is a JSON object, got list"),
    ],
)
def test_a_bad_gaia_row_names_file_row_and_field(tmp_path, bad, message):
    path = _jsonl(tmp_path / "bad.jsonl", [GOOD, {**GOOD, "task_id": "t2"}, bad])
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}:3: {re.escape(message)}"):
        load_gaia(path)


def test_unreadable_lines_missing_taskcraft_fields_and_clashing_ids_are_errors(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n{oops\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:3: not JSON"):
        load_gaia(path)
    path = _jsonl(tmp_path / "tc.jsonl", [{"query": "q?", "golden_answer": "a"}, {"query": "q2?", "gold": "b"}])
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:2: missing field 'golden_answer' or 'answer'"):
        load_taskcraft(path)
    path = _jsonl(tmp_path / "dup.jsonl", [GOOD, GOOD, {**GOOD, "Final answer": "b"}])
    where = re.escape(str(path))
    with pytest.raises(ValueError, match=rf"^{where}:3: task id 't1' already names a different task \({where}:1\)"):
        load_gaia(path)
    assert len(load_gaia(_jsonl(tmp_path / "same.jsonl", [GOOD, GOOD]))) == 1  # a repeated row is one task
    strings = _jsonl(tmp_path / "strings.jsonl", [{**GOOD, "Level": "2"}])
    assert load_gaia(strings)[0].level == 2  # some hub revisions store the level as text
    listed = tmp_path / "object.json"
    listed.write_text(json.dumps(GOOD))
    with pytest.raises(ValueError, match="a .json task file is a list of rows, got dict"):
        load_gaia(listed)


def test_the_hub_is_refused_offline_and_without_datasets(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="HF_HUB_OFFLINE=1.*pass a local file"):
        load_gaia()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(RuntimeError, match="needs `datasets`.*pass a local file"):
        load_taskcraft()


def test_the_hub_path_maps_hub_rows(monkeypatch):
    calls = []

    def load_dataset(name, *args, **kwargs):
        calls.append((name, args, kwargs))
        return _rows(GAIA) if name == "gaia-benchmark/GAIA" else _rows(TASKCRAFT)

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    assert load_gaia(level=3) == load_gaia(GAIA, level=3)
    assert load_taskcraft() == load_taskcraft(TASKCRAFT)
    assert calls == [
        ("gaia-benchmark/GAIA", ("2023_all",), {"split": "validation"}),
        ("PersonalAILab/TaskCraft", (), {"data_files": "pure_qa.jsonl", "split": "train"}),
    ]
    bad = [{**GOOD, "Level": None, "Question": None}]
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=lambda *a, **k: bad))
    with pytest.raises(ValueError, match="^gaia-benchmark/GAIA row 1: missing field 'Question'"):
        load_gaia()
