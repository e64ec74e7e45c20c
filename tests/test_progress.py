"""The progress line long loops print (rate, ETA)."""

from __future__ import annotations


def test_progress_line_is_throttled_and_always_reports_the_end(monkeypatch):
    from porch_jax import progress

    clock = iter([0.0, 1.0, 10.0, 31.0, 32.0, 40.0])  # creation, then one reading per call
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    lines = []
    line = progress.ProgressLine(5, lines.append, every_s=30.0, unit="walks")
    for done in range(1, 6):
        line(done, f"walk {done}")
    # 31 s: due (3 walks in 31 s, 2 left); 32 s: not due; 40 s: the last walk
    assert lines == ["walk 3 | 0.10 walks/s, ETA 0:00:20", "walk 5 | 0.12 walks/s, ETA 0:00:00"]


def test_stage_times_sum_each_stage_over_the_processes_of_a_resumed_run(tmp_path, monkeypatch):
    from porch_jax import progress

    record = tmp_path / "stages.jsonl"
    clock = iter([0.0, 10.0, 25.0, 29.0, 100.0, 101.0])
    monkeypatch.setattr(progress.time, "time", lambda: next(clock))
    for pid, events in ((1, ("expert", "sft")), (2, ("expert", "sft", "eval"))):  # the first process is killed in sft
        monkeypatch.setattr(progress.os, "getpid", lambda pid=pid: pid)
        stages = progress.Stages(lambda line: None, record=record)
        for name in events:
            stages.should_run(name, done=name == "expert" and pid == 2)
    stages.end()
    with record.open("a") as f:
        f.write('{"stage": "torn')  # a write cut by a kill
    # expert: 10 s, then 4 s skipped on resume; sft: the killed process's part is not counted, the resumed one's 71
    assert progress.stage_times(record) == [("expert", 14.0), ("sft", 71.0), ("eval", 1.0)]
