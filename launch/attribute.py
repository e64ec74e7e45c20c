"""The attribution job from the command line: every decision of a trajectory store through a served GRM.

    VLLM_API_KEY=KEY python -m launch.serve --model_dir=MODEL --port=8000 &    # the frozen base model
    VLLM_API_KEY=KEY python -m launch.attribute --config=experiments/attribute_smollm2.py \
        --config.records=runs/smollm2_baseline/zero_shot.jsonl --config.out=runs/smollm2_baseline/attribution.jsonl

Writes one row per decision to ``out`` (porch_jax/attribution/job.py: "ok" with FLAG and HINT, "error" with the
reason, "skipped" where no sub-agent feedback followed); a rerun judges only what is missing. The schema is
porch_jax/attribution/job.py `AttributionConfig`; the GRM's key is read from the variable its endpoint names.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from absl import app

from porch_jax.attribution.job import AttributionConfig, run_job
from porch_jax.typed_config import define_config_flag

_CONFIG = define_config_flag(
    "config", AttributionConfig, "Experiment file (experiments/attribute_smollm2.py).", required=True
)


def main(argv: list[str]) -> None:
    del argv
    cfg = _CONFIG.value
    if not Path(cfg.records).is_file():
        raise app.UsageError(f"config.records: no trajectory store at {cfg.records}")
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # not one INFO line per request
    s = asyncio.run(run_job(cfg))
    print(
        f"{s.total} decisions: {s.judged} judged now ({s.skipped_done} done earlier), {s.attributable} attributable, "
        f"{s.errors} errors, {s.wall_s:.0f} s; rows in {cfg.out}"
    )


if __name__ == "__main__":
    app.run(main)
