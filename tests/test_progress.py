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
