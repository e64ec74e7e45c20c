"""SFT of the tiny orchestrator on expert trajectories (CPU-sized).

    python -m launch.train --config=experiments/sft_tiny.py
    python -m launch.train --config=experiments/sft_tiny.py --config.train.learning_rate=1e-4 \\
        --config.mesh.shape="(2,2,2)" --cpu_devices=8

The same file serves the other methods (--config.method=rwr|opod|grpo): they share every field,
and opod_tiny.py only changes what OPOD needs. Paths are relative to the working directory.
"""

from ml_collections import ConfigDict, config_dict


def get_config() -> ConfigDict:
    c = ConfigDict()
    c.method = "sft"  # sft | rwr | opod | grpo
    c.workdir = "runs/sft_tiny"

    # init_from: a Hugging Face folder (e.g. make_tiny_model's). Without one, a fresh model is
    # built from `hf` (config.json fields; vocab_size defaults to the tokenizer's) and `seed`.
    c.model = ConfigDict(
        {
            "init_from": "runs/tiny_model",
            "hf": ConfigDict({"model_type": "qwen3"}, type_safe=False),
            "seed": 0,
            # bfloat16: bf16 matmuls, fp32 master weights; ~1.5x faster on CPUs with AVX512-BF16 (docs/benchmarks.md)
            "compute_dtype": "float32",
            "remat": False,
        }
    )

    c.data = ConfigDict(
        {
            "trajectories": "runs/expert/trajectories.jsonl",  # EpisodeRecord JSONL (TrajectoryStore)
            "tokenizer": "",  # default: model.init_from
            "hints": "",  # OPOD: JSONL of {episode_id, index, attributable, hint} from the attribution step
            "groups": "",  # GRPO: JSONL of {key, context, samples: [{token_ids, logprobs, reward}]}
            "buckets": (256, 512, 1024),  # padded sequence lengths T
            "target_buckets": (64, 128, 256),  # padded target lengths K
            "target_reserve": 0,  # room for resampled targets (OPOD sets it to opd.max_new_tokens)
            "pad_id": 0,
            "seed": 0,
        }
    )

    c.train = ConfigDict(
        {
            "steps": 200,
            "micro_batch": 8,  # rows per micro-batch, sharded over (data, fsdp)
            "accum_steps": 1,  # global batch = micro_batch * accum_steps
            "learning_rate": 3e-4,
            "warmup_steps": 20,
            "total_steps": 200,  # schedule length (usually = steps)
            "final_lr_ratio": 0.1,
            "weight_decay": 0.01,
            "b1": 0.9,
            "b2": 0.95,
            "eps": 1e-8,
            "max_grad_norm": 1.0,
        }
    )

    c.loss = ConfigDict(
        {
            "aggregation": "token",  # "decision": mean within each decision, then over decisions
            "opd_weight": 1.0,
            "grpo_clip_eps": 0.2,
            "grpo_clip_eps_high": config_dict.placeholder(float),  # None: same as grpo_clip_eps
            "grpo_kl_coef": 0.0,
            "grpo_aggregation": "token",
            "chunk_size": config_dict.placeholder(int),  # tokens per fused LM-head chunk; None: automatic
        }
    )

    c.opd = ConfigDict(
        {"on_policy": True, "max_new_tokens": 64, "temperature": 1.0, "top_p": 1.0, "seed": 0, "max_len": 2048}
    )
    c.mesh = ConfigDict({"shape": (1, 1, 1)})  # (data, fsdp, tensor); product = device count
    c.checkpoint = ConfigDict({"every": 50, "keep": 3, "async_save": True})
    c.log = ConfigDict({"every": 10, "tensorboard": True})
    c.export = ConfigDict({"dir": ""})  # Hugging Face folder written at the end ("" = none)
    return c
