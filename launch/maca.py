"""MACA end to end from the command line (the experiment itself: porch_jax/maca/experiment.py): GraphSpec prior
learning, token-aware GRPO, the Table 3 ablations with learning curves, the sweeps and analyses, the baselines on a
benchmark world, the oracle ceilings and (synthetic config) the LM-policy check.

    python -m launch.maca --config=experiments/maca_synthetic.py
    python -m launch.maca --config=experiments/maca_gsm_hard.py --config.backend.endpoint.urls="('http://host:8000',)"
    python -m launch.maca --config=experiments/maca_gsm_hard.py:humaneval --gate_only   # Fig. 8 only, no model

Writes RUN_DIR/results.json, RUN_DIR/tables.md and PNG figures; RUN_DIR/checkpoints holds the learned prior and
an Orbax checkpoint of every training run (system x seed, lambda-selection and sweep points), so the same command
after a crash resumes where the run stopped (RUN_DIR/config.json: another config there is refused).
The config's schema is porch_jax/maca/config.py `MacaConfig`; an unknown key or a bad value is a flags error
naming it.
"""

from __future__ import annotations

from absl import app, flags

from porch_jax.maca.config import MacaConfig
from porch_jax.typed_config import define_config_flag

_CONFIG = define_config_flag("config", MacaConfig, "Experiment config file (experiments/maca_*.py).", required=True)
_GATE_ONLY = flags.DEFINE_bool(
    "gate_only",
    False,
    "Only the gate's precision / recall against gamma (Fig. 8) on the "
    "held-out tasks: no agent call, no training (`experiment.gate_report`).",
)


def main(argv: list[str]) -> None:
    del argv
    # Imported once the flags are parsed: the experiment pulls in JAX (a flag error answers before it loads).
    from porch_jax.maca.experiment import gate_report, run, tables

    cfg = _CONFIG.value
    if _GATE_ONLY.value:
        gate_report(cfg)
        return
    results = run(cfg)
    print(tables(results))


if __name__ == "__main__":
    app.run(main)
