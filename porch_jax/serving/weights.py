"""Push new weights into a running vLLM server, and prove the server now computes our model.

A weight sync that silently fails (wrong folder, a tensor the loader skipped, a stale cache)
leaves rollouts sampling from an old policy while training assumes the new one. So a sync is
followed by a parity check: the server's prompt logprobs of a fixed token sequence against our
JAX model's ``log_softmax`` on the same ids; the max absolute gap is returned (log it every
step) and a gap above the tolerance raises ``WeightSyncError``.

Tied embeddings: vLLM 0.32's in-place reload rebuilds each layer from the checkpoint and puts a
layer it finds no tensor for back as it was; a tied ``lm_head`` has no tensor of its own, so it
keeps the OLD embedding as the output head (measured: gap 0.8 after reload, 5e-7 with the fix).
``export_for_serving`` therefore writes the head explicitly (``lm_head.safetensors``, which
``from_pretrained`` and transformers ignore for tied models), and ``push`` refuses a tied folder
without it.

``push`` checks the folder as vLLM would load it (``folder.check_folder``, no tokenizer needed) and, given the served
folder (``served_dir``, as ``VLLMServer.weight_sync`` passes it), that it is the served model with the served
tokenizer, so a reload never puts another model's weights into the server.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import httpx2 as httpx
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from safetensors import safe_open
from safetensors.numpy import save_file

from porch_jax.models import save_pretrained
from porch_jax.serving.folder import (
    TOKENIZER_FILES,
    FolderError,
    check_folder,
    check_same_model,
    check_same_tokenizer,
    tokenizer_fingerprint,
)

HEAD_FILE = "lm_head.safetensors"


class WeightSyncError(RuntimeError):
    """A weights folder the server cannot take, a failed reload, or server/model logprobs that disagree."""


def export_for_serving(model: Any, path: str | Path, tokenizer: Any = None) -> Path:
    """``save_pretrained`` plus, for tied embeddings, the output head as its own tensor (see module doc). The
    architecture check against vLLM's registry is ``architectures.check_vllm_architecture`` (launch/export.py runs
    it; a server's start runs ``check_folder``)."""
    path = save_pretrained(model, path, tokenizer=tokenizer)
    if model.config.tie_word_embeddings:
        kernel = model.lm_head_kernel()
        if isinstance(kernel, jax.Array) and not kernel.is_fully_addressable:  # sharded over processes: every
            kernel = multihost_utils.process_allgather(kernel, tiled=True)  # process joins the gather
        if jax.process_index() == 0:
            head = np.ascontiguousarray(np.asarray(jax.device_get(kernel)).T)
            save_file({"lm_head.weight": head}, str(path / HEAD_FILE), metadata={"format": "pt"})
    return path


def check_weights_folder(path: str | Path) -> Path:
    """Raises ``WeightSyncError`` unless ``path`` holds a config and weights a reload can fully apply (naming the
    file, field or tensor at fault)."""
    try:
        path = check_folder(path, tokenizer=False)
    except FolderError as e:
        raise WeightSyncError(str(e)) from e
    if json.loads((path / "config.json").read_text()).get("tie_word_embeddings", False):
        names = set()
        for file in sorted(path.glob("*.safetensors")):
            with safe_open(file, framework="numpy") as f:
                names.update(f.keys())
        if "lm_head.weight" not in names:
            raise WeightSyncError(
                f"{path}: tied embeddings but no lm_head.weight tensor; vLLM's reload would "
                "keep the old output head. Write the folder with export_for_serving."
            )
    return path


def model_prompt_logprobs(model: Any, token_ids: Sequence[int]) -> np.ndarray:
    """Our model's logprob of each token given the ones before it: ``[len(token_ids) - 1]`` float32."""
    ids = jnp.asarray([list(token_ids)], jnp.int32)
    logprobs = jax.nn.log_softmax(model(ids)[0, :-1].astype(jnp.float32), axis=-1)
    return np.asarray(jnp.take_along_axis(logprobs, ids[0, 1:, None], axis=-1)[:, 0])


class WeightSync:
    """Control-plane client of one server (one per server of an executor pool). ``served_dir``: the folder the
    server serves; given, ``push`` refuses a folder of another model or tokenizer."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str,
        model: str,
        timeout_s: float = 300.0,
        served_dir: str | Path | None = None,
    ):
        self.base_url, self.model = base_url.rstrip("/"), model
        self.served_dir = None if served_dir is None else Path(served_dir).resolve()
        self._served_tokenizer: dict[str, Any] | None = None
        self._client = httpx.Client(
            base_url=self.base_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=timeout_s, trust_env=False
        )

    def _post(
        self, path: str, body: dict[str, Any] | None = None, *, deadline: float | None = None, **params: str
    ) -> dict[str, Any]:
        """One control-plane call; ``deadline`` (a ``time.monotonic()`` instant) bounds it, else the client timeout."""
        timeout: Any = httpx.USE_CLIENT_DEFAULT
        if deadline is not None:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                raise WeightSyncError(f"{self.base_url}{path}: not sent, the push's deadline has passed")
        try:
            response = self._client.post(path, json=body or {}, params=params, timeout=timeout)
        except httpx.TransportError as e:
            raise WeightSyncError(f"{self.base_url}{path}: {type(e).__name__}: {e}") from e
        if response.status_code != 200:
            raise WeightSyncError(f"{self.base_url}{path}: HTTP {response.status_code}: {response.text[:500]}")
        return response.json() if response.content else {}

    def push(self, weights_dir: str | Path, *, pause_mode: str = "wait", timeout_s: float | None = None) -> float:
        """Pause, reload ``weights_dir`` (a folder on the server's machine), reset the prefix cache
        (its KV blocks were computed with the old weights), resume. Returns the seconds paused.

        ``pause_mode``: "wait" lets in-flight requests finish on the old weights, "keep" freezes
        them and continues them on the new ones, "abort" cancels them. If the reload fails the
        server stays paused (resuming would serve half-loaded weights) and this raises. A folder that fails
        ``check_weights_folder`` or, with ``served_dir``, ``check_served`` raises before the server is paused.
        ``timeout_s``: each call waits at most what is left of it, and a call due after it raises; None: each call
        within the client's timeout. A push to a server that died or stalls therefore raises, never hangs.
        """
        path = check_weights_folder(weights_dir)
        self.check_served(path)
        t0 = time.perf_counter()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._post("/pause", deadline=deadline, mode=pause_mode)
        try:
            reload = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
            self._post("/collective_rpc", reload, deadline=deadline)
            if not self._post("/reset_prefix_cache", deadline=deadline).get("success", False):
                raise WeightSyncError(f"{self.base_url}: prefix cache reset refused (blocks still held)")
        except WeightSyncError as e:
            raise WeightSyncError(f"{e}; the server is left paused with possibly partial weights") from e
        self._post("/resume", deadline=deadline)
        return time.perf_counter() - t0

    def check_served(self, path: str | Path) -> None:
        """Raises ``WeightSyncError`` unless folder ``path`` is the served model (``served_dir``'s config) and, where
        it has a tokenizer, has the served tokenizer and chat template; nothing to check without ``served_dir``."""
        if self.served_dir is None:
            return
        try:
            check_same_model(path, self.served_dir)
            if any((Path(path) / name).is_file() for name in TOKENIZER_FILES):
                if self._served_tokenizer is None:
                    self._served_tokenizer = tokenizer_fingerprint(self.served_dir)
                check_same_tokenizer(path, self.served_dir, served_fingerprint=self._served_tokenizer)
        except FolderError as e:
            raise WeightSyncError(f"{self.base_url}: {e}") from e

    def prompt_logprobs(self, token_ids: Sequence[int]) -> np.ndarray:
        """The server's logprob of each token given the ones before it: ``[len(token_ids) - 1]``."""
        ids = [int(t) for t in token_ids]
        if len(ids) < 2:
            raise ValueError("need at least 2 token ids to score")
        data = self._post(
            "/v1/completions",
            {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0},
        )
        try:
            entries = data["choices"][0]["prompt_logprobs"][1:]
            return np.array([entry[str(t)]["logprob"] for entry, t in zip(entries, ids[1:], strict=True)], np.float32)
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise WeightSyncError(f"{self.base_url}: prompt_logprobs do not cover the prompt ({e!r})") from e

    def check_parity(self, model: Any, token_ids: Sequence[int], *, tol: float = 1e-3) -> float:
        """Max |server - model| prompt logprob over ``token_ids``; raises ``WeightSyncError`` above ``tol``."""
        server, ours = self.prompt_logprobs(token_ids), model_prompt_logprobs(model, token_ids)
        gaps = np.abs(server - ours)
        gap = float(gaps.max())
        if not gap <= tol:  # NaN fails too
            worst = int(np.nanargmax(gaps)) if np.isfinite(gaps).any() else 0
            raise WeightSyncError(
                f"{self.base_url}: server and model logprobs differ by {gap:.3g} > {tol:g} (worst at token "
                f"{worst + 1}: server {server[worst]:.5f}, model {ours[worst]:.5f}); the served weights are "
                "not the trained ones"
            )
        return gap

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
