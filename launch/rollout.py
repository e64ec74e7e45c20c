"""Roll out systems on the workplace suite through the resumable runner and print the comparison.

    python -m launch.rollout --config=experiments/workplace_compare.py [--config.num_tasks=100]

Writes RUN_DIR/<system>.jsonl (one episode per line; rerun to resume), RUN_DIR/settings.json and
RUN_DIR/results.json (success with Wilson 95% intervals, paired deltas vs proactive, tokens and
steps per task, invalid-action rate).
"""

from __future__ import annotations

import time
from pathlib import Path

from absl import app
from ml_collections import config_flags

from porch_jax.rollout.compare import format_table, run_comparison, write_results

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file (experiments/<name>.py).", lock_config=True
)


def main(argv: list[str]) -> None:
    del argv
    cfg = _CONFIG.value
    if cfg is None:
        raise app.UsageError("--config=experiments/<name>.py is required")
    settings = {
        k: cfg[k].to_dict() if hasattr(cfg[k], "to_dict") else cfg[k]
        for k in (
            "num_tasks",
            "seed_start",
            "concurrency",
            "episode_timeout_s",
            "max_decisions",
            "budgets",
            "mixture",
            "expert",
            "subagent",
        )
    }
    start = time.perf_counter()
    rows = run_comparison(list(cfg.systems), settings, cfg.run_dir, processes=cfg.processes)
    table = format_table(rows)
    print(table)
    print(f"({cfg.num_tasks} tasks per system, {time.perf_counter() - start:.0f} s; records in {cfg.run_dir})")
    write_results(rows, Path(cfg.run_dir) / "results.json")


if __name__ == "__main__":
    app.run(main)
