"""What each OpenAI-compatible chat provider accepts and returns, kept as data.

One HTTP backend (``openai_chat.OpenAIChatBackend``) speaks to every provider; the differences
between them are fields of a ``Provider``, so a new provider or a changed quirk is a table entry,
never a branch in the request code:

- ``token_ids``: the server returns the sampled token ids and the prompt's token ids (vLLM's
  ``return_token_ids``). Without them a record keeps only text, and training re-tokenizes it: the
  record says so (``ChatResult.token_source``) and the trainer counts such rows.
- ``prompt_text``: the server returns the prompt it rendered (vLLM's ``return_prompt_text``), so a
  run can check its own chat-template rendering against the server's.
- ``logprobs``: per-token log-probabilities of the sampled tokens are available.
- ``max_tokens_field``: OpenAI's current models take ``max_completion_tokens``; older and
  self-hosted servers take ``max_tokens``.
- ``sampling_controls``: reasoning models (OpenAI o-series / gpt-5, DeepSeek's reasoner) reject or
  ignore temperature and top_p, so they are not sent.
- ``top_k``, ``seed``, ``stop``: sent only where the provider takes them.
- ``reasoning_fields``: where a reply carries the model's reasoning apart from its answer
  (DeepSeek's ``reasoning_content``, vLLM's ``reasoning``); kept as ``ChatResult.reasoning``.
- ``template_kwargs``: the server renders the chat template itself and takes ``chat_template_kwargs`` (vLLM,
  SGLang): the thinking switch (``Sampling.thinking``) reaches the template this way; elsewhere it is not sent.
- ``base_url`` and ``api_key_env``: the hosted endpoint and the environment variable its key is
  read from by default (a config may name another variable; a key never sits in a config).

The default, ``openai_compatible``, asks for standard fields only, so a server that speaks just the standard
chat-completions format works without declaring anything; vLLM's extras are asked for only under ``vllm``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

DEFAULT = "openai_compatible"


@dataclass(frozen=True)
class Provider:
    name: str
    base_url: str | None = None  # None: self-hosted, the config gives the URLs
    chat_path: str = "/v1/chat/completions"  # appended to each base URL
    api_key_env: str | None = None
    token_ids: bool = False
    prompt_text: bool = False
    logprobs: bool = True
    max_tokens_field: str = "max_tokens"
    sampling_controls: bool = True
    top_k: bool = False
    seed: bool = True
    stop: bool = True
    reasoning_fields: tuple[str, ...] = ()
    template_kwargs: bool = False

    def replace(self, **changes) -> Provider:
        return dataclasses.replace(self, **changes)


PROVIDERS: dict[str, Provider] = {
    p.name: p
    for p in (
        # vLLM with its extras: the ids it sampled, the prompt ids and text it rendered.
        Provider(
            "vllm", token_ids=True, prompt_text=True, top_k=True, reasoning_fields=("reasoning",), template_kwargs=True
        ),
        # Any OpenAI-compatible server asked for standard fields only (a hosted API, SGLang without extras, a proxy,
        # vLLM itself): the default, because every such server answers it.
        Provider(DEFAULT),
        Provider("sglang", top_k=True, reasoning_fields=("reasoning_content",), template_kwargs=True),
        Provider(
            "openai",
            base_url="https://api.openai.com/v1",
            chat_path="/chat/completions",
            api_key_env="OPENAI_API_KEY",
            max_tokens_field="max_completion_tokens",
        ),
        Provider(
            "openai_reasoning",  # o-series and gpt-5: no temperature/top_p, no logprobs, no stop
            base_url="https://api.openai.com/v1",
            chat_path="/chat/completions",
            api_key_env="OPENAI_API_KEY",
            max_tokens_field="max_completion_tokens",
            sampling_controls=False,
            logprobs=False,
            stop=False,
        ),
        Provider(
            "gemini",  # Gemini's OpenAI-compatible endpoint
            base_url="https://generativelanguage.googleapis.com/v1beta/openai",
            chat_path="/chat/completions",
            api_key_env="GEMINI_API_KEY",
            logprobs=False,
            seed=False,
        ),
        Provider(
            "deepseek",
            base_url="https://api.deepseek.com",
            chat_path="/chat/completions",
            api_key_env="DEEPSEEK_API_KEY",
            seed=False,
            reasoning_fields=("reasoning_content",),
        ),
        Provider(
            "deepseek_reasoner",  # deepseek-reasoner ignores sampling controls and returns no logprobs
            base_url="https://api.deepseek.com",
            chat_path="/chat/completions",
            api_key_env="DEEPSEEK_API_KEY",
            sampling_controls=False,
            logprobs=False,
            seed=False,
            reasoning_fields=("reasoning_content",),
        ),
    )
}


def provider(name: str | Provider) -> Provider:
    """The provider named ``name`` (or ``name`` itself when it already is one)."""
    if isinstance(name, Provider):
        return name
    try:
        return PROVIDERS[name]
    except KeyError:
        raise ValueError(f"unknown provider {name!r}; known: {', '.join(sorted(PROVIDERS))}") from None


# The papers' hosted backbones as (provider, model id): POrchestra (Sec. 4) orchestrates with Gemini-3-Flash and
# executes with Gemini-3-Flash, DeepSeek-V3.2 or DeepSeek-V4-Flash. The ids are the names the providers list for
# these models, which change with their releases (a config's `<role>.model` replaces one).
BACKBONES = {
    "gemini_3_flash": ("gemini", "gemini-3-flash-preview"),
    "deepseek_v3_2": ("deepseek", "deepseek-chat"),
    "deepseek_v4_flash": ("deepseek", "deepseek-v4-flash"),
}
ORCHESTRATOR_BACKBONE = "gemini_3_flash"  # the paper's orchestrator for every orchestrated system


def backbone_endpoint(backbone: str, timeout_s: float = 300.0) -> dict[str, Any]:
    """`backbone`'s EndpointSpec fields: the provider's hosted URL (urls empty) and its default key variable, read
    from the environment when a run starts, never written to a config."""
    if backbone not in BACKBONES:
        raise ValueError(f"backbone: unknown {backbone!r}; known: {', '.join(BACKBONES)}")
    name, model = BACKBONES[backbone]
    return {"model": model, "urls": (), "provider": name, "api_key_env": "", "timeout_s": timeout_s}
