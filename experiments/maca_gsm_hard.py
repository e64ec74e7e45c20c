"""MACA on GSM-Hard with real agents: the math + auxiliary pool's role prompts served by vLLM, the
orchestration policy a JAX LM scoring agent names (a Hugging Face folder, or a tiny Qwen3 for a smoke run).

    python -m launch.maca --config=experiments/maca_gsm_hard.py \\
        --config.backend.endpoint.urls="('http://localhost:8000',)" --config.backend.endpoint.model=Qwen/Qwen2.5-7B-Instruct

Tasks come from the Table 4 split (porch_jax/envs/benchmarks); accuracy is the benchmark's numeric match on
the latest final answer in the agents' transcript, cost is every call's prompt + completion tokens. The same
run on the paper's other benchmarks: `--config=experiments/maca_gsm_hard.py:humaneval` (or mbpp, svamp,
mmlu_pro, arc_challenge; code is scored in the sandbox).

The paper's Table 4 (MACA) row for the benchmark. The run time is set by the served agents (each episode makes
a few chat calls per retained agent) and has not been measured with the paper's 7B agents. Knobs: graphspec.gamma trades recall of the needed agents for fewer calls; grpo.prior_kl_weight
(lambda) pulls the policy toward the learned prior; grpo.token_cost_weight trades accuracy for tokens; the
rest as in experiments/maca_synthetic.py. The schema is porch_jax/maca/config.py `MacaConfig`.
"""

from ml_collections import ConfigDict

from experiments.maca_synthetic import get_config as synthetic_config
from porch_jax.maca.settings import BASELINES
from porch_jax.typed_config import ConfigError, parse_arg


def get_config(arg: str | None = None) -> ConfigDict:
    """`arg` picks another of the paper's six benchmarks (`--config=experiments/maca_gsm_hard.py:humaneval`, or
    `:benchmark=humaneval`): the pool is then that benchmark's family (code, math or QA) plus the auxiliary roles."""
    from porch_jax.envs.benchmarks import BENCHMARKS

    benchmark = parse_arg(arg, benchmark="gsm_hard").benchmark
    if benchmark not in BENCHMARKS:
        raise ConfigError(f"config argument benchmark: unknown {benchmark!r}; choose from {sorted(BENCHMARKS)}")
    c = synthetic_config()
    c.run_dir = f"runs/maca_{benchmark}"
    c.seeds = c.sweep_seeds = (0,)
    c.world = ConfigDict(
        {"kind": "benchmark", "benchmark": benchmark, "num_train": 128, "num_eval": 128, "budget": 4000, "data_dir": ""}
    )
    c.pool_families = (BENCHMARKS[benchmark].family, "auxiliary")
    # mesh (data, fsdp, tensor): a 7B policy is split over the host's accelerators as the trainers split it,
    # e.g. --config.policy.lm.mesh="(1, 8, 1)" on 8 GPUs (the paper trains on 8 x A800)
    c.policy = ConfigDict(
        {"kind": "lm", "hidden": 128, "lm": {"model_path": "", "max_task_words": 0, "overrides": {}, "mesh": (1, 1, 1)}}
    )
    c.prior.rounds = 1
    c.prior.samples = 4
    c.grpo.iterations = 40
    c.grpo.tasks_per_iteration = 4
    c.grpo.optimizer.learning_rate = 1e-5  # paper, App. D.3 (for a pretrained LM policy)
    c.grpo.optimizer.final_lr_ratio = (
        1.0  # the paper's rate, constant (the synthetic decay was chosen on its own validation)
    )
    # every GRPO iteration calls the served agents ~tasks x group x calls times: save the policy every 5, so a
    # crashed run, relaunched with the same command, loses at most 4 (the learned prior is kept as well)
    c.checkpoint_every = 5
    c.systems = ("maca",)
    # Vanilla, CoT, Self-Consistency (CoT x 5), Self-Refine, and Table 11's LLM routers (no constraint, GraphSpec
    # as a prompt hint, GraphSpec as a hard mask), multi_agent.py's ComplexCoT, DyLAN, MacNet (chain, tree, mesh),
    # AgentVerse and AgentPrune, and adaptive.py's MaAS and Puppeteer (trained first, see match_grpo) on the same
    # held-out tasks and backend
    c.baselines.systems = BASELINES
    c.baselines.maas = {}
    c.baselines.puppeteer = {}
    match_grpo(c)
    c.sweeps = ConfigDict({"gamma": (), "prior_kl_weight": ()})
    c.lm_check.enabled = False
    # the agent pool's endpoint (backends/spec.py EndpointSpec: vllm, sglang or a hosted provider, the key read from
    # the variable api_key_env names) and how every agent call samples
    c.backend = ConfigDict(
        {
            "kind": "served",
            "endpoint": {
                "model": "Qwen/Qwen2.5-7B-Instruct",
                "urls": ("http://localhost:8000",),
                "provider": "vllm",
                "api_key_env": "",
                "timeout_s": 120.0,
                "max_retries": 3,
            },
            "sampling": {"temperature": 0.0, "max_tokens": 512},
        }
    )
    return c


def smoke_config(
    benchmark: str = "gsm_hard", *, run_dir: str, tasks: int = 3, iterations: int = 1, mlp_steps: int = 10
) -> ConfigDict:
    """The same run shrunk to seconds, to check the whole path against a backend before a real run: `tasks` train
    and eval tasks, the hashing encoder, a short prior fit, `iterations` GRPO steps of 2 x 2 episodes, and the
    synthetic config's 1-layer, 32-wide Qwen3 as the policy (the LM check's)."""
    c = get_config(benchmark)
    c.run_dir = run_dir
    c.encoder = "hashing"
    c.world.num_train = c.world.num_eval = tasks
    c.prior.update({"samples": 2, "mlp_steps": mlp_steps})
    c.grpo.update({"iterations": iterations, "tasks_per_iteration": 2, "group_size": 2})
    c.policy.lm.overrides = c.lm_check.lm.overrides.to_dict()
    match_grpo(c)
    return c


def match_grpo(c: ConfigDict) -> None:
    """MaAS and Puppeteer learn on the training tasks on as many episodes as MACA's GRPO (iterations x tasks per
    iteration x group size); their other settings are porch_jax/maca/settings.py `AdaptiveTraining`'s."""
    g = c.grpo
    for section in (c.baselines.maas, c.baselines.puppeteer):
        section.update(
            {"iterations": g.iterations, "tasks_per_iteration": g.tasks_per_iteration, "samples": g.group_size}
        )
