"""The quickstart (experiments/quickstart.py) over eight seed sets, the sets as the reported unit.

    python -m launch.pipeline --config=experiments/quickstart_seeds.py

Runs the whole loop once per seed set in runs/quickstart_seeds/seed_set_k (porch_jax/eval/seed_sets.py
`with_seed_set`: set 0 is the quickstart as written; set k adds 10k to every seed and 1,000k to the SFT
rollouts' task seeds) and writes runs/quickstart_seeds/seed_sets.{md,json,png}: each method's mean
held-out success and spread over the sets, and the paired differences (OPOD - RWR, RWR - SFT, ...) with
95% t-intervals over sets. One run per set was the unit before (docs/results/opod_quickstart.md), and
single runs moved with float-level rounding; the mean over sets is the claim to check. ~8x the
quickstart's time (~100 min on 2 cores with the learning-rate grid: ~50 min without it, ~50 min more for
the grid). Four sets left OPOD - RWR's interval over sets including zero; eight exclude it, at the
configured learning rate and with each method's rate chosen on validation (README).
"""

from __future__ import annotations

from ml_collections import ConfigDict

from experiments import quickstart


def get_config() -> ConfigDict:
    c = quickstart.get_config()
    c.run_dir = "runs/quickstart_seeds"
    c.seed_sets = tuple(range(8))
    return c
