"""Where each role's model is served: a typed endpoint per role, built into a backend at run time.

A run names up to five roles (``ROLES``): the orchestrator being trained or evaluated, the executor
pool its sub-agents run on, the expert that writes demonstrations, the GRM that attributes
failures, and the judge that grades. Each is an ``EndpointSpec``: a provider from
``providers.PROVIDERS``, its URLs (a hosted provider's default when empty), the model name, and the
*name* of the environment variable that holds the API key; the key itself is read when the backend
is built and never sits in a config, a record or a log.
"""

from __future__ import annotations

from dataclasses import dataclass

from porch_jax.backends.providers import DEFAULT, PROVIDERS
from porch_jax.typed_config import resumable

ROLES = ("orchestrator", "executor", "expert", "grm", "judge")


@dataclass(frozen=True)
class EndpointSpec:
    """One role's endpoint. ``urls`` empty: the provider's hosted endpoint. ``api_key_env`` empty:
    the provider's default variable (none for self-hosted servers started without a key)."""

    model: str = ""
    urls: tuple[str, ...] = resumable(())
    provider: str = DEFAULT
    api_key_env: str = resumable("")
    timeout_s: float = resumable(120.0)
    max_retries: int = resumable(3)
    backoff_s: float = resumable(0.5)
    cooldown_s: float = resumable(5.0)
    tools_in_prompt: bool = False  # the model's chat template does not render tools (e.g. SmolLM2)

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise ValueError(f"provider: unknown {self.provider!r}; known: {', '.join(sorted(PROVIDERS))}")
        if self.timeout_s <= 0 or self.max_retries < 0 or self.backoff_s < 0 or self.cooldown_s < 0:
            raise ValueError("timeout_s must be > 0; max_retries, backoff_s and cooldown_s >= 0")

    @property
    def configured(self) -> bool:
        return bool(self.model)

    def backend(self, *, seed: int | None = None):
        """The ``OpenAIChatBackend`` for this endpoint (reads the key from the environment now)."""
        from porch_jax.backends.openai_chat import OpenAIChatBackend

        if not self.model:
            raise ValueError("endpoint has no model: set its model (and urls for a self-hosted server)")
        return OpenAIChatBackend(
            self.urls or None,
            self.model,
            provider=self.provider,
            api_key_env=self.api_key_env or None,
            timeout_s=self.timeout_s,
            max_retries=self.max_retries,
            backoff_s=self.backoff_s,
            cooldown_s=self.cooldown_s,
            seed=seed,
            tools_in_prompt=self.tools_in_prompt,
        )

    def flags(self, role: str) -> list[str]:
        """This spec as ``--{role}_{field} value`` command-line arguments (``endpoint_from_flags`` reads them)."""
        out = []
        for name in ENDPOINT_FIELDS:
            value = getattr(self, name)
            out += [f"--{role}_{name}", ",".join(value) if isinstance(value, tuple) else str(value)]
        return out


ENDPOINT_FIELDS = tuple(EndpointSpec.__dataclass_fields__)


def add_endpoint_flags(parser, role: str) -> None:
    """``--{role}_model``, ``--{role}_urls`` (comma-separated), ... on an argparse parser."""
    defaults = EndpointSpec()
    for name in ENDPOINT_FIELDS:
        default = getattr(defaults, name)
        if isinstance(default, tuple):
            parser.add_argument(f"--{role}_{name}", type=str, default=",".join(default))
        elif isinstance(default, bool):  # type=bool would read "False" as True
            parser.add_argument(f"--{role}_{name}", type=_flag_bool, default=default)
        else:
            parser.add_argument(f"--{role}_{name}", type=type(default), default=default)


def _flag_bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"not a boolean: {text!r} (true or false)")


def endpoint_from_flags(args: dict, role: str) -> EndpointSpec:
    """The ``EndpointSpec`` of ``role`` from parsed ``add_endpoint_flags`` arguments (removed from ``args``)."""
    values = {name: args.pop(f"{role}_{name}") for name in ENDPOINT_FIELDS}
    values["urls"] = tuple(u for u in values["urls"].split(",") if u)
    return EndpointSpec(**values)
