"""POrchestra's OPOD loop with the paper's orchestrator size, Qwen3.5-9B, on a GPU host: the same code and stages as
experiments/opod_smollm2.py, at the size a GPU cluster affords.

    export POLICY_KEY=... BASE_KEY=...
    VLLM_API_KEY=$BASE_KEY python -m launch.serve --model_dir=/models/Qwen3.5-9B --port=8001 &   # the frozen GRM
    python -m launch.pipeline --config=experiments/opod_qwen3_5_9b.py \\
        --config.model.init_from=/models/Qwen3.5-9B --config.run_dir=runs/opod_qwen3_5_9b

What the file sets and why:
- model: the Hugging Face folder of Qwen3.5-9B (its text half is trained and exported: a text-only
  `Qwen3_5ForCausalLM` folder vLLM registers); bf16 matmuls over float32 master weights, layer remat.
- mesh (1, 8, 1): one host of 8 GPUs, parameters and AdamW state sharded 8 ways (fsdp): ~9.4B parameters x 12
  bytes (f32 weights, two moments) / 8 = ~14 GB per device before activations.
- serving: a vLLM server this run starts on the SFT export (GPU vLLM in this environment), bf16, each export pushed
  into it without a restart; bf16 serving against our f32 master weights needs a looser parity bound.
- attribution: the frozen base model served separately (the command above) answers the I_GRM prompt, its reply
  format held (its flag read from vLLM's prompt logprobs after a forced "FLAG:"; provider "vllm").
- policy: contexts up to 4,096 tokens (the paper's rollouts keep full tool outputs), actions up to 512 tokens.
- The sizes of each method (steps, batch) follow the paper's setup at one learning rate per method; the paper
  trains on its own expert data (GAIA, GAIA2, SWE-bench trajectories): point `expert_rollouts` at that world's
  records to reproduce it; here the workplace suite stands in.
"""

import importlib.util
from pathlib import Path

from ml_collections import ConfigDict


def _smollm2_config() -> ConfigDict:
    spec = importlib.util.spec_from_file_location("opod_smollm2", Path(__file__).with_name("opod_smollm2.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def get_config() -> ConfigDict:
    c = _smollm2_config()
    c.run_dir = "runs/opod_qwen3_5_9b"
    c.model = ConfigDict(
        {
            "init_from": "/models/Qwen3.5-9B",
            "compute_dtype": "bfloat16",
            "remat": True,
            "seed": 0,
            "vocab_size": 0,
            "hf": {},
        }
    )
    c.mesh = (1, 8, 1)
    c.policy = ConfigDict(
        {"view": "full", "max_new_tokens": 512, "buckets": (1024, 2048, 4096), "max_len": 4608, "overlong": "cut"}
    )
    c.suite.max_decisions = 12
    c.suite.max_evidence_chars = 2000
    c.attribution = ConfigDict(
        {
            "grm": "base_model",
            "endpoint": c.attribution.endpoint.to_dict()
            | {"model": "policy", "urls": ("http://127.0.0.1:8001",), "api_key_env": "BASE_KEY", "provider": "vllm"},
            "secondary": True,
            "retries": 1,
            "concurrency": 64,
            "sampling": {"temperature": 0.0, "max_tokens": 512},
        }
    )
    c.serving = ConfigDict(
        {
            "kind": "vllm",
            "base_url": "",
            "api_key_env": "POLICY_KEY",
            "timeout_s": 900.0,
            "parity_tol": 0.1,
            "server": {
                "device": "gpu",
                "dtype": "bfloat16",
                "served_model_name": "policy",
                "max_model_len": 8192,
                "gpu_memory_utilization": 0.85,
                "seed": 0,
            },
        }
    )
    c.expert_rollouts.num_tasks = 2000
    c.rollouts.num_tasks = 2000
    c.eval.tasks.num_tasks = 500
    c.eval.max_tokens = 512
    c.eval.concurrency = 128
    c.selection = ConfigDict({"enabled": True, "tasks": {"num_tasks": 200, "seed_start": 50_000, "prefix": "val"}})
    c.checkpoint.every = 100
    c.log.every = 10
    method = {"warmup_steps": 20, "export_every": 100}
    c.sft = ConfigDict({"steps": 1000, "batch": 32, "learning_rate": 1e-5, "seed": 1} | method)
    c.sft_hints = ConfigDict(c.sft.to_dict() | {"hint_rows": 0.5})
    c.rwr = ConfigDict({"steps": 300, "batch": 32, "learning_rate": 2e-6, "seed": 2} | method)
    opd = {"batch": 32, "sampling": {"max_new_tokens": 512, "temperature": 1.0, "top_p": 1.0, "seed": 3}}
    c.opod = ConfigDict(
        {"steps": 300, "batch": 32, "learning_rate": 2e-6, "seed": 2, "opd_weight": 1.0, "opd": opd} | method
    )
    c.opd_empty = ConfigDict(
        {"steps": 300, "batch": 32, "learning_rate": 2e-6, "seed": 2, "opd_weight": 1.0, "opd": opd} | method
    )
    c.dagrpo = ConfigDict(
        {
            "steps": 150,
            "batch": 0,
            "learning_rate": 2e-6,
            "seed": 4,
            "group": {
                "contexts_per_step": 16,
                "group_size": 8,
                "sampling": {"max_new_tokens": 512, "temperature": 1.0, "seed": 4},
            },
        }
        | method
    )
    return c
