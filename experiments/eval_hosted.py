"""One system of the rollout engine on a benchmark (gaia, taskcraft, gaia2, swe) with hosted models: the paper's
Gemini-3-Flash as the orchestrator and the argument's backbone as every sub-agent (porch_jax/backends/providers.py `BACKBONES`).
The systems are POrchestra's (`proactive`) and its baselines (`lifecycle`, `react`, `orchestra_o1`, `skill_mas`,
`mas2`; `mini_swe` on swe): porch_jax/rollout/config.py describes each.

    GEMINI_API_KEY=... DEEPSEEK_API_KEY=... python -m launch.eval \\
        --config=experiments/eval_hosted.py:benchmark=gaia2,system=orchestra_o1,executor=deepseek_v3_2
    python -m launch.eval --config=experiments/eval_hosted.py:benchmark=swe,system=mini_swe,executor=gemini_3_flash \\
        --config.swe_repos=MIRRORS --config.limit=10

Everything else (tasks, budgets, judge, grader) is experiments/eval_benchmarks.py's for that benchmark, with the
engine's sampling caps lifted to what a hosted model writes.
"""

from ml_collections import ConfigDict

from experiments.eval_benchmarks import get_config as benchmark_config
from porch_jax.backends.providers import ORCHESTRATOR_BACKBONE, backbone_endpoint
from porch_jax.typed_config import parse_arg


def get_config(arg: str | None = None) -> ConfigDict:
    a = parse_arg(arg, benchmark="gaia", system="proactive", executor="deepseek_v4_flash")
    c = benchmark_config(a.benchmark)
    c.out_dir = f"runs/eval_{a.benchmark}_{a.system}_{a.executor}"
    c.system = a.system
    c.policy = ConfigDict({"kind": "endpoint"})
    c.orchestrator = ConfigDict(backbone_endpoint(ORCHESTRATOR_BACKBONE))
    c.executor = ConfigDict(backbone_endpoint(a.executor))
    c.engine.max_decisions = 64
    c.engine.orchestrator_sampling.max_tokens = 2048
    c.engine.subagent_sampling.max_tokens = 2048
    c.engine.context_overflow = "observe"
    c.engine.few_shot = False
    c.episode_timeout_s = 3600.0
    return c
