"""Roll out systems on the workplace suite through the resumable runner and print the comparison.

    python -m launch.rollout --config=experiments/workplace_compare.py [--config.num_tasks=100]

Writes RUN_DIR/<system>.jsonl (one episode per line; rerun to resume), RUN_DIR/settings.json and
RUN_DIR/results.json (success with Wilson 95% intervals, paired deltas vs proactive, tokens and
steps per task, invalid-action rate). The config's schema is porch_jax/rollout/compare.py `ComparisonConfig`;
an unknown key or a bad value is a flags error naming it.
"""

from __future__ import annotations

import time
from pathlib import Path

from absl import app

from porch_jax.rollout.compare import ComparisonConfig, format_table, run_comparison, write_results
from porch_jax.typed_config import define_config_flag

_CONFIG = define_config_flag(
    "config", ComparisonConfig, "Experiment config file (experiments/<name>.py).", required=True
)


def main(argv: list[str]) -> None:
    del argv
    cfg = _CONFIG.value
    start = time.perf_counter()
    rows = run_comparison(cfg)
    table = format_table(rows)
    print(table)
    print(f"({cfg.num_tasks} tasks per system, {time.perf_counter() - start:.0f} s; records in {cfg.run_dir})")
    write_results(rows, Path(cfg.run_dir) / "results.json")


if __name__ == "__main__":
    app.run(main)
