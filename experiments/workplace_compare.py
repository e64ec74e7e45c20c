"""Workplace comparison: proactive vs lifecycle re-orchestration vs ReAct, and the 7 ablations.

    python -m launch.rollout --config=experiments/workplace_compare.py
    python -m launch.rollout --config=experiments/workplace_compare.py --config.num_tasks=100

POrchestra's claim (paper, Sec. 4 and its ablations): proactive communication beats lifecycle re-orchestration
and ReAct, and each revision target and message signal carries part of the gain. 500 seeded tasks per system with
the scripted expert and scripted sub-agents, same tasks for every system (paired); about 90 s on 2 cores. Knobs:
num_tasks trades the intervals' width for time; processes / concurrency trade memory for speed only; mixture,
expert and subagent are the suite's calibration (porch_jax/envs/workplace says what each does): raising p_change
or the sub-agents' slip rates makes mid-run revision matter more. The schema is porch_jax/rollout/compare.py
`ComparisonConfig`. With served endpoints (orchestrator / executor) the same comparison runs on real models.
"""

from ml_collections import ConfigDict

SYSTEMS = (
    "proactive",
    "lifecycle",
    "react",
    "no_task",
    "no_context",
    "no_tools",
    "no_budget",
    "no_status",
    "no_request",
    "no_evidence",
)


def get_config() -> ConfigDict:
    c = ConfigDict()
    c.run_dir = "runs/workplace_compare"
    c.systems = SYSTEMS
    c.num_tasks = 500
    c.seed_start = 0
    c.processes = 2  # systems run in parallel processes (episodes are CPU-bound)
    c.concurrency = 16  # episodes in flight per system (the runner's workers)
    c.episode_timeout_s = 60.0
    # How an episode runs (rollout/config.py EngineConfig): GAIA2's budgets (every workplace task carries tighter
    # ones of its own; the engine takes the smaller), the decision cap, each role's sampling and the evidence kept.
    c.engine = ConfigDict(
        {
            "budgets": {"total_steps": 300, "max_agents": 10, "default_agent_budget": 30},
            "max_decisions": 64,
            "max_evidence_chars": 160,
            "orchestrator_sampling": {"max_tokens": 256, "temperature": 0.0},
            "subagent_sampling": {"max_tokens": 256, "temperature": 0.0},
            "context_overflow": "observe",
            "few_shot": False,
        }
    )
    # Each role's endpoint (backends/spec.py EndpointSpec): an empty model keeps the scripted policy, the scripted
    # expert orchestrating and the scripted sub-agents executing; e.g. --config.orchestrator.model=policy
    # "--config.orchestrator.urls=('http://localhost:8000',)" --config.orchestrator.api_key_env=VLLM_API_KEY.
    c.orchestrator = ConfigDict({"model": "", "urls": (), "provider": "vllm", "api_key_env": ""})
    c.executor = ConfigDict({"model": "", "urls": (), "provider": "vllm", "api_key_env": ""})
    c.mixture = ConfigDict(
        {
            "templates": {"cab": 1.0, "cab_text": 1.0, "mail_text": 1.0, "history": 1.0, "file_text": 1.0},
            "p_change": 0.5,
            "p_distract": 0.5,
            "slack": (2, 8),
            "spare_agents": 2,
        }
    )
    c.expert = ConfigDict(
        {
            "p_omit_context": 0.1,
            "p_omit_tool": 0.1,
            "p_misscope": 0.1,
            "p_underbudget": 0.1,
            "blind_spots": ("handover_2back", "archive", "long_file"),
            "budget_margin": 1,
            "file_budget": 4,
        }
    )
    c.subagent = ConfigDict(
        {
            "p_misread": 0.3,
            "p_detour": 0.3,
            "p_persist": 0.5,
            "slip_base": 0.01,
            "slip_tools": 0.5,
            "slip_history": 0.2,
            "max_asks": 2,
        }
    )
    return c
