"""Batch sources: each step's global batch [accum, micro, ...] for the step, and host metrics.

    class BatchSource:                        # the base: the defaults below
        views: tuple[str, ...]                # the views its batches hold (the Trainer checks the method's)
        on_policy: bool = False               # reads the current student (the trainer keeps it current)
        row_counts: {name: overlong.RowCounts} = {}  # how its rows fared against its largest bucket
        def __call__(self, step, student) -> (batch of global arrays, {metric: float})
        def state(self) -> dict               # the data position, saved with each checkpoint ({}: none)
        def restore(self, state: dict) -> None
        def check_step(self, step, metrics) -> None  # raises when the step's metrics show a fault (no-op)

Every language-model source yields the one row format (packing.py): `PackedSource` packed or one-span decision
rows (SFT, RWR), `OpdSource` OPD rows whose action the current student samples, `GroupSource` GRPO groups the
student samples at fixed contexts (DA-GRPO), `RecordedGroups` GRPO groups replayed from records, and
`CombinedViews` several sources' views in one batch (OPOD: RWR rows + OPD rows). Each is a pure function of
(seed, step) and the student, so a resumed run sees the same batches; each lays its global batch of
`accum_steps` x micro rows out as [accum, micro, ...] (`place`).

Several processes: every process computes the same global host batch (the rows are a pure function of the seed and
the step; on-policy samples come from one SPMD sampler call that every process makes with the same prompts and that
returns every row to each of them) and transfers only the rows its devices hold (`place`). A row's sampling seed is
`row_seed(seed, step, its key)`, never its position in a batch or a process's slice, so the samples do not depend
on how rows are laid out over processes and devices.

`ActionSampler` is the embedded sampler behind one call, `(student, prompts, step, *, seeds=None) ->
completions` (token_ids, logprobs, text, finish_reason per prompt, in order) and its `cfg` (the SamplingConfig); a
served sampler with the same call fits every source. The on-policy sources take `sampler=`: None builds the embedded
`ActionSampler` for their shapes; a served_sampler.ServedActionSampler samples on a vLLM server. A sampler's `stats`
join the step's host metrics, and its `check_step(step, metrics)` (the served sampler's logprob-gap rule) runs
through the source's `check_step`, which the trainer calls after each step, before its checkpoint.

Rows longer than a source's largest bucket follow its `overlong` rule ("drop", "cut" or "error"; what "cut" does to
each row kind is overlong.py's), applied once when the source is built: the source logs the counts and keeps them
in `row_counts`, which the trainer prints and writes to WORKDIR/rows.json.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jax
import numpy as np
from flax import nnx

from porch_jax.models.sampler import Sampler, SamplingParams
from porch_jax.train import losses
from porch_jax.train import mesh as mesh_lib
from porch_jax.train import overlong as overlong_lib
from porch_jax.train.config import Overlong, SamplingConfig
from porch_jax.train.packing import (
    DataError,
    ExpertContext,
    OpdRow,
    RecordedGroup,
    SeqRow,
    bucket,
    scored_batch,
    seq_batch,
)
from porch_jax.train.views import Batch, GroupView

log = logging.getLogger(__name__)


class BatchSource:
    """The base of every batch source (the module docstring lists its members); subclasses set `views` and define
    `__call__`."""

    views: tuple[str, ...] = ()
    on_policy: bool = False
    row_counts: Mapping[str, overlong_lib.RowCounts] = {}

    def __call__(self, step: int, student: nnx.Module) -> tuple[Batch, dict[str, float]]:
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        pass

    def check_step(self, step: int, metrics: dict[str, float]) -> None:
        pass


class Sampled(Protocol):
    """What an on-policy source needs of a sampler (ActionSampler, served_sampler.ServedActionSampler)."""

    cfg: SamplingConfig
    stats: Mapping[str, float]

    def __call__(
        self, student: nnx.Module, prompts: Sequence[Sequence[int]], step: int, *, seeds: Sequence[int] | None = None
    ) -> list[Any]: ...

    def check_step(self, step: int, metrics: dict[str, float]) -> None: ...


def place(host: Batch, mesh: jax.sharding.Mesh, accum_steps: int = 1) -> Batch:
    """The global host batch [B, ...] (the same in every process) as a global [accum, B / accum, ...] batch, rows
    over the mesh's batch axes; each process transfers only the blocks its devices hold."""
    spec = tuple(mesh_lib.batch_spec(mesh=mesh))

    def put(x: np.ndarray) -> jax.Array:
        x = np.asarray(x)
        if x.shape[0] % accum_steps:
            raise ValueError(f"a batch of {x.shape[0]} rows does not split into {accum_steps} accumulation steps")
        x = x.reshape(accum_steps, x.shape[0] // accum_steps, *x.shape[1:])
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
        self.stats: Mapping[str, float] = {}

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

    def check_step(self, step: int, metrics: dict[str, float]) -> None:
        pass


def _logged(name: str, counts: overlong_lib.RowCounts) -> overlong_lib.RowCounts:
    """Logs a source's row counts once, when it is built: a warning when any row was cut or dropped."""
    level = logging.WARNING if counts.cut or counts.dropped else logging.INFO
    log.log(level, "%s rows: %s", name, counts.describe())
    return counts


def _targets_bucket(n: int, step: int = 64) -> int:
    return -(-n // step) * step


class PackedSource(BatchSource):
    """Batches of `batch_size` packed (or one-span) rows as view `view`, drawn by (seed, step) from one length bucket
    so each step compiles once per bucket. A row over the largest bucket follows `overlong` (default "drop"; "cut"
    keeps its first tokens: overlong.cut_row)."""

    def __init__(
        self,
        rows: Sequence[SeqRow],
        batch_size: int,
        buckets: Sequence[int],
        seed: int,
        mesh: jax.sharding.Mesh,
        view: str = "policy",
        overlong: Overlong = "drop",
        accum_steps: int = 1,
    ):
        self.views, self.accum_steps = (view,), accum_steps
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
        return place(self.host(step), self.mesh, self.accum_steps), {}


def fixed_batches(
    rows: Sequence[SeqRow],
    batch_size: int,
    buckets: Sequence[int],
    mesh: jax.sharding.Mesh,
    view: str = "policy",
    overlong: Overlong = "drop",
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


class OpdSource(BatchSource):
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
        overlong: Overlong = "drop",
        sampler: Sampled | None = None,
        accum_steps: int = 1,
    ):
        self.views, self.accum_steps = ("student", "teacher"), accum_steps
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
        # Fewer rows than the batch: one-token rows without an action fill it (they score nothing), as PackedSource's.
        pad, empty = [(0,)] * (self.batch - len(rows)), [()] * (self.batch - len(rows))
        logprobs = [c.logprobs if k else [] for c, k in zip(done, keep, strict=False)]
        student_rows = scored_batch([r.student for r in rows] + pad, actions + empty, t_s, self.k, logprobs + empty)
        teacher_rows = scored_batch([r.teacher for r in rows] + pad, actions + empty, t_t, self.k)
        stats = {
            "sampled_length": float(np.mean([len(c.token_ids) for c in done])),
            "sampled_stopped": float(np.mean([c.finish_reason == "stop" for c in done])),
            "sampled_not_action": 1.0 - float(np.mean(keep)),
        } | dict(self.sampler.stats)
        return {"student": student_rows, "teacher": teacher_rows}, stats

    def __call__(self, step: int, student: nnx.Module) -> tuple[Batch, dict[str, float]]:
        host, stats = self.host(step, student)
        return place(host, self.mesh, self.accum_steps), stats

    def check_step(self, step: int, metrics: dict[str, float]) -> None:
        self.sampler.check_step(step, metrics)


class CombinedViews(BatchSource):
    """The views of several sources in one batch (OPOD: packed RWR rows and on-policy OPD rows)."""

    def __init__(self, *sources: BatchSource):
        if not sources:
            raise ValueError("no batch sources to join")
        self.sources = sources
        self.views = tuple(v for s in sources for v in s.views)
        if len(set(self.views)) < len(self.views):
            raise ValueError(f"sources to combine yield a view twice: {self.views}")
        self.on_policy = any(s.on_policy for s in sources)
        self.row_counts = {k: v for s in sources for k, v in s.row_counts.items()}

    def __call__(self, step: int, student: nnx.Module) -> tuple[Batch, dict[str, float]]:
        batch, stats = {}, {}
        for s in self.sources:
            b, m = s(step, student)
            batch |= b
            stats |= m
        return batch, stats

    def check_step(self, step: int, metrics: dict[str, float]) -> None:
        for s in self.sources:
            s.check_step(step, metrics)


class GroupSource(BatchSource):
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
        overlong: Overlong = "drop",
        sampler: Sampled | None = None,
        accum_steps: int = 1,
    ):
        self.views = ("policy",)
        contexts, counts = overlong_lib.expert_contexts(contexts, max(buckets), overlong)
        self.row_counts = {"dagrpo": _logged("dagrpo", counts)}
        if not contexts:
            raise ValueError("no expert decision contexts")
        self.contexts, self.buckets, self.reward, self.mesh = contexts, tuple(buckets), reward, mesh
        self.per_step, self.group_size, self.seed = contexts_per_step, group_size, sampling.seed
        self.accum_steps = accum_steps
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

    def draw(self, chosen: Sequence[ExpertContext], step: int, student: nnx.Module) -> tuple[list, np.ndarray, dict]:
        """The step's samples, `group_size` per chosen context (token_ids and logprobs each), their rewards [N]
        and host metrics."""
        g = self.group_size
        repeated = [c for c in chosen for _ in range(g)]
        seeds = [row_seed(self.seed, step, [c.key, j]) for c in chosen for j in range(g)]
        done = self.sampler(student, [c.prompt for c in repeated], step, seeds=seeds)
        texts = [c.decode(d.text) if c.decode else d.text for c, d in zip(repeated, done, strict=True)]
        rewards = np.asarray([self.reward(c, t) for c, t in zip(repeated, texts, strict=True)], np.float32)
        return done, rewards, dict(self.sampler.stats)

    def __call__(self, step: int, student: nnx.Module) -> tuple[Batch, dict[str, float]]:
        rng = np.random.default_rng([self.seed, step])
        chosen = [self.contexts[i] for i in rng.choice(len(self.contexts), self.per_step, replace=False)]
        done, rewards, stats = self.draw(chosen, step, student)
        advantages = np.asarray(losses.group_advantages(rewards.reshape(-1, self.group_size))).reshape(-1)
        prompts = [c.prompt for c in chosen for _ in range(self.group_size)]
        t = bucket(max(len(p) for p in prompts), self.buckets) + self.k
        group = scored_batch(prompts, [d.token_ids for d in done], t, self.k, [d.logprobs for d in done])
        host = {"policy": GroupView(**vars(group), advantage=advantages.astype(np.float32))}
        stats = {"reward": float(rewards.mean()), "reward_std": float(rewards.std())} | stats
        return place(host, self.mesh, self.accum_steps), stats

    def check_step(self, step: int, metrics: dict[str, float]) -> None:
        self.sampler.check_step(step, metrics)


class RecordedGroups(GroupSource):
    """GRPO groups replayed from records (offline GRPO): `contexts_per_step` groups a step, chosen by (seed, step),
    each sample with its recorded log-probabilities (the "old" policy's) and reward. Every group holds the same
    number of samples (the group size); a group whose prompt exceeds the largest bucket follows `overlong` ("drop"
    and "cut" leave it out: neither a prompt nor a sample is cut, overlong.py says why)."""

    on_policy = False

    def __init__(
        self,
        groups: Sequence[RecordedGroup],
        contexts_per_step: int,
        buckets: Sequence[int],
        seed: int,
        mesh: jax.sharding.Mesh,
        overlong: Overlong = "error",
        accum_steps: int = 1,
    ):
        self.views = ("policy",)
        groups, counts = overlong_lib.recorded_groups(groups, max(buckets), overlong)
        self.row_counts = {"grpo": _logged("grpo", counts)}
        if not groups:
            raise ValueError("no recorded GRPO groups")
        first = groups[0]
        if len(first.samples) < 2:
            raise DataError(f"GRPO group {first.key!r} has {len(first.samples)} sample(s); advantages need at least 2")
        odd = next((g for g in groups if len(g.samples) != len(first.samples)), None)
        if odd is not None:
            raise DataError(
                f"GRPO group {odd.key!r} has {len(odd.samples)} samples, group {first.key!r} {len(first.samples)}: "
                "recorded groups need one size (each step's batch holds whole groups)"
            )
        if contexts_per_step > len(groups):
            raise ValueError(f"{contexts_per_step} groups a step, but the records hold {len(groups)}")
        longest = max(len(s.token_ids) for g in groups for s in g.samples)
        self.contexts, self.buckets, self.mesh, self.seed = groups, tuple(buckets), mesh, seed
        self.per_step, self.group_size, self.accum_steps = contexts_per_step, len(first.samples), accum_steps
        self.k = _targets_bucket(longest)

    def draw(self, chosen: Sequence[RecordedGroup], step: int, student: nnx.Module) -> tuple[list, np.ndarray, dict]:
        samples = [s for g in chosen for s in g.samples]
        return samples, np.asarray([s.reward for s in samples], np.float32), {}

    def check_step(self, step: int, metrics: dict[str, float]) -> None:
        pass
