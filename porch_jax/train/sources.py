"""Batch sources: each step's global batch [accum, micro, ...] for the step, and host metrics.

    class BatchSource(Protocol):
        views: tuple[str, ...]                # the views its batches hold (the Trainer checks the method's)
        on_policy: bool                       # reads the current student (the trainer keeps it current)
        def __call__(self, step, student) -> (batch of global arrays, {metric: float})
        def state(self) -> dict               # the data position, saved with each checkpoint
        def restore(self, state: dict) -> None
        row_counts: {name: overlong.RowCounts}  # optional: how its rows fared against its largest bucket
        def check_step(self, step, metrics) -> None  # optional: raises when the step's metrics show a fault

`RecordSource`: data.py records (one decision per row), epochs of shuffled buckets, gradient
accumulation and several hosts; with an `ActionSampler` it replaces OPD targets by student samples.
`PackedSource`: packed decision rows (SFT, RWR). `OpdSource`: OPD rows whose action the current
student samples. `GroupSource`: DA-GRPO groups at expert contexts. `CombinedViews`: several sources'
views in one batch (OPOD: packed RWR rows + OPD rows). The packed sources are pure functions of
(seed, step) and the student, so a resumed run sees the same batches.

Several processes: every process computes the same global host batch (the plan is a pure function of the
seed and the step; on-policy samples come from one SPMD sampler call that every process makes with the same
prompts and that returns every row to each of them) and transfers only the rows its devices hold (`place`,
`BatchIterator.to_global`). A row's sampling seed is `row_seed(seed, step, its key in the dataset)`, never
its position in a batch or a process's slice, so the samples do not depend on how rows are laid out over
processes and devices.

`ActionSampler` is the embedded sampler behind one call, `(student, prompts, step, *, seeds=None) ->
completions` (token_ids, logprobs, text, finish_reason per prompt, in order) and its `cfg` (the
SamplingConfig, whose seed `on_policy_targets` hashes); a served sampler with the same call fits every source.

The on-policy sources take `sampler=`: None builds the embedded `ActionSampler` for their shapes; a
served_sampler.ServedActionSampler samples on a vLLM server. A sampler's `stats` (where it has them) join the step's
host metrics, and its `check_step(step, metrics)` (the served sampler's logprob-gap rule) runs through the source's
`check_step`, which the trainer calls after each step, before its checkpoint.

Rows longer than a source's largest bucket follow its `overlong` rule ("drop", "cut" or "error"; what "cut" does to
each row kind is overlong.py's), applied once when the source is built: the source logs the counts and keeps them
in `row_counts`, which the trainer prints and writes to WORKDIR/rows.json.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import numpy as np
from flax import nnx

from porch_jax.models.sampler import Sampler, SamplingParams
from porch_jax.train import data as data_lib
from porch_jax.train import losses
from porch_jax.train import mesh as mesh_lib
from porch_jax.train import overlong as overlong_lib
from porch_jax.train.config import SamplingConfig
from porch_jax.train.packing import ExpertContext, OpdRow, SeqRow, bucket, scored_batch, seq_batch

log = logging.getLogger(__name__)
Batch = dict[str, Any]


class BatchSource(Protocol):
    views: tuple[str, ...]
    on_policy: bool

    def __call__(self, step: int, student: nnx.Module) -> tuple[Batch, dict[str, float]]: ...

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...


def place(host: Batch, mesh: jax.sharding.Mesh) -> Batch:
    """The global host batch [B, ...] (the same in every process) as a global [1, B, ...] batch, rows over the
    mesh's batch axes; each process transfers only the blocks its devices hold."""
    spec = tuple(mesh_lib.batch_spec(mesh=mesh))

    def put(x: np.ndarray) -> jax.Array:
        x = np.asarray(x)[None]
        pspec = jax.sharding.PartitionSpec(*(spec + (None,) * x.ndim)[: x.ndim])
        return jax.make_array_from_callback(x.shape, jax.sharding.NamedSharding(mesh, pspec), lambda i: x[i])

    return jax.tree.map(put, host)


def row_seed(seed: int, step: int, key: Any) -> int:
    """The sampling seed of the row named `key` (JSON-able: a decision key, an index, a (context, member) pair) at
    `step`: a hash of all three, in [0, 2**32), so it does not depend on where the row lies in a batch or which
    process holds it, and a resumed run draws the same."""
    digest = hashlib.blake2b(json.dumps([seed, step, key]).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


class ActionSampler:
    """The student's on-policy actions through the embedded sampler, bound to the current student (rebuilt when the
    student object changes) and, with `mesh`, run over the mesh's devices in every process (models/sampler.py).

    Called with the step's prompts (the same in every process) and `seeds`, one per prompt (`row_seed`); without
    seeds, prompt i of step s gets `row_seed(cfg.seed, s, i)`."""

    def __init__(self, tokenizer: Any, cfg: SamplingConfig, mesh: jax.sharding.Mesh | None = None, **sampler_args):
        self.cfg, self._args = cfg, dict(tokenizer=tokenizer, mesh=mesh, **sampler_args)
        self.sampler: Sampler | None = None

    def __call__(
        self,
        student: nnx.Module,
        prompts: Sequence[Sequence[int]],
        step: int,
        *,
        seeds: Sequence[int] | None = None,
    ) -> list[Any]:
        if seeds is None:
            seeds = [row_seed(self.cfg.seed, step, i) for i in range(len(prompts))]
        if len(seeds) != len(prompts):
            raise ValueError(f"ActionSampler got {len(prompts)} prompts but {len(seeds)} seeds")
        if self.sampler is None or self.sampler.model is not student:
            self.sampler = Sampler(student, **self._args)
        params = [
            SamplingParams(
                max_new_tokens=self.cfg.max_new_tokens,
                temperature=self.cfg.temperature,
                top_p=self.cfg.top_p,
                seed=int(seed),
            )
            for seed in seeds
        ]
        return self.sampler.generate([list(p) for p in prompts], params)


class RecordSource:
    """data.py examples through a resumable `BatchIterator`; with `sampler`, each OPD row's target
    (the "student" and "teacher" views) becomes an action the current student samples under the
    student view, its sampler log-probabilities kept (the step reports their gap to the trainer's).
    An example over the largest (T, K) bucket follows `overlong` (default "error": a DataError naming it)."""

    def __init__(
        self,
        examples: Sequence[data_lib.Example],
        *,
        views: Sequence[str],
        scalars: Sequence[str],
        buckets: data_lib.Buckets,
        micro_batch: int,
        accum_steps: int,
        pad_id: int,
        seed: int,
        mesh: jax.sharding.Mesh,
        target_reserve: int = 0,
        sampler: Any = None,
        overlong: overlong_lib.Overlong = "error",
    ):
        self.sampler, self.on_policy, self.views = sampler, sampler is not None, tuple(views)
        examples, counts = overlong_lib.examples(
            examples, max(buckets.lengths), max(buckets.targets), overlong, target_reserve
        )
        self.row_counts = {"records": _logged("records", counts)}
        self.batches = data_lib.BatchIterator(
            examples,
            buckets=buckets,
            micro_batch=micro_batch,
            accum_steps=accum_steps,
            views=views,
            scalars=scalars,
            pad_id=pad_id,
            batch_sharding=jax.sharding.NamedSharding(mesh, mesh_lib.batch_spec(mesh=mesh)),
            state=data_lib.IteratorState(seed=seed),
            target_reserve=target_reserve,
        )

    def __call__(self, step: int, student: nnx.Module) -> tuple[Batch, dict[str, float]]:
        host = self.batches.next_host_batch()
        if self.sampler is not None:
            host = on_policy_targets(host, self.sampler, student, step)
        return self.batches.to_global(host), sampler_stats(self.sampler)

    def check_step(self, step: int, metrics: dict[str, float]) -> None:
        check_step_of(self.sampler, step, metrics)

    def state(self) -> dict[str, Any]:
        return self.batches.state.to_json()

    def restore(self, state: dict[str, Any]) -> None:
        self.batches.state = data_lib.IteratorState.from_json(state)


def on_policy_targets(host: data_lib.HostBatch, sampler: Any, student: nnx.Module, step: int) -> data_lib.HostBatch:
    """The host batch with each OPD row's target replaced by the student's sample under the student view, seeded
    by the row's example key (`row_seed`)."""
    slots = [
        (i, j)
        for i, micro in enumerate(host.rows)
        for j, ex in enumerate(micro)
        if ex is not None and "student" in ex.views
    ]
    if not slots:
        return host
    prompts = [host.rows[i][j].views["student"].prompt for i, j in slots]
    seeds = [row_seed(sampler.cfg.seed, step, host.rows[i][j].key) for i, j in slots]
    rows = [list(micro) for micro in host.rows]
    for (i, j), c in zip(slots, sampler(student, prompts, step, seeds=seeds), strict=True):
        rows[i][j] = data_lib.with_opd_target(rows[i][j], c.token_ids, c.logprobs)
    return dataclasses.replace(host, rows=rows)


def sampler_stats(sampler: Any) -> dict[str, float]:
    """The sampler's metrics of its last call (a served sampler's staleness and push time); {} for others."""
    return dict(getattr(sampler, "stats", None) or {})


def check_step_of(obj: Any, step: int, metrics: dict[str, float]) -> None:
    """`obj.check_step(step, metrics)` where a sampler or source has one (the served sampler's gap rule)."""
    check = getattr(obj, "check_step", None)
    if check is not None:
        check(step, metrics)


class StepSeeded:
    """A source whose batch is a pure function of (seed, step): nothing to save."""

    on_policy = False

    def state(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        pass

    def check_step(self, step: int, metrics: dict[str, float]) -> None:
        check_step_of(getattr(self, "sampler", None), step, metrics)


def _logged(name: str, counts: overlong_lib.RowCounts) -> overlong_lib.RowCounts:
    """Logs a source's row counts once, when it is built: a warning when any row was cut or dropped."""
    level = logging.WARNING if counts.cut or counts.dropped else logging.INFO
    log.log(level, "%s rows: %s", name, counts.describe())
    return counts


def _targets_bucket(n: int, step: int = 64) -> int:
    return -(-n // step) * step


class PackedSource(StepSeeded):
    """Batches of packed rows as view `view`, grouped by length bucket so each step compiles once per bucket.
    A row over the largest bucket follows `overlong` (default "drop"; "cut" keeps its first tokens:
    overlong.cut_row)."""

    def __init__(
        self,
        rows: Sequence[SeqRow],
        batch_size: int,
        buckets: Sequence[int],
        seed: int,
        mesh: jax.sharding.Mesh,
        view: str = "policy",
        overlong: overlong_lib.Overlong = "drop",
    ):
        self.views = (view,)
        rows, counts = overlong_lib.seq_rows(rows, max(buckets), overlong)
        self.row_counts = {view: _logged(view, counts)}
        if not rows:
            raise ValueError("no rows to train on")
        groups: dict[int, list[SeqRow]] = {}
        for r in rows:
            groups.setdefault(bucket(len(r.tokens), buckets), []).append(r)
        self.groups = sorted(groups.items())
        self.targets = {t: _targets_bucket(max(sum(s.length for s in r.spans) for r in g)) for t, g in self.groups}
        self.batch_size, self.seed, self.mesh, self.view = batch_size, seed, mesh, view

    def host(self, step: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, step])
        sizes = np.asarray([len(g) for _, g in self.groups], np.float64)
        t, group = self.groups[rng.choice(len(self.groups), p=sizes / sizes.sum())]
        pick = rng.choice(len(group), min(self.batch_size, len(group)), replace=False)
        rows = [group[i] for i in pick]
        return {self.view: seq_batch(rows + [SeqRow((0,), ())] * (self.batch_size - len(rows)), t, self.targets[t])}

    def __call__(self, step: int, student: nnx.Module) -> tuple[Batch, dict[str, float]]:
        return place(self.host(step), self.mesh), {}


def fixed_batches(
    rows: Sequence[SeqRow],
    batch_size: int,
    buckets: Sequence[int],
    mesh: jax.sharding.Mesh,
    view: str = "policy",
    overlong: overlong_lib.Overlong = "drop",
) -> list[Batch]:
    """Every row once, in order, as placed batches of `batch_size` rows (the last padded with rows of no weight)
    grouped by length bucket: a validation set the trainer scores (Trainer's `validation`)."""
    rows, _ = overlong_lib.seq_rows(rows, max(buckets), overlong)
    groups: dict[int, list[SeqRow]] = {}
    for r in rows:
        groups.setdefault(bucket(len(r.tokens), buckets), []).append(r)
    out = []
    for t, group in sorted(groups.items()):
        k = _targets_bucket(max(sum(s.length for s in r.spans) for r in group))
        for start in range(0, len(group), batch_size):
            chunk = list(group[start : start + batch_size])
            chunk += [SeqRow((0,), ())] * (batch_size - len(chunk))
            out.append(place({view: seq_batch(chunk, t, k)}, mesh))
    return out


class OpdSource(StepSeeded):
    """OPD rows of step s: `batch` rows chosen by (seed, s); the action is sampled by the current student.
    A row whose prompts exceed the largest bucket follows `overlong` (default "drop"); a prompt is never cut, so
    "cut" drops it too (overlong.py says why), while the sampled continuation has its room reserved."""

    on_policy = True

    def __init__(
        self,
        rows: Sequence[OpdRow],
        tokenizer: Any,
        sampling: SamplingConfig,
        batch: int,
        buckets: Sequence[int],
        mesh: jax.sharding.Mesh,
        overlong: overlong_lib.Overlong = "drop",
        sampler: Any = None,
    ):
        self.views = ("student", "teacher")
        rows, counts = overlong_lib.opd_rows(rows, max(buckets), overlong)
        self.row_counts = {"opd": _logged("opd", counts)}
        if not rows:
            raise ValueError("no attributable decisions (FLAG=true) to distill")
        self.rows, self.batch, self.buckets, self.mesh, self.seed = rows, batch, tuple(buckets), mesh, sampling.seed
        self.k = _targets_bucket(sampling.max_new_tokens + 1, 32)
        longest = max(max(len(r.student), len(r.teacher)) for r in rows)
        self.sampler = sampler or ActionSampler(
            tokenizer,
            sampling,
            mesh,
            max_len=bucket(longest, buckets) + self.k,
            prompt_buckets=buckets,
            batch_buckets=(batch,),
        )

    def host(self, step: int, student: nnx.Module) -> tuple[dict[str, Any], dict[str, float]]:
        rng = np.random.default_rng([self.seed, step])
        rows = [self.rows[i] for i in rng.choice(len(self.rows), min(self.batch, len(self.rows)), replace=False)]
        seeds = [row_seed(self.seed, step, r.key) for r in rows]
        done = self.sampler(student, [r.student for r in rows], step, seeds=seeds)
        # A sample that is no action at all is dropped (OpdRow says why): an empty action scores nothing.
        keep = [r.is_action is None or r.is_action(c.text) for r, c in zip(rows, done, strict=False)]
        actions = [c.token_ids if k else [] for c, k in zip(done, keep, strict=False)]
        t_s = bucket(max(len(r.student) for r in rows), self.buckets) + self.k
        t_t = bucket(max(len(r.teacher) for r in rows), self.buckets) + self.k
        student_rows = scored_batch(
            [r.student for r in rows],
            actions,
            t_s,
            self.k,
            [c.logprobs if k else [] for c, k in zip(done, keep, strict=False)],
        )
        teacher_rows = scored_batch([r.teacher for r in rows], actions, t_t, self.k)
        stats = {
            "sampled_tokens": float(np.mean([len(c.token_ids) for c in done])),
            "sampled_stopped": float(np.mean([c.finish_reason == "stop" for c in done])),
            "sampled_not_action": 1.0 - float(np.mean(keep)),
        } | sampler_stats(self.sampler)
        return {"student": student_rows, "teacher": teacher_rows}, stats

    def __call__(self, step: int, student: nnx.Module) -> tuple[Batch, dict[str, float]]:
        host, stats = self.host(step, student)
        return place(host, self.mesh), stats


class CombinedViews(StepSeeded):
    """The views of several sources in one batch (OPOD: packed RWR rows and on-policy OPD rows)."""

    def __init__(self, *sources: BatchSource):
        if not sources:
            raise ValueError("no batch sources to join")
        self.sources = sources
        self.views = tuple(v for s in sources for v in s.views)
        if len(set(self.views)) < len(self.views):
            raise ValueError(f"sources to combine yield a view twice: {self.views}")
        self.on_policy = any(s.on_policy for s in sources)
        self.row_counts = {k: v for s in sources for k, v in getattr(s, "row_counts", {}).items()}

    def __call__(self, step: int, student: nnx.Module) -> tuple[Batch, dict[str, float]]:
        batch, stats = {}, {}
        for s in self.sources:
            b, m = s(step, student)
            batch |= b
            stats |= m
        return batch, stats

    def check_step(self, step: int, metrics: dict[str, float]) -> None:
        for s in self.sources:
            check_step_of(s, step, metrics)


class GroupSource(StepSeeded):
    """GRPO groups at fixed contexts (DA-GRPO: the expert's): `contexts_per_step` contexts, `group_size` samples
    each (member j of context c seeded by (c.key, j)), each scored by `reward(context, reply)`, the reply as the
    context's `decode` reads it; the experiment passes the reward (opod/rewards.py: against the expert's action).
    A context whose prompt exceeds the largest bucket follows `overlong` (default "drop"; "cut" drops it too: a
    prompt is never cut)."""

    on_policy = True

    def __init__(
        self,
        contexts: Sequence[ExpertContext],
        tokenizer: Any,
        sampling: SamplingConfig,
        contexts_per_step: int,
        group_size: int,
        buckets: Sequence[int],
        reward: Callable[[ExpertContext, str], float],
        mesh: jax.sharding.Mesh,
        overlong: overlong_lib.Overlong = "drop",
        sampler: Any = None,
    ):
        self.views = ("policy",)
        contexts, counts = overlong_lib.expert_contexts(contexts, max(buckets), overlong)
        self.row_counts = {"dagrpo": _logged("dagrpo", counts)}
        if not contexts:
            raise ValueError("no expert decision contexts")
        self.contexts, self.buckets, self.reward, self.mesh = contexts, tuple(buckets), reward, mesh
        self.per_step, self.group_size, self.seed = contexts_per_step, group_size, sampling.seed
        self.k = _targets_bucket(sampling.max_new_tokens + 1, 32)
        longest = max(len(c.prompt) for c in contexts)
        self.sampler = sampler or ActionSampler(
            tokenizer,
            sampling,
            mesh,
            max_len=bucket(longest, buckets) + self.k,
            prompt_buckets=buckets,
            batch_buckets=(contexts_per_step * group_size,),
        )

    def __call__(self, step: int, student: nnx.Module) -> tuple[Batch, dict[str, float]]:
        g = self.group_size
        rng = np.random.default_rng([self.seed, step])
        chosen = [self.contexts[i] for i in rng.choice(len(self.contexts), self.per_step, replace=False)]
        repeated = [c for c in chosen for _ in range(g)]
        prompts = [c.prompt for c in repeated]
        seeds = [row_seed(self.seed, step, [c.key, j]) for c in chosen for j in range(g)]
        done = self.sampler(student, prompts, step, seeds=seeds)
        texts = [c.decode(d.text) if c.decode else d.text for c, d in zip(repeated, done, strict=False)]
        rewards = np.asarray(
            [self.reward(c, t) for c, t in zip(repeated, texts, strict=False)],
            np.float32,
        )
        advantages = np.asarray(losses.group_advantages(rewards.reshape(-1, g))).reshape(-1)
        t = bucket(max(len(p) for p in prompts), self.buckets) + self.k
        group = scored_batch(prompts, [d.token_ids for d in done], t, self.k, [d.logprobs for d in done])
        host = {"policy": group, "advantage": advantages.astype(np.float32)}
        stats = {"reward": float(rewards.mean()), "reward_std": float(rewards.std())} | sampler_stats(self.sampler)
        return place(host, self.mesh), stats
