"""SFT of the tiny orchestrator on expert trajectories (CPU-sized).

    python -m launch.train --config=experiments/sft_tiny.py
    python -m launch.train --config=experiments/sft_tiny.py --config.train.optimizer.learning_rate=1e-4 \\
        --config.train.mesh="(2,2,2)" --cpu_devices=8

The same file serves the other methods (--config.train.method.name=rwr|opod|grpo): they share every
field, and opod_tiny.py only changes what OPOD needs. Paths are relative to the working directory.
The schema is porch_jax/rows/records.py `RecordsConfig`: an unknown key or a bad value is a flags
error naming the key. Every decision is a one-span row and losses average within each decision, then
over decisions (the paper's aggregation). Knobs: batch.micro_batch x batch.accum_steps is the global
batch (accumulation is exact, so it trades memory for time only); model.compute_dtype "bfloat16" is
~1.5x faster on CPUs with AVX512-BF16 (docs/benchmarks.md) at bf16 matmul precision.
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    c = ConfigDict()
    c.workdir = "runs/sft_tiny"
    c.model = ConfigDict(
        {
            "init_from": "runs/tiny_model",
            "hf": ConfigDict({"model_type": "qwen3"}, type_safe=False),
            "seed": 0,
            "compute_dtype": "float32",
            "remat": False,
        }
    )
    c.data = ConfigDict(
        {
            "trajectories": "runs/expert/trajectories.jsonl",
            "tokenizer": "",
            "hints": "",
            "groups": "",
            "buckets": (256, 512, 1024),
            "overlong": "error",  # a record over the largest bucket: "error" | "drop" | "cut" (train/overlong.py)
            "seed": 0,
        }
    )
    c.batch = ConfigDict({"micro_batch": 8, "accum_steps": 1})
    c.train = ConfigDict(
        {
            "steps": 200,
            "optimizer": {
                "learning_rate": 3e-4,
                "warmup_steps": 20,
                "total_steps": 200,
                "final_lr_ratio": 0.1,
                "weight_decay": 0.01,
                "b1": 0.9,
                "b2": 0.95,
                "eps": 1e-8,
                "max_grad_norm": 1.0,
            },
            "method": {
                "name": "sft",
                "opd_weight": 1.0,
                "clip_eps": 0.2,
                "kl_coef": 0.0,
                "pg_aggregation": "token",
            },
            "checkpoint": {"every": 50, "keep": 3, "async_save": True},
            "log": {"every": 10, "tensorboard": True},
            "export_every": 0,
            "mesh": (1, 1, 1),
        }
    )
    c.opd = ConfigDict(
        {
            "batch": 8,  # OPOD: OPD rows a step, each action sampled by the current student
            "sampling": {"max_new_tokens": 64, "temperature": 1.0, "top_p": 1.0, "seed": 0},
        }
    )
    return c
