"""The OPOD experiment (porch_jax/opod/experiment.py) from the command line:

    python -m launch.pipeline --config=experiments/quickstart.py [--config.run_dir=runs/qs2]
    python -m launch.pipeline --config=experiments/quickstart.py:seed_set=3    # one seed set
    python -m launch.pipeline --config=experiments/quickstart.py:seed_sets=8   # eight sets and their report

The config file's ConfigDict (with the --config.KEY=VALUE overrides) becomes the typed ExperimentConfig
(porch_jax/opod/config.py) while absl parses the flags: an unknown key or a bad value is a flags error naming
it. The experiment reads only the typed config. A rerun with the same run_dir resumes: finished stages are
skipped, interrupted ones resume.
"""

from __future__ import annotations

from absl import app, logging

from porch_jax.opod.config import ExperimentConfig
from porch_jax.typed_config import ConfigError, define_config_flag

# Checked against the typed schema while absl parses the flags: an unknown key or a bad value is a flags error.
_CONFIG = define_config_flag("config", ExperimentConfig, "Experiment file (experiments/quickstart.py).", required=True)


def main(argv: list[str]) -> None:
    del argv
    logging.set_verbosity(logging.WARNING)  # keep the progress lines readable
    from porch_jax.opod import preflight

    # A wrong folder, tokenizer, endpoint or venv fails now, naming the key, before any stage (or JAX) starts.
    try:
        preflight.check_start(_CONFIG.value)
    except ConfigError as e:
        raise app.UsageError(str(e)) from None
    # Imported once the flags are parsed: the experiment pulls in JAX, transformers and the trainer (~10 s), and a
    # bad config key fails during flag parsing without paying for them.
    from porch_jax.opod import experiment

    experiment.run(_CONFIG.value)


if __name__ == "__main__":
    app.run(main)
