"""The viewer's index: summary per system, formatted scores, escaped record text, filters over what is present."""

from __future__ import annotations

import re
import subprocess
import sys
from html import unescape
from pathlib import Path

from porch_jax.eval.viewer import page_name, render_episode, write_site
from porch_jax.eval.viewer_index import error_kinds, reason_kind, system_summaries
from porch_jax.trajectories import DecisionRecord, EpisodeRecord, Outcome, RoleCost, SubStep, TrajectoryStore

REPO = Path(__file__).resolve().parents[2]
EVIL = "<script>alert(1)</script>"


def _episode(
    system: str,
    task: str,
    score: float,
    reason: str = "ok",
    *,
    tokens: tuple[int, int] = (100, 20),
    invalid: dict | None = None,
    retryable: bool = False,
    decisions: list[DecisionRecord] | None = None,
) -> EpisodeRecord:
    meta: dict = {"steps": 3}
    if invalid is not None:
        meta["invalid_kinds"] = invalid
    return EpisodeRecord(
        episode_id=f"{system}/{task}",
        task_id=task,
        env="workplace",
        system=system,
        config_hash="c",
        seed=0,
        outcome=Outcome(score == 1.0 and not retryable, score, reason, retryable),
        cost={"orchestrator": RoleCost(1, *tokens)},
        decisions=decisions or [],
        meta=meta,
    )


def _store() -> list[EpisodeRecord]:
    """Two systems: alpha 2 of 3 (tokens 120, 220, 320), beta 0 of 2 plus one retryable attempt."""
    return [
        _episode("alpha", "t1", 1.0, tokens=(100, 20), invalid={"orchestrator": {"NoToolCall": 2}, "subagent": {}}),
        _episode("alpha", "t2", 1.0, tokens=(200, 20), invalid={"orchestrator": {}, "subagent": {}}),
        _episode("alpha", "t10", 2 / 3, "failed: text Greg the door code", tokens=(300, 20)),
        _episode(
            "beta",
            "t1",
            0.0,
            "total_budget_exhausted; failed: answer 42",
            invalid={"orchestrator": {}, "subagent": {"MalformedJSON": 1}},
        ),
        _episode("beta", "t2", 0.5, "error: TimeoutError: episode timed out after 60s"),
        _episode("beta", "t2", 0.0, "backend_unavailable: ServerDown: every server down", retryable=True),
    ]


def _cells(html: str, table_id: str) -> list[list[str]]:
    body = re.search(rf'<table[^>]*id="{table_id}".*?<tbody>(.*?)</tbody>', html, re.S).group(1)
    return [
        [unescape(re.sub("<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)
    ]


def _options(html: str, name: str) -> list[str]:
    select = re.search(rf'<select data-filter="{name}"[^>]*>(.*?)</select>', html, re.S).group(1)
    return [unescape(v) for v in re.findall(r'<option value="([^"]*)"', select)]


def test_summary_gives_success_rate_and_tokens_per_task_per_system(tmp_path):
    write_site(_store(), tmp_path)
    rows = {r[0]: r[1:] for r in _cells((tmp_path / "index.html").read_text(), "summary")}
    # episodes, tasks, successes, success rate, mean score, tokens / task, decisions / task, invalid, retryable
    assert rows["alpha"] == ["3", "3", "2", "0.67", "0.89", "220", "0.0", "2", "0"]
    assert rows["beta"] == ["2", "2", "0", "0.00", "0.25", "120", "0.0", "1", "1"]
    assert rows["all systems"] == ["5", "3", "2", "0.40", "0.63", "180", "0.0", "3", "1"]
    assert [s.system for s in system_summaries(_store()[:3])] == ["alpha"]  # one system: no "all" row


def test_rows_format_scores_link_pages_and_sort_tasks_naturally(tmp_path):
    records = _store()
    pages = write_site(records, tmp_path, title="compare <run>", results_href="../results.html")
    index = (tmp_path / "index.html").read_text()
    rows = _cells(index, "episodes")
    assert [(r[1], r[2], r[3], r[4]) for r in rows] == [
        ("alpha", "t1", "success", "1.00"),
        ("alpha", "t2", "success", "1.00"),
        ("alpha", "t10", "failure", "0.67"),
        ("beta", "t1", "failure", "0.00"),
        ("beta", "t2", "failure", "0.50"),
        ("beta", "t2", "retryable", "0.00"),
    ]
    assert "0.666" not in re.sub(r'data-v="[^"]*"', "", index)  # raw scores only as sort keys
    assert f'data-v="{2 / 3!r}"' in index  # sorting uses the exact score
    for page in pages:
        assert f'<a href="{page.name}">' in index
        assert '<a class="back" href="index.html">' in page.read_text()
    # the finished beta/t2 keeps the id's page name; its retryable attempt gets one of its own
    assert pages[4].name == page_name("beta/t2") and pages[5].name not in {p.name for p in pages[:5]}
    assert '<a class="back" href="../results.html">← results</a>' in index
    assert "<h1>compare &lt;run&gt;</h1>" in index


def test_filters_list_the_systems_outcomes_reasons_and_kinds_present(tmp_path):
    write_site(_store(), tmp_path)
    index = (tmp_path / "index.html").read_text()
    assert _options(index, "system") == ["", "alpha", "beta"]
    assert _options(index, "outcome") == ["", "success", "failure", "retryable"]
    assert _options(index, "reason") == [
        "",
        "backend_unavailable: ServerDown",
        "error: TimeoutError",
        "failed",
        "total_budget_exhausted",
    ]
    assert _options(index, "kinds") == ["", "*", "orchestrator: NoToolCall", "subagent: MalformedJSON"]
    assert 'data-system="beta" data-outcome="retryable" data-reason="backend_unavailable: ServerDown"' in index
    assert 'data-kinds="orchestrator: NoToolCall"' in index


def test_reason_kinds_group_reasons_and_error_kinds_fall_back_to_the_record():
    def kind(reason: str) -> str:
        return reason_kind(Outcome(False, 0.0, reason))

    assert kind("failed: text Greg the phone; answer 42") == "failed"
    assert kind("expected '4', got '5'") == "expected …, got …"
    assert kind("error: episode timed out after 60s") == "error"
    assert kind("not graded: the instance has no tests") == "not graded"
    assert kind("") == "(none)"
    invalid = DecisionRecord(0, [], "oops", [], [], None, "", parse_error="no tool call")
    step = SubStep(0, 0, "error", "<tool_call>{", None, "malformed")
    uncounted = _episode(
        "a", "t", 0.0, decisions=[invalid, DecisionRecord(1, [], "", [], [], {"name": "x"}, "", 0, [step])]
    )
    assert error_kinds(uncounted) == {"orchestrator: invalid": 1, "subagent: error": 1}


def test_record_text_is_escaped_everywhere(tmp_path):
    decision = DecisionRecord(
        0,
        [{"role": "user", "content": EVIL}],
        EVIL,
        [],
        [],
        None,
        EVIL,
        None,
        [SubStep(0, 0, "tool", EVIL, EVIL, EVIL)],
        parse_error=EVIL,
        meta={"clock": 0, "event": EVIL},
    )
    record = _episode(EVIL, EVIL, 0.0, EVIL, invalid={"orchestrator": {EVIL: 1}}, decisions=[decision])
    record.meta["answer"] = EVIL
    page = write_site([record], tmp_path, title=EVIL, results_href='"><script>x()</script>')[0]
    index = (tmp_path / "index.html").read_text()
    assert index.count("<script>") == 1 and "alert(1)" in index  # the viewer's own script only; the text shows
    assert "<script" not in render_episode(record) and "<script" not in page.read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.read_text()


def test_view_renders_several_stores_and_run_dirs(tmp_path):
    records = _store()
    run = tmp_path / "run"
    TrajectoryStore(run / "alpha.jsonl").append_many(records[:3])
    TrajectoryStore(run / "eval" / "beta.jsonl").append_many(records[3:])
    (run / "attribution.jsonl").write_text('{"episode_id": "alpha/t1", "decision": 0, "status": "ok"}\n')

    def view(*stores: Path, out: str) -> str:
        cmd = [sys.executable, "-m", "launch.view", *(f"--store={s}" for s in stores), f"--out={tmp_path / out}"]
        subprocess.run(cmd, check=True, cwd=REPO, capture_output=True, text=True)
        return (tmp_path / out / "index.html").read_text()

    by_files = view(run / "alpha.jsonl", run / "eval" / "beta.jsonl", out="files")
    by_dir = view(run, out="dir")
    for index in (by_files, by_dir):
        assert len(_cells(index, "episodes")) == 6  # the retryable attempt included, attribution rows not
        assert [r[0] for r in _cells(index, "summary")] == ["alpha", "beta", "all systems"]
