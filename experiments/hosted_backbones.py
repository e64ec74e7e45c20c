"""The papers' hosted backbones as provider endpoints, shared by the configs that point a system at them
(experiments/workplace_baselines_hosted.py, eval_hosted.py, maca_hosted_agents.py).

POrchestra (Sec. 4) orchestrates with Gemini-3-Flash and executes with Gemini-3-Flash, DeepSeek-V3.2 or
DeepSeek-V4-Flash. Each entry is (provider, model id): the provider's OpenAI-compatible endpoint and key variable
come from porch_jax/backends/providers.py; the ids are the names the providers list for these models, which change
with their releases: `--config.<role>.model=...` replaces one. Keys are read from the environment when a run starts
(GEMINI_API_KEY, DEEPSEEK_API_KEY) and never written to a config, record or log.
"""

from ml_collections import ConfigDict

BACKBONES = {
    "gemini_3_flash": ("gemini", "gemini-3-flash-preview"),
    "deepseek_v3_2": ("deepseek", "deepseek-chat"),
    "deepseek_v4_flash": ("deepseek", "deepseek-v4-flash"),
}
ORCHESTRATOR = "gemini_3_flash"  # the paper's orchestrator for every orchestrated system


def endpoint(backbone: str, timeout_s: float = 300.0) -> ConfigDict:
    """`backbone`'s EndpointSpec fields: the provider's hosted URL (urls empty) and its default key variable."""
    if backbone not in BACKBONES:
        raise ValueError(f"backbone: unknown {backbone!r}; known: {', '.join(BACKBONES)}")
    provider, model = BACKBONES[backbone]
    return ConfigDict({"model": model, "urls": (), "provider": provider, "api_key_env": "", "timeout_s": timeout_s})
