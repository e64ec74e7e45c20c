"""MACA's real-agent table (experiments/maca_real_agents.py: the six benchmarks, MACA, its ablations and every
baseline, one exact response cache) with every agent of every pool a hosted model: the argument's backbone
(gemini_3_flash, deepseek_v3_2 or deepseek_v4_flash; porch_jax/backends/providers.py `BACKBONES`).

    DEEPSEEK_API_KEY=... python -m launch.maca_table --config=experiments/maca_hosted_agents.py:deepseek_v3_2

The replies are cached under the model id (RUN_DIR/responses.jsonl), so a rerun, or a system added later, asks the
provider only for calls no system has made. Sizing is the CPU table's task subsets with the answer length a hosted
model needs (512 new tokens, as experiments/maca_gsm_hard.py) and 16 calls in flight (providers' rate limits).
"""

from ml_collections import ConfigDict

from experiments.maca_real_agents import get_config as table_config
from porch_jax.backends.providers import backbone_endpoint
from porch_jax.typed_config import parse_arg


def get_config(arg: str | None = None) -> ConfigDict:
    a = parse_arg(arg, backbone="deepseek_v3_2")
    c = table_config()
    c.run_dir = f"runs/maca_hosted_{a.backbone}"
    spec = ConfigDict(backbone_endpoint(a.backbone, timeout_s=600.0))
    c.agents = ConfigDict({"kind": "endpoint", "path": "", "serve": c.agents.serve.to_dict(), "model_id": spec.model})
    c.maca.backend.endpoint.update(spec.to_dict())
    c.maca.backend.sampling.max_tokens = 512
    c.maca.baselines.concurrency = 16
    return c
