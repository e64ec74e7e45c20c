"""A served model's raw completions on token ids: prompt logprobs and continuations of a prompt we render.

Chat completions render the prompt on the server and always open a fresh assistant turn; a forced reply prefix
(the format-held GRM's "FLAG:", porch_jax/attribution/held.py) needs the prompt as token ids we rendered, with the
prefix inside the assistant turn. vLLM and SGLang serve ``/v1/completions`` on token ids and return
``prompt_logprobs``: the log-probability of each prompt token given the ones before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from porch_jax.backends.base import BackendError, Sampling
from porch_jax.backends.openai_chat import OpenAIChatBackend

COMPLETIONS_PATH = "/v1/completions"


class CompletionsClient:
    """``/v1/completions`` on the servers of ``pool`` (an ``OpenAIChatBackend``: ``EndpointSpec.backend()``), sent
    through its rotation, per-attempt timeout and retries, with its key (never in a message)."""

    def __init__(self, pool: OpenAIChatBackend):
        self.pool = pool

    @property
    def where(self) -> str:
        return ", ".join(s.url for s in self.pool.servers)

    async def prompt_logprobs(self, ids: Sequence[int]) -> list[float]:
        """The logprob of each token of ``ids`` after the first, given the ones before it."""
        ids = [int(t) for t in ids]
        data = await self.pool.post(
            COMPLETIONS_PATH, {"prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
        )
        try:
            entries = data["choices"][0]["prompt_logprobs"][1:]
            return [float(e[str(t)]["logprob"]) for e, t in zip(entries, ids[1:], strict=True)]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise BackendError(
                f"{self.where}: no prompt_logprobs over the prompt ({e!r}); the format-held reading needs an "
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
        data = await self.pool.post(COMPLETIONS_PATH, body)
        try:
            return str(data["choices"][0]["text"])
        except (KeyError, IndexError, TypeError) as e:
            raise BackendError(f"{self.where}: malformed completion ({e!r})", kind="server") from None
