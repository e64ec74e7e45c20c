"""OPOD (RWR + λ·OPD) of the tiny orchestrator, starting from the SFT export.

    python -m launch.train --config=experiments/opod_tiny.py

The student starts from, and the frozen self-teacher stays at, the SFT weights (model.init_from).
Losses average within each decision, then over decisions (the paper's aggregation).
"""

import importlib.util
from pathlib import Path


def _sft_config():
    """experiments/sft_tiny.py, loaded by path (config files are not always imported as a package)."""
    spec = importlib.util.spec_from_file_location("sft_tiny", Path(__file__).with_name("sft_tiny.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def get_config():
    c = _sft_config()
    c.train.method.name = "opod"
    c.workdir = "runs/opod_tiny"
    c.model.init_from = "runs/sft_tiny/export"
    c.data.trajectories = "runs/sft_rollouts/trajectories.jsonl"
    c.data.hints = "runs/sft_rollouts/hints.jsonl"
    c.train.method.opd_weight = 1.0
    c.train.optimizer.learning_rate = 1e-5
    c.train.optimizer.warmup_steps = 10
    return c
