"""Batched KV-cache sampling from our Flax decoders, inside one jitted call per batch.

Why it looks the way it does:
- Prompts are LEFT-padded to a prompt-length bucket and the batch to a batch-size bucket, and the
  new-token budget is rounded to a power of two, so jit compiles once per bucket combination, not
  once per prompt length. `Sampler.num_compiles` counts the traces, for tests.
- Prefill and the whole decode loop (a `lax.while_loop` that exits when every row is done) run in
  one jitted function: no per-token host round trips, and the cache never leaves the device.
- Every sampling setting is a per-row array (temperature, top-p, top-k, seed, budget, stop ids),
  so requests with different settings share a batch without recompiling.
- Logprobs are those of the raw model: log_softmax of the unmodified logits at the sampled token,
  whatever the temperature / top-k / top-p. That is what a trainer recomputes from the same
  weights, so sampler and trainer logprobs are directly comparable.
- Stop strings are matched on the host after generation; text, token ids and logprobs are cut
  consistently (see `_apply_stop_strings`). One that is a single token also ends its row early.
- Sampling avoids sorting the vocabulary (slow on XLA:CPU): exact radix-select cuts for top-k /
  top-p, and inverse-CDF draws.
- A row's draws depend only on its own seed (its PRNG key is `key(seed)`, folded with the decode
  step), never on its position in the batch, so callers that give each row its own seed get the
  same samples however the rows are ordered or batched.
- With `prefix_cache_bytes`, a prompt that extends a sequence served recently (a conversation's next decision, or a
  row `score` or `next_token_logprobs` read: the held GRM's hint after its scored flag) starts from that sequence's
  keys and values (models/prefix_cache.py): they are placed in the cache's first slots, right-aligned, and only the
  rest of the prompt is prefilled after them, its positions continuing the prefix's.
  Rows reuse prefixes of different lengths in one batch; every slot that holds no token is masked. Attention over
  the same tokens gives the same keys and values, so greedy tokens equal the uncached path's. It runs on decoders
  with a plain KV cache, without a mesh (the evaluation's embedded sampler); a hybrid model's recurrent state and a
  sharded sampler (OPD's single-decision prompts, which extend nothing) sample as before.
- With a `mesh` (the trainer's), one call is one SPMD program over the mesh's devices in every
  process: each process passes the same prompts and settings, the rows are split over the mesh's
  batch axes, and every process gets all completions back (the outputs are replicated). That is
  how a model sharded over several processes samples.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from porch_jax.models.cache import KVCache
from porch_jax.models.prefix_cache import PrefixCache
from porch_jax.models.sharding import data_sharding
from porch_jax.protocol.render import prompt_ids

FinishReason = Literal["stop", "length"]


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one request. temperature 0 is greedy; top_k 0 and top_p 1 disable those filters.

    The end-of-sequence ids (tokenizer's eos and the config's eos_token_id) always stop a request
    unless `ignore_eos`; `stop_token_ids` add to them. A stop token is kept in the output. `stop`
    strings end the text just before the first match (see `_apply_stop_strings`).
    """

    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    seed: int = 0
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be >= 0, got {self.top_k}")
        if any(not s for s in self.stop):
            raise ValueError("SamplingParams.stop must not contain an empty string")


@dataclasses.dataclass
class Completion:
    """One generated continuation. `logprobs[i]` is the raw model logprob of `token_ids[i]`."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason
    prompt_token_ids: list[int] = dataclasses.field(default_factory=list)


# The fewest tokens a row reuses (and the smallest prefix bucket): below it the prefix saves less than its copy costs.
MIN_REUSE = 16


def _powers_of_two(lo: int, hi: int) -> tuple[int, ...]:
    """lo, 2*lo, ... below hi, then hi."""
    out, n = [], lo
    while n < hi:
        out.append(n)
        n *= 2
    return (*out, hi)


def _round_up_pow2(n: int, lo: int) -> int:
    return max(lo, 1 << max(n - 1, 0).bit_length())


@functools.partial(jax.jit, static_argnames=("length", "dtype"))
def _right_align(k: jax.Array, n: jax.Array, *, length: int, dtype: Any) -> jax.Array:
    """The first `n` token slots of a stored entry [layers, kv_heads, S, head_dim] right-aligned in `length`
    slots, the slots before them zero. `n` is traced, so one compilation serves every reuse length."""
    idx = jnp.arange(length) - (length - n)
    picked = jnp.take(k, jnp.clip(idx, 0, k.shape[2] - 1), axis=2).astype(dtype)
    return jnp.where((idx >= 0)[None, None, :, None], picked, jnp.zeros((), dtype))


@jax.jit
def _gather_slots(k_all: jax.Array, v_all: jax.Array, slots: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Each cache row's keys and values at its `slots` [batch, S]: [batch, layers, kv_heads, S, head_dim]."""

    def rows(x: jax.Array) -> jax.Array:  # x [layers, batch, kv_heads, T, head_dim]
        return jax.vmap(lambda xb, s: jnp.take(xb, s, axis=2), in_axes=(1, 0))(x, slots)

    return rows(k_all), rows(v_all)


def _bucket(n: int, buckets: Sequence[int]) -> int:
    return next(b for b in buckets if b >= n)


class Sampler:
    """Generates from `model` (a Flax NNX causal LM per docs/CONTRACTS.md) with a KV cache.

    The model's current weights are read at every call, so a trainer can keep updating the model
    in place and sample from it without rebuilding the sampler (or recompiling). `mesh`: the mesh the
    model's weights live on, for sampling across its devices and processes (module docstring); batch
    buckets then round up to a multiple of its batch shards. `max_batch_tokens`: the most padded prompt tokens (batch
    bucket x prompt bucket) one forward takes; a call with more prompts is cut into batches within it (a prompt alone
    always goes), since a prefill's memory grows with both (its logits alone are batch x length x vocab). None: batches
    of the largest batch bucket.
    """

    def __init__(
        self,
        model: nnx.Module,
        tokenizer: Any,
        *,
        max_len: int = 2048,
        prompt_buckets: Sequence[int] | None = None,
        batch_buckets: Sequence[int] = (1, 2, 4, 8, 16, 32),
        cache_dtype: jnp.dtype | None = None,
        mesh: jax.sharding.Mesh | None = None,
        prefix_cache_bytes: int = 0,
        max_batch_tokens: int | None = None,
    ):
        if max_batch_tokens is not None and max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1 or None, got {max_batch_tokens}")
        self.model, self.mesh = model, mesh
        self.max_batch_tokens = max_batch_tokens
        self._budget = math.inf if max_batch_tokens is None else max_batch_tokens
        self.tokenizer = tokenizer
        self.max_len = max_len
        # A prompt leaves at least one slot of the max_len-slot cache for the first new token.
        buckets = prompt_buckets or _powers_of_two(64, max_len)
        self.prompt_buckets = tuple(sorted({min(b, max_len - 1) for b in buckets}))
        shards = 1 if mesh is None else _batch_shards(mesh)
        self.batch_buckets = tuple(sorted({-(-b // shards) * shards for b in batch_buckets}))
        self.config = model.config
        self.cache_dtype = cache_dtype or getattr(model, "dtype", jnp.float32)
        self.eos_ids = eos_ids(tokenizer, self.config)
        self.num_compiles = 0
        self._graphdef = nnx.split(model)[0]
        replicated = None if mesh is None else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        self._generate = jax.jit(
            self._generate_impl, static_argnames=("cache_len", "keep_cache"), out_shardings=replicated
        )
        self._score = jax.jit(self._score_impl, out_shardings=replicated)
        self._score_keeping = jax.jit(self._score_keeping_impl)
        self.prefixes = None
        if prefix_cache_bytes:
            if mesh is not None or not isinstance(_empty_cache(model, 1, 1, self.cache_dtype), KVCache):
                raise ValueError(
                    "prefix reuse (prefix_cache_bytes) needs a decoder with a plain KV cache and no mesh; "
                    f"got {type(model).__name__}{' on a mesh' if mesh is not None else ''}"
                )
            self.prefixes = PrefixCache(prefix_cache_bytes)
        self._weights: list[Any] = []  # weak references to the weights the cached prefixes were computed with

    # ----------------------------------------------------------------------------- public API

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Completion]:
        """Completes each prompt (a list of token ids); returns completions in prompt order.

        One `params` for all prompts seeds request i with `params.seed + i`, so identical prompts
        in one call still draw different samples; a list gives each request its own params. A
        request whose prompt bucket plus max_new_tokens exceeds max_len ends early with "length".
        """
        prompts = [list(map(int, p)) for p in prompts]
        if isinstance(params, SamplingParams):
            params = [dataclasses.replace(params, seed=params.seed + i) for i in range(len(prompts))]
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} SamplingParams")
        if any(p.stop for p in params) and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty")
            if len(p) > self.prompt_buckets[-1]:
                raise ValueError(
                    f"prompt {i} has {len(p)} tokens; the largest prompt bucket is {self.prompt_buckets[-1]}"
                    f" (max_len={self.max_len})"
                )
        # Similar lengths share a batch, so little of it is padding.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        results: list[Completion | None] = [None] * len(prompts)
        state = nnx.state(self.model)
        if self.prefixes is not None and not self._same_weights(state):
            self.prefixes.clear()  # keys and values of other weights
        for chunk in self._batches(order, [len(p) for p in prompts]):
            completions = self._run_batch(state, [prompts[i] for i in chunk], [params[i] for i in chunk])
            for i, completion in zip(chunk, completions, strict=False):
                results[i] = completion
        return results

    def score(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]) -> list[float]:
        """The model's log-probability of each continuation after its prompt: the sum over its tokens of the raw
        model's log-softmax, one forward pass per batch (what a forced reply prefix's choice between candidates
        reads; a prompt with its continuation must fit the largest prompt bucket)."""
        if len(prompts) != len(continuations):
            raise ValueError(f"got {len(prompts)} prompts but {len(continuations)} continuations")
        rows, positions = [], []
        for i, (p, c) in enumerate(zip(prompts, continuations, strict=True)):
            if not c or not p:
                raise ValueError(f"row {i}: a prompt and a continuation must both be non-empty")
            row = list(map(int, p)) + list(map(int, c))
            rows.append(row)
            positions.append(list(zip(range(len(p) - 1, len(row) - 1), row[len(p) :], strict=True)))
        return [sum(lps) for lps in self._logprobs_at(rows, positions)]

    def next_token_logprobs(self, prompts: Sequence[Sequence[int]], tokens: Sequence[int]) -> list[list[float]]:
        """Each prompt's next-token log-probability of every id in `tokens`: one row per prompt (candidates of one
        token each, e.g. a forced flag's " true" and " false", read from a single forward pass)."""
        if any(not p for p in prompts):
            raise ValueError("a prompt must be non-empty")
        rows = [list(map(int, p)) for p in prompts]
        return self._logprobs_at(rows, [[(len(r) - 1, int(t)) for t in tokens] for r in rows])

    def _logprobs_at(self, rows: list[list[int]], positions: list[list[tuple[int, int]]]) -> list[list[float]]:
        """For each row, the raw log-probability of token id `t` at column `c` (the prediction of column c + 1) for
        each (c, t) of its positions."""
        for i, row in enumerate(rows):
            if len(row) > self.prompt_buckets[-1]:
                raise ValueError(
                    f"row {i} has {len(row)} tokens; the largest prompt bucket is {self.prompt_buckets[-1]}"
                )
        state = nnx.state(self.model)
        if self.prefixes is not None and not self._same_weights(state):
            self.prefixes.clear()
        out: list[list[float]] = [[] for _ in rows]
        for picks in self._batches(sorted(range(len(rows)), key=lambda i: len(rows[i])), [len(r) for r in rows]):
            chunk, where = [rows[i] for i in picks], [positions[i] for i in picks]
            batch = _bucket(len(chunk), self.batch_buckets)
            length = _bucket(max(map(len, chunk)), self.prompt_buckets)
            k = _round_up_pow2(max(map(len, where)), lo=4)
            tokens = np.zeros((batch, length), np.int32)
            mask = np.zeros((batch, length), bool)
            index = np.zeros((batch, k), np.int32)
            targets = np.zeros((batch, k), np.int32)
            for b, (row, pos) in enumerate(zip(chunk, where, strict=True)):
                tokens[b, : len(row)], mask[b, : len(row)] = row, True
                index[b, : len(pos)] = [c for c, _ in pos]
                targets[b, : len(pos)] = [t for _, t in pos]
            if self.prefixes is not None:  # the rows' keys and values stay for a request that extends a row
                picked, cache = self._score_keeping(state, tokens, mask, index, targets)
                self._store(cache, chunk, [np.arange(len(row)) for row in chunk])  # right-padded: first slots
            elif self.mesh is None:
                picked = self._score(state, tokens, mask, index, targets)
            else:
                with jax.set_mesh(self.mesh):
                    picked = self._score(state, *map(self._rows_on_mesh, (tokens, mask, index, targets)))
            picked = np.asarray(jax.device_get(picked))
            for b, (i, pos) in enumerate(zip(picks, where, strict=True)):
                out[i] = picked[b, : len(pos)].tolist()
        return out

    def _padded(self, batch: Sequence[int], lengths: Sequence[int]) -> int:
        """The prompt tokens of `batch` (indices into `lengths`) padded to its batch and prompt buckets."""
        return _bucket(len(batch), self.batch_buckets) * _bucket(max(lengths[i] for i in batch), self.prompt_buckets)

    def _batches(self, order: Sequence[int], lengths: Sequence[int]) -> Iterator[list[int]]:
        """`order` (indices by rising length) cut into consecutive batches of at most the largest batch bucket, each
        padded batch within `max_batch_tokens` where set (a prompt alone always goes)."""
        chunk: list[int] = []
        for i in order:
            grown = [*chunk, i]
            if chunk and (len(grown) > self.batch_buckets[-1] or self._padded(grown, lengths) > self._budget):
                yield chunk
                grown = [i]
            chunk = grown
        if chunk:
            yield chunk

    def chat(
        self,
        conversations: Sequence[Sequence[dict[str, Any]]],
        params: SamplingParams | Sequence[SamplingParams],
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> list[Completion]:
        """Renders each conversation with the tokenizer's chat template (same `tools` for all; in the system
        message when the template does not render tools) and generates the assistant's next turn."""
        prompts = [prompt_ids(self.tokenizer, messages, tools) for messages in conversations]
        return self.generate(prompts, params)

    # ----------------------------------------------------------------------------- host side

    def _same_weights(self, state: nnx.State) -> bool:
        """Whether `state` holds the arrays the cached prefixes were computed with (the model's weights change by
        replacement: a trainer's update swaps the arrays); remembers them for the next call."""
        leaves = jax.tree.leaves(state)
        same = len(leaves) == len(self._weights) and all(r() is x for r, x in zip(self._weights, leaves, strict=True))
        self._weights = [weakref.ref(x) for x in leaves]
        return same

    def _reuse(self, prompts: list[list[int]]) -> list[tuple[Any, int]]:
        """(cached entry, tokens of it to reuse) per prompt: its longest cached prefix, less the prompt's last token
        (prefilled in any case: its logits give the first new token); (None, 0) below a reuse worth a bucket."""
        out = []
        for prompt in prompts:
            entry, n = self.prefixes.longest(prompt)
            n = min(n, len(prompt) - 1)
            out.append((entry, n) if n >= MIN_REUSE else (None, 0))
            self.prefixes.count(out[-1][1])
        return out

    def _run_batch(self, state: nnx.State, prompts: list[list[int]], params: list[SamplingParams]) -> list[Completion]:
        n = len(prompts)
        batch = _bucket(n, self.batch_buckets)
        prompt_len = _bucket(max(map(len, prompts)), self.prompt_buckets)
        num_new = min(self.max_len, prompt_len + _round_up_pow2(max(p.max_new_tokens for p in params), lo=16))
        num_new -= prompt_len  # the budget the uncached path gives this batch, whatever is reused
        reuse = self._reuse(prompts) if self.prefixes is not None else [(None, 0)] * n
        reused = [k for _, k in reuse]
        prefix_len = _round_up_pow2(max(reused), lo=MIN_REUSE) if any(reused) else 0
        suffixes = [p[k:] for p, k in zip(prompts, reused, strict=True)]
        chunk = _bucket(max(map(len, suffixes)), self.prompt_buckets) if prefix_len else prompt_len
        stop_sets = [self._stop_ids(p) for p in params]
        stop_ids = np.full((batch, _round_up_pow2(max(map(len, stop_sets)), lo=4)), -1, np.int32)
        tokens = np.full((batch, chunk), self.config.pad_token_id or 0, np.int32)
        prompt_mask = np.zeros((batch, chunk), bool)
        prompt_mask[n:, -1] = True  # filler rows: one token each, budget 0, so they finish at once
        offsets = np.zeros(batch, np.int32)
        offsets[:n] = reused
        for b, (suffix, stops) in enumerate(zip(suffixes, stop_sets, strict=False)):
            tokens[b, chunk - len(suffix) :] = suffix
            prompt_mask[b, chunk - len(suffix) :] = True
            stop_ids[b, : len(stops)] = stops

        def column(field: str, dtype, fill=0) -> np.ndarray:
            return np.array([getattr(p, field) for p in params] + [fill] * (batch - n), dtype)

        seeds = (column("seed", np.int64) % 2**32).astype(np.uint32)
        rows = [
            tokens,
            prompt_mask,
            offsets,
            self._prefix(reuse, batch, prefix_len) if prefix_len else None,
            stop_ids,
            column("temperature", np.float32),
            column("top_p", np.float32, 1),
            column("top_k", np.int32),
            column("max_new_tokens", np.int32),
            seeds,
        ]
        keep = self.prefixes is not None
        cache_len = prefix_len + chunk + num_new
        if self.mesh is None:
            out = self._generate(state, *rows, cache_len=cache_len, keep_cache=keep)
        else:
            with jax.set_mesh(self.mesh):
                on_mesh = [None if x is None else self._rows_on_mesh(x) for x in rows]
                out = self._generate(state, *on_mesh, cache_len=cache_len, keep_cache=keep)
        out_tokens, out_logprobs, lengths, stopped = jax.device_get(out[:4])
        completions = []
        for b in range(n):
            k = int(lengths[b])
            completion = Completion(
                token_ids=out_tokens[b, :k].tolist(),
                logprobs=out_logprobs[b, :k].tolist(),
                text="",
                finish_reason="stop" if stopped[b] else "length",
                prompt_token_ids=prompts[b],
            )
            completions.append(self._finish_text(completion, params[b].stop))
        if keep:
            self._remember(out[4], prompts, reused, out_tokens[:n], lengths[:n], prefix_len, chunk)
        return completions

    def _prefix(self, reuse: list[tuple[Any, int]], batch: int, length: int) -> tuple[jax.Array, jax.Array, np.ndarray]:
        """Each row's reused keys and values right-aligned in `length` slots ([layers, batch, kv_heads, length,
        head_dim]), and which slots hold them. One jitted gather per (stored bucket, length), so a new reuse length
        compiles nothing."""
        cfg = self.config
        empty = jnp.zeros((cfg.num_hidden_layers, cfg.num_key_value_heads, length, cfg.head_dim), self.cache_dtype)
        ks, vs = [], []
        mask = np.zeros((batch, length), bool)
        for b in range(batch):
            entry, n = reuse[b] if b < len(reuse) else (None, 0)
            if entry is None:
                ks.append(empty)
                vs.append(empty)
                continue
            ks.append(_right_align(entry.k, n, length=length, dtype=self.cache_dtype))
            vs.append(_right_align(entry.v, n, length=length, dtype=self.cache_dtype))
            mask[b, length - n :] = True
        return jnp.stack(ks, axis=1), jnp.stack(vs, axis=1), mask

    def _remember(self, cache, prompts, reused, out_tokens, lengths, prefix_len: int, chunk: int) -> None:
        """Stores each row's prompt and sampled tokens (all but the last, whose keys the loop never wrote) with
        their keys and values, from the slots they occupy."""
        rows = []
        for b, prompt in enumerate(prompts):
            sampled = max(int(lengths[b]) - 1, 0)
            suffix = len(prompt) - reused[b]
            rows.append(
                np.concatenate(
                    [
                        np.arange(prefix_len - reused[b], prefix_len),
                        np.arange(prefix_len + chunk - suffix, prefix_len + chunk),
                        np.arange(prefix_len + chunk, prefix_len + chunk + sampled),
                    ]
                )
            )
        sequences = [list(p) + out_tokens[b, : max(int(lengths[b]) - 1, 0)].tolist() for b, p in enumerate(prompts)]
        self._store(cache, sequences, rows)

    def _store(self, cache: tuple[jax.Array, jax.Array], sequences: list[list[int]], slots: list[np.ndarray]) -> None:
        """Puts each cache row's token sequence in the prefix cache with its keys and values, read from that row's
        `slots` (one per token) in one jitted gather; each entry's arrays are padded to a power-of-two length (the
        entry knows its true length from its tokens)."""
        k_all, v_all = cache
        width = _round_up_pow2(max(len(r) for r in slots), lo=MIN_REUSE)
        table = np.zeros((k_all.shape[1], width), np.int32)  # every cache row, so the gather's shape is the batch's
        for b, r in enumerate(slots):
            table[b, : len(r)] = r
        k_rows, v_rows = _gather_slots(k_all, v_all, jnp.asarray(table))
        for b, tokens in enumerate(sequences):
            self.prefixes.put(tokens, k_rows[b], v_rows[b])

    def _rows_on_mesh(self, x: np.ndarray) -> jax.Array:
        """A host array [batch, ...], the same in every process, as a global array with its rows over the mesh's
        batch axes: each process transfers only the rows its devices hold."""
        sharding = data_sharding(self.mesh, rows=x.shape[0])
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    def _stop_ids(self, params: SamplingParams) -> list[int]:
        """Token ids that end a row on the device. A stop string that is one token of its own
        (`</tool_call>`, `<|im_end|>`) is one too: it ends the row early instead of only being cut
        on the host afterwards (where it is still matched, with the same result)."""
        ids = set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_ids)
        for text in params.stop:
            encoded = self.tokenizer.encode(text, add_special_tokens=False)
            if len(encoded) == 1:
                ids.add(encoded[0])
        return sorted(ids)

    def _finish_text(self, completion: Completion, stop: tuple[str, ...]) -> Completion:
        if self.tokenizer is None:
            return completion
        completion.text = self._decode(completion.token_ids)
        if stop and any(s in completion.text for s in stop):
            _apply_stop_strings(completion, stop, self._decode)
        return completion

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # ----------------------------------------------------------------------------- device side

    def _score_impl(self, state, tokens, mask, index, targets):
        model = nnx.merge(self._graphdef, state)
        return _picked_logprobs(model, model.hidden_states(tokens, attention_mask=mask), index, targets)

    def _score_keeping_impl(self, state, tokens, mask, index, targets):
        """`_score_impl` through the KV cache (a first prefill, blockwise as in `generate`), which it returns."""
        model = nnx.merge(self._graphdef, state)
        cache = _empty_cache(model, tokens.shape[0], tokens.shape[1], self.cache_dtype)
        hidden, cache = model.hidden_states(tokens, attention_mask=mask, cache=cache, cache_index=0)
        return _picked_logprobs(model, hidden, index, targets), (cache.k, cache.v)

    def _generate_impl(
        self,
        state,
        tokens,
        prompt_mask,
        offsets,
        prefix,
        stop_ids,
        temperature,
        top_p,
        top_k,
        max_new,
        seed,
        *,
        cache_len,
        keep_cache,
    ):
        self.num_compiles += 1  # runs once per trace, i.e. per compilation
        model = nnx.merge(self._graphdef, state)
        batch, chunk = tokens.shape
        start = 0 if prefix is None else prefix[0].shape[3]  # slots of reused keys and values before the prompt
        prompt_len = start + chunk
        num_new = cache_len - prompt_len
        keys = jax.vmap(jax.random.key)(seed)
        max_new = jnp.minimum(max_new, num_new)
        head = model.lm_head_kernel()

        positions = (offsets[:, None] + jnp.maximum(jnp.cumsum(prompt_mask, axis=1) - 1, 0)).astype(jnp.int32)
        cache = _empty_cache(model, batch, cache_len, self.cache_dtype)
        if prefix is not None:
            k, v, mask = prefix
            cache = KVCache(
                k=cache.k.at[:, :, :, :start].set(k),
                v=cache.v.at[:, :, :, :start].set(v),
                mask=cache.mask.at[:, :start].set(mask),
            )
        hidden, cache = model.hidden_states(
            tokens, positions=positions, attention_mask=prompt_mask, cache=cache, cache_index=start
        )
        next_position = positions[:, -1] + 1

        def pick(step, logits, done, lengths, out_tokens, out_logprobs):
            token, logprob = _sample(logits, keys, step, temperature, top_p, top_k)
            out_tokens = out_tokens.at[:, step].set(token)
            out_logprobs = out_logprobs.at[:, step].set(logprob)
            lengths = lengths + (~done).astype(jnp.int32)
            stopped = jnp.any(token[:, None] == stop_ids, axis=1) & ~done
            done = done | stopped | (lengths >= max_new)
            return token, done, lengths, out_tokens, out_logprobs, stopped

        logits = _logits(hidden[:, -1], head)
        zeros = jnp.zeros(batch, jnp.int32)
        token, done, lengths, out_tokens, out_logprobs, stopped = pick(
            0,
            logits,
            zeros.astype(bool),
            zeros,
            jnp.zeros((batch, num_new), jnp.int32),
            jnp.zeros((batch, num_new), jnp.float32),
        )

        def cond(carry):
            step, _, _, done, *_ = carry
            return (step < num_new) & ~jnp.all(done)

        def body(carry):
            step, token, cache, done, lengths, out_tokens, out_logprobs, stopped = carry
            hidden, cache = model.hidden_states(
                token[:, None],
                positions=(next_position + step - 1)[:, None],
                cache=cache,
                cache_index=prompt_len + step - 1,
            )
            token, done, lengths, out_tokens, out_logprobs, new_stop = pick(
                step, _logits(hidden[:, 0], head), done, lengths, out_tokens, out_logprobs
            )
            return step + 1, token, cache, done, lengths, out_tokens, out_logprobs, stopped | new_stop

        carry = (jnp.int32(1), token, cache, done, lengths, out_tokens, out_logprobs, stopped)
        _, _, cache, _, lengths, out_tokens, out_logprobs, stopped = jax.lax.while_loop(cond, body, carry)
        if keep_cache:
            return out_tokens, out_logprobs, lengths, stopped, (cache.k, cache.v)
        return out_tokens, out_logprobs, lengths, stopped


def _batch_shards(mesh: jax.sharding.Mesh) -> int:
    """How many blocks the mesh's batch axes split a batch into."""
    entry = data_sharding(mesh).spec[0]
    axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    return int(np.prod([mesh.shape[a] for a in axes]))


def _empty_cache(model: nnx.Module, batch: int, max_len: int, dtype) -> Any:
    """A model with its own decoding state (Qwen3.5's attention + DeltaNet cache) builds it via
    `init_cache`; plain attention decoders use a KVCache."""
    if hasattr(model, "init_cache"):
        return model.init_cache(batch, max_len, dtype)
    return KVCache.init(model.config, batch, max_len, dtype)


def _picked_logprobs(model: nnx.Module, hidden: jax.Array, index: jax.Array, targets: jax.Array) -> jax.Array:
    """The raw log-probability of targets [B, K] predicted at columns index [B, K] of hidden [B, T, H]; the head
    runs only at the scored positions."""
    hidden = jnp.take_along_axis(hidden, index[..., None], axis=1)
    logp = jax.nn.log_softmax(_logits(hidden, model.lm_head_kernel()), axis=-1)
    return jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


def _logits(hidden: jax.Array, head: jax.Array) -> jax.Array:
    return jnp.dot(hidden, head.astype(hidden.dtype), preferred_element_type=jnp.float32)


def _sample(logits, keys, step, temperature, top_p, top_k) -> tuple[jax.Array, jax.Array]:
    """Next token per row and its raw logprob. Greedy rows take the argmax; sampling rows apply
    temperature, then top-k, then top-p, and draw by inverse CDF (one uniform per row: on CPU this
    is ~3x cheaper than Gumbel noise over the vocabulary). Filters run only if a row asks for them."""
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    sampling = temperature > 0

    def draw() -> jax.Array:
        probs = jax.nn.softmax(logits / jnp.where(sampling, temperature, 1.0)[:, None], axis=-1)
        filtering = sampling & ((top_k > 0) | (top_p < 1))
        probs = jax.lax.cond(jnp.any(filtering), lambda: _top_k_top_p(probs, top_k, top_p), lambda: probs)
        step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, step)
        return _inverse_cdf(probs, jax.vmap(jax.random.uniform)(step_keys))

    token = jnp.where(sampling, jax.lax.cond(jnp.any(sampling), draw, lambda: greedy), greedy)
    logprob = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), token[:, None], axis=-1)[:, 0]
    return token, logprob


def _top_k_top_p(probs: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Zeroes all but the top_k most likely tokens (0: all), then all but the smallest set of the
    most likely ones whose mass reaches top_p. Ties at a cut are kept, as in transformers.

    A full sort of the vocabulary is slow on XLA:CPU (~4 ms for 8 x 2048); instead each cut is found
    exactly by a radix select: non-negative float32 values order like their int32 bit patterns.
    """
    bits = jax.lax.bitcast_convert_type(probs, jnp.int32)
    k = jnp.where(top_k > 0, top_k, probs.shape[-1])
    kth = _largest_passing(lambda b: jnp.sum(bits >= b[:, None], axis=-1) >= k, probs.shape[0])
    probs = jnp.where(bits >= kth[:, None], probs, 0.0)
    mass = top_p * jnp.sum(probs, axis=-1)
    cut = _largest_passing(
        lambda b: jnp.sum(jnp.where(bits >= b[:, None], probs, 0.0), axis=-1) >= mass, probs.shape[0]
    )
    return jnp.where(bits >= cut[:, None], probs, 0.0)


def _largest_passing(passes, rows: int) -> jax.Array:
    """Per row, the largest non-negative int32 b with passes(b), for passes monotone decreasing in b."""

    def bit(i, prefix):
        candidate = prefix | jnp.left_shift(jnp.int32(1), 30 - i)
        return jnp.where(passes(candidate), candidate, prefix)

    return jax.lax.fori_loop(0, 31, bit, jnp.zeros(rows, jnp.int32))


def _inverse_cdf(probs: jax.Array, uniform: jax.Array) -> jax.Array:
    """The first token whose cumulative probability exceeds uniform * total (zero-probability
    tokens are never picked; the clamp covers u * total rounding up to the total)."""
    cdf = jnp.cumsum(probs, axis=-1)
    token = jnp.sum(cdf <= (uniform * cdf[:, -1])[:, None], axis=-1)
    last = probs.shape[-1] - 1 - jnp.argmax(probs[:, ::-1] > 0, axis=-1)
    return jnp.minimum(token, last).astype(jnp.int32)


def eos_ids(tokenizer: Any, config: Any) -> set[int]:
    """The ids that end a request: the tokenizer's eos and the model config's eos_token_id(s) (a served sampler
    sends them as stop_token_ids, so both stop alike)."""
    ids = set()
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    eos = config.eos_token_id
    if eos is not None:
        ids.update((eos,) if isinstance(eos, int) else eos)
    return ids


def _apply_stop_strings(completion: Completion, stop: tuple[str, ...], decode) -> None:
    """Cuts a completion at the first stop string, as OpenAI-compatible servers do: the text ends
    just before the stop string; token_ids and logprobs end with the token that completed it (the
    tokens the model actually produced, which a trainer must score)."""
    ids = completion.token_ids
    for end in range(1, len(ids) + 1):
        text = decode(ids[:end])
        hits = [text.find(s) for s in stop if s in text]
        if hits:
            completion.token_ids, completion.logprobs = ids[:end], completion.logprobs[:end]
            completion.text = text[: min(hits)]
            completion.finish_reason = "stop"
            return
