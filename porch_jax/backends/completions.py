"""A served model's raw completions on token ids: prompt logprobs and continuations of a prompt we render.

Chat completions render the prompt on the server and always open a fresh assistant turn; a forced reply prefix
(the format-held GRM's "FLAG:", porch_jax/attribution/held.py) needs the prompt as token ids we rendered, with the
prefix inside the assistant turn. vLLM and SGLang serve ``/v1/completions`` on token ids and return
``prompt_logprobs``: the log-probability of each prompt token given the ones before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx2 as httpx

from porch_jax.backends.base import BackendError, Sampling
from porch_jax.backends.openai_chat import read_api_key


class CompletionsClient:
    """``/v1/completions`` of the server at ``base_url`` (without ``/v1``) serving ``model``; the key from
    ``$api_key_env`` (or ``api_key``), never in a message."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        api_key_env: str | None = None,
        timeout_s: float = 120.0,
    ):
        self.base_url, self.model, self.timeout_s = base_url.rstrip("/"), model, timeout_s
        self.api_key = api_key if api_key is not None else read_api_key(api_key_env)

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        url = f"{self.base_url}/v1/completions"
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s, trust_env=False) as client:
                response = await client.post(url, json={"model": self.model, **body}, headers=headers)
        except httpx.TransportError as e:
            raise BackendError(f"{url}: {type(e).__name__}: {e}", kind="connection") from None
        if response.status_code != 200:
            text = response.text[:300].replace(self.api_key, "[redacted]") if self.api_key else response.text[:300]
            raise BackendError(f"{url}: HTTP {response.status_code}: {text}", kind="server")
        return response.json()

    async def prompt_logprobs(self, ids: Sequence[int]) -> list[float]:
        """The logprob of each token of ``ids`` after the first, given the ones before it."""
        ids = [int(t) for t in ids]
        data = await self._post({"prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0})
        try:
            entries = data["choices"][0]["prompt_logprobs"][1:]
            return [float(e[str(t)]["logprob"]) for e, t in zip(entries, ids[1:], strict=True)]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise BackendError(
                f"{self.base_url}: no prompt_logprobs over the prompt ({e!r}); the format-held reading needs an "
                "endpoint that returns them (vLLM, SGLang)",
                kind="server",
            ) from None

    async def complete(self, ids: Sequence[int], sampling: Sampling) -> str:
        """The text the model continues ``ids`` with."""
        body: dict[str, Any] = {
            "prompt": [int(t) for t in ids],
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        data = await self._post(body)
        try:
            return str(data["choices"][0]["text"])
        except (KeyError, IndexError, TypeError) as e:
            raise BackendError(f"{self.base_url}: malformed completion ({e!r})", kind="server") from None
