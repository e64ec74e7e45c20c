"""OPOD's attribution by the frozen base model: SmolLM2-135M-Instruct served (launch/serve.py) judges every decision
of a trajectory store as the GRM (porch_jax/attribution/grm.py's instruction and reply format).

    VLLM_API_KEY=KEY python -m launch.serve --model_dir=$(python -m porch_jax.models.smollm2) --port=8000 &
    VLLM_API_KEY=KEY python -m launch.attribute --config=experiments/attribute_smollm2.py

The paper's GRM is the frozen base model of the orchestrator being trained (Qwen3.5-9B there); a 135M model mostly
fails the two-line reply format, which the job records as errors by reason, never as "not attributable". Knobs:
sampling.max_tokens bounds each judgement (the reply is two lines); concurrency is the calls in flight. The schema
is porch_jax/attribution/job.py `AttributionConfig`.
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    c = ConfigDict()
    c.records = "runs/smollm2_baseline/zero_shot.jsonl"
    c.out = "runs/smollm2_baseline/attribution.jsonl"
    c.grm = ConfigDict(
        {
            "model": "policy",  # the served model name (launch/serve.py: ServerConfig.served_model_name)
            "urls": ("http://127.0.0.1:8000",),
            "provider": "vllm",
            "api_key_env": "VLLM_API_KEY",
            "timeout_s": 300.0,
            "tools_in_prompt": False,  # the GRM prompt carries no tools
        }
    )
    c.sampling = ConfigDict({"max_tokens": 128, "temperature": 0.0})
    c.concurrency = 16
    return c
