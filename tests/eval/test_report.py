"""The results table (Wilson intervals, paired differences, tokens) and the plots."""

from __future__ import annotations

import json

from porch_jax.eval import plots, report
from porch_jax.rollout.pairs import wilson
from tests.eval.outcomes import records_with


def test_table_intervals_and_paired_differences(tmp_path):
    records = {
        "sft": records_with([0] * 70 + [1] * 30),
        "rwr": records_with([0] * 50 + [1] * 50),
        "opod": records_with([0] * 20 + [1] * 80),
    }
    rows = report.summaries(records, reference="sft")
    assert [r.system for r in rows] == ["sft", "rwr", "opod"]
    assert rows[2].ci == wilson(80, 100) and rows[0].delta is None
    assert rows[2].delta[0] == 0.5 and rows[2].delta[1] > 0.35
    better = report.compare(records, "opod", "rwr")
    assert better.separated and better.delta[0] == 0.3
    close = report.compare({"a": records_with([1] * 52 + [0] * 48), "b": records_with([1] * 50 + [0] * 50)}, "a", "b")
    assert not close.separated
    table = report.format_table(rows, records, [better, close])
    assert "| opod | 100 | 0.800 | [0.711, 0.867] | +0.500" in table and "| 1450 | 350 |" in table
    assert "opod - rwr: paired +0.300" in table and "intervals separated" in table and "intervals overlap" in table
    skipped = report.format_table(rows, records, [], {"opd_empty": "no flagged decision"})
    assert "| opd_empty | 0 | not trained: no flagged decision |" in skipped  # a configured method keeps its row
    report.write_results(rows, [better], tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["comparisons"][0]["better"] == "opod"


def test_plots_are_written(tmp_path):
    runs = {
        "rwr": [{"step": s, "ce": 1.0 / s} for s in range(1, 20)],
        "opod": [{"step": s, "ce": 1.0 / s, "opd": 0.5 / s} for s in range(1, 20)],
    }
    assert plots.plot_curves(runs, tmp_path / "c.png").stat().st_size > 1000
    rows = report.summaries({"sft": records_with([0, 1, 1]), "opod": records_with([1, 1, 1])}, reference="sft")
    assert plots.plot_success(rows, tmp_path / "s.png").stat().st_size > 1000
    (tmp_path / "m.jsonl").write_text('{"step": 1, "ce": 2.0}\n')
    assert plots.read_metrics(tmp_path / "m.jsonl") == [{"step": 1, "ce": 2.0}]
    assert plots.read_metrics(tmp_path / "none.jsonl") == []


def test_blind_spot_checks_see_the_expert_blind_spots_and_their_absence():
    import asyncio
    import dataclasses

    from porch_jax.envs.workplace import ExpertConfig, TaskMixture
    from porch_jax.eval import suite as suite_lib

    suite = suite_lib.SuiteConfig(
        max_decisions=20,
        max_evidence_chars=160,
        mixture=TaskMixture(
            templates={"history": 1.0, "mail_text": 1.0, "file_text": 1.0}, p_change=0.0, p_distract=0.0
        ),
        expert=ExpertConfig(p_omit_context=0.0, p_omit_tool=0.0, p_misscope=0.0, p_underbudget=0.0),
    )
    tasks = suite_lib.task_set(suite_lib.TaskSet(num_tasks=30, seed_start=0), suite)

    def rates(blind_spots):
        engine = suite_lib.expert_engine(
            dataclasses.replace(suite, expert=dataclasses.replace(suite.expert, blind_spots=blind_spots))
        )

        async def run():
            return [await engine.run(t, episode_id=t.task_id) for t in tasks]

        return report.blind_spot_rates(asyncio.run(run()))

    blind, clear = rates(("handover_2back", "archive", "long_file")), rates(())
    assert blind["archive granted"][0] == 0 and clear["archive granted"][0] == clear["archive granted"][1] > 0
    assert blind["known facts handed over"][0] == 0
    assert clear["known facts handed over"][0] == clear["known facts handed over"][1] > 0
    assert clear["file budget covers the pages"][0] == clear["file budget covers the pages"][1] > 0
    assert blind["file budget covers the pages"][0] < blind["file budget covers the pages"][1]
    assert "archive granted" in report.format_blind_spots({"expert": []})
