"""What a wrong OPOD experiment config fails at start, before any stage spends time.

The typed schema (porch_jax/opod/config.py) checks every key and value while the flags parse; these checks need
the world: the init_from folder and its tokenizer's chat template, an external GRM endpoint that answers, the vLLM
server the config names (or the vllm-cpu virtualenv where the config starts its own on CPU), and, under a context
window, a scripted expert that can still succeed from what the window shows (`check_expert`). Each failure is a
``ConfigError`` whose message starts with the key (``config.model.init_from: ...``).
"""

from __future__ import annotations

from pathlib import Path

import httpx2 as httpx

from porch_jax.backends.openai_chat import read_api_key
from porch_jax.backends.spec import EndpointSpec
from porch_jax.opod.config import ExperimentConfig
from porch_jax.serving.server import vllm_cpu_missing
from porch_jax.typed_config import ConfigError

PROBE_TIMEOUT_S = 10.0


def _fail(key: str, message: str) -> ConfigError:
    return ConfigError(f"config.{key}: {message}")


def check_init_from(folder: str) -> None:
    """A Hugging Face folder whose tokenizer has a chat template (the protocol is rendered through it)."""
    path = Path(folder)
    if not (path / "config.json").is_file():
        raise _fail("model.init_from", f"{folder!r} is not a Hugging Face model folder (no config.json)")
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # transformers raises many kinds for a broken tokenizer
        raise _fail("model.init_from", f"{folder}: its tokenizer does not load ({type(e).__name__}: {e})") from e
    if not getattr(tokenizer, "chat_template", None):
        raise _fail(
            "model.init_from",
            f"{folder}: the tokenizer has no chat template; the natural-language protocol is rendered through it",
        )


def probe(url: str, key: str | None, what: str) -> None:
    """GET URL/v1/models with the key; raises ``ConnectionError`` saying what did not answer and how."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        response = httpx.get(f"{url.rstrip('/')}/v1/models", headers=headers, timeout=PROBE_TIMEOUT_S, trust_env=False)
    except httpx.TransportError as e:
        raise ConnectionError(f"{what} at {url} does not answer ({type(e).__name__}: {e})") from e
    if response.status_code != 200:
        raise ConnectionError(f"{what} at {url} answers /v1/models with HTTP {response.status_code}")


def check_endpoint(key: str, spec: EndpointSpec, what: str) -> None:
    """A self-hosted endpoint (urls given) answers; a hosted one has its key variable set."""
    try:
        api_key = read_api_key(spec.api_key_env or None)
    except Exception as e:
        raise _fail(f"{key}.api_key_env", str(e)) from e
    for url in spec.urls:
        try:
            probe(url, api_key, what)
        except ConnectionError as e:
            raise _fail(f"{key}.urls", str(e)) from e


def check_expert(cfg: ExperimentConfig) -> tuple[float, float] | None:
    """Under policy.context_tokens, (the information-limited expert's success, the unwindowed expert's) on
    preflight.tasks; below preflight.min_expert_success, a ConfigError naming policy.context_tokens and both."""
    if not cfg.policy.context_tokens:
        return None
    from transformers import AutoTokenizer

    from porch_jax.opod.demonstrator import expert_success

    tokenizer = AutoTokenizer.from_pretrained(cfg.model.init_from) if cfg.model.init_from else None
    if tokenizer is None:  # a model from scratch has no tokenizer before its init stage: its window is unmeasured
        return None
    tasks, window = cfg.preflight.tasks, cfg.policy.context_tokens
    limited = expert_success(cfg, tokenizer, tasks, window=True)
    whole = expert_success(cfg, tokenizer, tasks, window=False)
    print(
        f"start check: the scripted expert writing only what a {window}-token window shows solves {limited:.2f} of "
        f"{tasks.num_tasks} validation tasks; unwindowed, {whole:.2f}",
        flush=True,
    )
    if limited < cfg.preflight.min_expert_success:
        raise _fail(
            "policy.context_tokens",
            f"{window} tokens is too short for the task: the scripted expert, writing only what the window shows, "
            f"solves {limited:.2f} of {tasks.num_tasks} validation tasks (unwindowed: {whole:.2f}), below "
            f"preflight.min_expert_success={cfg.preflight.min_expert_success:g}; SFT would imitate decisions its "
            "records cannot support. Widen the window.",
        )
    return limited, whole


def check_start(cfg: ExperimentConfig) -> None:
    """Every start check of ``cfg`` (module docstring); returns when all pass."""
    if cfg.model.init_from:
        check_init_from(cfg.model.init_from)
        check_expert(cfg)
    if cfg.attribution.grm == "base_model" and cfg.attribution.endpoint.configured:
        check_endpoint("attribution.endpoint", cfg.attribution.endpoint, "the GRM endpoint")
    serving = cfg.serving
    if serving.kind != "vllm":
        return
    if serving.base_url:
        try:
            key = read_api_key(serving.api_key_env or None)
        except Exception as e:
            raise _fail("serving.api_key_env", str(e)) from e
        try:
            probe(serving.base_url, key, "the vLLM server")
        except ConnectionError as e:
            raise _fail("serving.base_url", str(e)) from e
    elif serving.server.resolved_device() == "cpu" and (missing := vllm_cpu_missing(serving.server)):
        raise _fail("serving.server.cpu_venv", f"this config starts its own vLLM server on CPU, but {missing}")
