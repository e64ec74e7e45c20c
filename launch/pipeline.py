"""The OPOD experiment (porch_jax/opod/experiment.py) from the command line:

    python -m launch.pipeline --config=experiments/quickstart.py [--config.run_dir=runs/qs2]
    python -m launch.pipeline --config=experiments/quickstart_seeds.py

A rerun with the same run_dir resumes: finished stages are skipped, interrupted ones resume.
"""

from __future__ import annotations

from absl import app, logging

from porch_jax.opod.config import ExperimentConfig
from porch_jax.typed_config import define_config_flag

# Checked against the typed schema while absl parses the flags: an unknown key or a bad value is a flags error.
_CONFIG = define_config_flag("config", ExperimentConfig, "Experiment file (experiments/quickstart.py).", required=True)


def main(argv: list[str]) -> None:
    del argv
    logging.set_verbosity(logging.WARNING)  # keep the progress lines readable
    from porch_jax.opod import experiment

    experiment.run(_CONFIG.config_dict)


if __name__ == "__main__":
    app.run(main)
