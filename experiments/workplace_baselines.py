"""Workplace comparison of POrchestra with the paper's inference baselines: proactive, lifecycle re-orchestration,
ReAct, Orchestra-o1 (parallel delegation), Skill-MAS / AutoAgents (one offline plan) and MAS² (plan, execute,
rectify), on the same seeded tasks (paired) as experiments/workplace_compare.py.

    python -m launch.rollout --config=experiments/workplace_baselines.py
    python -m launch.rollout --config=experiments/workplace_baselines.py --config.num_tasks=100

Every knob is workplace_compare's (the schema is porch_jax/rollout/compare.py `ComparisonConfig`); only the systems
and the run directory differ, so the two runs never share a settings.json. The baselines' mechanisms are described
in porch_jax/rollout/config.py.
"""

from ml_collections import ConfigDict

from experiments.workplace_compare import get_config as compare_config

SYSTEMS = ("proactive", "lifecycle", "react", "orchestra_o1", "skill_mas", "mas2")


def get_config() -> ConfigDict:
    c = compare_config()
    c.run_dir = "runs/workplace_baselines"
    c.systems = SYSTEMS
    return c
