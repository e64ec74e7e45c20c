"""The workplace comparison of experiments/workplace_baselines.py with hosted models in both roles: the paper's
Gemini-3-Flash orchestrating every orchestrated system, and the argument's backbone executing every sub-agent
(gemini_3_flash, deepseek_v3_2 or deepseek_v4_flash; porch_jax/backends/providers.py `BACKBONES`).

    GEMINI_API_KEY=... DEEPSEEK_API_KEY=... python -m launch.rollout \\
        --config=experiments/workplace_baselines_hosted.py:deepseek_v4_flash --config.num_tasks=100

Hosted calls are slow and paid for: 100 tasks, 8 episodes in flight per system, one process; each episode's
orchestrator and sub-agent calls are recorded like the scripted ones, and a rerun resumes the finished episodes.
"""

from ml_collections import ConfigDict

from experiments.workplace_baselines import get_config as baselines_config
from porch_jax.backends.providers import ORCHESTRATOR_BACKBONE, backbone_endpoint
from porch_jax.typed_config import parse_arg


def get_config(arg: str | None = None) -> ConfigDict:
    a = parse_arg(arg, executor="deepseek_v4_flash")
    c = baselines_config()
    c.run_dir = f"runs/workplace_baselines_{a.executor}"
    c.num_tasks = 100
    c.processes = 1
    c.concurrency = 8
    c.episode_timeout_s = 1800.0
    c.orchestrator = ConfigDict(backbone_endpoint(ORCHESTRATOR_BACKBONE))
    c.executor = ConfigDict(backbone_endpoint(a.executor))
    return c
