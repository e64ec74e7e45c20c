"""Trajectory records -> token examples -> fixed-shape, host-sharded global batches.

An orchestration decision becomes one example: the prompt is the context the orchestrator saw,
rendered with the tokenizer's chat template (generation prompt included); the target is the
decision's sampled token ids (re-tokenizing sampled text drifts from what was sampled) or, only
when no ids were stored, its tokenized text, followed by eos. Only target tokens carry loss.

A batch holds one or more named *views* of each row (SFT/RWR/GRPO: "policy"; OPOD: "rwr",
"student", "teacher"). Each view is a right-padded sequence [T] plus a target layout [K]: the
column whose hidden state predicts each target token. Losses gather those K hidden states first,
so the LM head never runs over (long) prompt positions, and a student and a teacher that saw
different prompts still score the same target tokens position by position.

Shapes come from a fixed set of buckets (T, K) and a fixed batch size, so a jitted step compiles
once per bucket. An example over the largest bucket is the batch source's to refuse, drop or cut
(`sources.RecordSource`'s `overlong`, overlong.py), once, when it is built; the iterator raises on
one. The epoch plan is a pure function of (seed, epoch, dataset); the iterator's state is (seed,
epoch, position), which a checkpoint stores to resume exactly.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from porch_jax.protocol.render import prompt_ids

# Hints come from the attribution step, keyed by decision: (episode_id, decision index).
DecisionKey = tuple[str, int]


# Per-view arrays of a batch row: tokens/mask [T] (the sequence and its real-token mask),
# index/targets/target_mask [K] (where each target token is predicted, its id, whether it is
# real), weight [] (the view's loss weight: 1, an RWR reward or an OPD flag), logprobs/sampled [K]
# (the sampler's log-probabilities, where there are any).
VIEW_FIELDS = ("tokens", "mask", "index", "targets", "target_mask", "weight", "logprobs", "sampled")


class DataError(ValueError):
    """An example that cannot be batched; the message names the decision."""


# ----------------------------------------------------------------------------------- examples


@dataclasses.dataclass(frozen=True)
class View:
    """One tokenized sequence: prompt then target. weight scales this view's loss terms.

    logprobs: the sampler's log-probabilities of the first len(logprobs) target tokens, for
    on-policy data (what the trainer's own log-probabilities are compared with), else None.
    """

    prompt: tuple[int, ...]
    target: tuple[int, ...]
    weight: float = 1.0
    logprobs: tuple[float, ...] | None = None

    def __len__(self) -> int:
        return len(self.prompt) + len(self.target)


@dataclasses.dataclass(frozen=True)
class Example:
    """A decision context with the views a method trains on; a missing view contributes no loss.

    scalars: per-row numbers a loss needs (GRPO: "advantage").
    """

    key: str
    views: Mapping[str, View]
    scalars: Mapping[str, float] = dataclasses.field(default_factory=dict)


def decision_target(tokenizer, decision) -> list[int]:
    """The decision's tokens plus eos: stored action_token_ids when present, else tokenized action_text."""
    ids = list(decision.action_token_ids or ())
    if not ids:
        ids = tokenizer.encode(decision.action_text, add_special_tokens=False)
    eos = tokenizer.eos_token_id
    if not ids or ids[-1] != eos:
        ids.append(eos)
    return [int(t) for t in ids]


def decision_key(episode_id: str, index: int) -> str:
    return f"{episode_id}/{index}"


def _valid_decisions(episodes: Iterable) -> Iterable[tuple[Any, Any]]:
    """(episode, decision) for every structurally valid decision (one whose action parsed)."""
    for episode in episodes:
        for decision in episode.decisions:
            if decision.action is not None:
                yield episode, decision


class PromptMismatch(DataError):
    """Our rendering of a recorded context differs from the prompt the server tokenized: training would drift from
    what the model saw (a different chat template, tokenizer or transformers version on the server)."""


def template_kwargs(episode) -> dict[str, Any]:
    """What the episode's orchestrator template was rendered with (its thinking switch; none in older records)."""
    return dict(episode.meta.get("template_kwargs") or {})


def decision_prompt(
    tokenizer,
    episode_id: str,
    decision,
    tools: Sequence[Mapping] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """The decision's prompt ids as we render its context, checked against the server's ``prompt_token_ids`` when
    the record holds them; a mismatch raises ``PromptMismatch`` naming the decision and the first differing token."""
    ours = prompt_ids(tokenizer, decision.context, tools, **(template_kwargs or {}))
    theirs = [int(t) for t in decision.prompt_token_ids]
    if theirs and theirs != ours:
        i = next((k for k, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
        raise PromptMismatch(
            f"episode {episode_id!r} decision {decision.index}: our rendering of the recorded context ({len(ours)} "
            f"tokens) differs from the server's prompt ({len(theirs)} tokens) from token {i}: ours "
            f"{tokenizer.decode(ours[i : i + 12])!r}, the server's {tokenizer.decode(theirs[i : i + 12])!r}"
        )
    return ours


def token_sources(episodes: Iterable) -> dict[str, int]:
    """How many trainable (valid) decisions have their action ids from each source; "none" rows are re-tokenized
    from the action text, which a provider without token ids gives (launchers log the count)."""
    counts = {"sampler": 0, "server": 0, "none": 0}
    for _, d in _valid_decisions(episodes):
        counts[d.token_source] += 1
    return counts


def sft_examples(episodes: Iterable, tokenizer, *, tools: Sequence[Mapping] | None = None) -> list[Example]:
    """Valid decisions of all episodes, successful or not (expert imitation)."""
    return [
        Example(
            decision_key(ep.episode_id, d.index),
            {
                "policy": View(
                    tuple(decision_prompt(tokenizer, ep.episode_id, d, tools, template_kwargs(ep))),
                    tuple(decision_target(tokenizer, d)),
                )
            },
        )
        for ep, d in _valid_decisions(episodes)
    ]


def rwr_examples(episodes: Iterable, tokenizer, *, tools: Sequence[Mapping] | None = None) -> list[Example]:
    """Reward-weighted regression with a 0/1 reward: valid decisions of successful episodes."""
    return sft_examples([ep for ep in episodes if ep.outcome.success], tokenizer, tools=tools)


def opod_examples(
    episodes: Iterable,
    tokenizer,
    hints: Mapping[DecisionKey, str],
    *,
    teacher_context: Callable[[Sequence[Mapping], str], Sequence[Mapping]],
    tools: Sequence[Mapping] | None = None,
) -> list[Example]:
    """RWR and OPD paired by decision context: one row per decision that has either.

    "rwr": the recorded decision, only for successful episodes. "student"/"teacher": the same
    target under s and s ⊕ H, only where the attribution gave a hint (FLAG = true); s ⊕ H is
    `teacher_context(s, hint)`, the attribution's (porch_jax/attribution/grm.py), passed in. The OPD
    target starts as the recorded decision; an on-policy hook replaces it with a student sample.
    """
    examples = []
    for ep, d in _valid_decisions(episodes):
        hint = hints.get((ep.episode_id, d.index))
        if not ep.outcome.success and not hint:
            continue
        prompt = tuple(decision_prompt(tokenizer, ep.episode_id, d, tools, template_kwargs(ep)))
        target = tuple(decision_target(tokenizer, d))
        views = {}
        if ep.outcome.success:
            views["rwr"] = View(prompt, target)
        if hint:
            teacher = tuple(prompt_ids(tokenizer, teacher_context(d.context, hint), tools, **template_kwargs(ep)))
            views["student"] = View(prompt, target)
            views["teacher"] = View(teacher, target)
        examples.append(Example(decision_key(ep.episode_id, d.index), views))
    return examples


def grpo_examples(
    groups: Iterable[Mapping[str, Any]], tokenizer, *, tools: Sequence[Mapping] | None = None
) -> list[Example]:
    """GRPO rows from sampled groups {key, context, samples: [{token_ids, logprobs, reward}]}.

    Each sample is scored under the group's context with its group-normalized advantage
    (losses.group_advantages); its sampler log-probabilities are the "old" policy's.
    """
    from porch_jax.train.losses import group_advantages

    examples = []
    for g in groups:
        samples = g["samples"]
        if len(samples) < 2:
            raise DataError(f"GRPO group {g['key']!r} has {len(samples)} sample(s); advantages need at least 2")
        prompt = tuple(prompt_ids(tokenizer, g["context"], tools))
        rewards = np.asarray([[float(s["reward"]) for s in samples]], np.float32)
        advantages = np.asarray(group_advantages(rewards))[0]
        for i, (s, adv) in enumerate(zip(samples, advantages, strict=False)):
            view = View(prompt, tuple(int(t) for t in s["token_ids"]), logprobs=tuple(float(x) for x in s["logprobs"]))
            examples.append(Example(f"{g['key']}/{i}", {"policy": view}, {"advantage": float(adv)}))
    return examples


def with_opd_target(example: Example, target: Sequence[int], logprobs: Sequence[float] | None) -> Example:
    """The example with its OPD target replaced (both views), e.g. by a fresh student sample."""
    views = dict(example.views)
    for name in ("student", "teacher"):
        views[name] = dataclasses.replace(
            views[name],
            target=tuple(target),
            logprobs=tuple(logprobs) if logprobs is not None and name == "student" else None,
        )
    return dataclasses.replace(example, views=views)


# ------------------------------------------------------------------------------------ collate


@dataclasses.dataclass(frozen=True)
class Buckets:
    """Allowed padded sequence lengths T and target lengths K (ascending)."""

    lengths: tuple[int, ...]
    targets: tuple[int, ...]

    def fit(self, length: int, target: int) -> tuple[int, int]:
        """The smallest (T, K) holding a sequence of `length` tokens with `target` target tokens."""
        i, j = bisect.bisect_left(self.lengths, length), bisect.bisect_left(self.targets, target)
        if i == len(self.lengths) or j == len(self.targets):
            raise DataError(
                f"sequence of {length} tokens with a {target}-token target exceeds the largest bucket "
                f"(T={self.lengths[-1]}, K={self.targets[-1]})"
            )
        return self.lengths[i], self.targets[j]

    def of(self, examples: Iterable[Example | None], reserve: int = 0) -> tuple[int, int]:
        """The bucket of a group of rows; targets count as at least `reserve` tokens (room for resampling)."""
        examples = list(examples)
        length = target = 1
        for ex in examples:
            if ex is None:
                continue
            for view in ex.views.values():
                n = max(len(view.target), reserve)
                length, target = max(length, len(view.prompt) + n), max(target, n)
        try:
            return self.fit(length, target)
        except DataError as e:
            keys = ", ".join(ex.key for ex in examples if ex is not None)
            raise DataError(f"{e} (decisions {keys})") from None


def _empty_view(t: int, k: int) -> dict[str, np.ndarray]:
    return {
        "tokens": np.zeros(t, np.int32),
        "mask": np.zeros(t, bool),
        "index": np.zeros(k, np.int32),
        "targets": np.zeros(k, np.int32),
        "target_mask": np.zeros(k, bool),
        "weight": np.zeros((), np.float32),
        "logprobs": np.zeros(k, np.float32),
        "sampled": np.zeros(k, bool),
    }


def _view_arrays(view: View, t: int, k: int, pad_id: int) -> dict[str, np.ndarray]:
    out = _empty_view(t, k)
    tokens = view.prompt + view.target
    p, n = len(view.prompt), len(view.target)
    out["tokens"][:] = pad_id
    out["tokens"][: len(tokens)] = tokens
    out["mask"][: len(tokens)] = True
    # Hidden state at column c predicts token c + 1: target token j is predicted at p - 1 + j.
    out["index"][:n] = np.arange(p - 1, p - 1 + n)
    out["targets"][:n] = view.target
    out["target_mask"][:n] = True
    out["weight"][...] = view.weight
    if view.logprobs is not None:  # may stop short of an appended eos, which was not sampled
        m = len(view.logprobs)
        if m > n:
            raise DataError(f"{m} logprobs for a {n}-token target")
        out["logprobs"][:m] = view.logprobs
        out["sampled"][:m] = True
    return out


def collate(
    examples: Sequence[Example | None], views: Sequence[str], scalars: Sequence[str], t: int, k: int, *, pad_id: int
) -> dict[str, Any]:
    """Stacks rows into {view: {field: [N, ...]}, scalar: [N]}; fields as in `VIEW_FIELDS`.

    A row without a view (or a None row padding the batch to its fixed size) gets an all-masked,
    zero-weight view: it contributes nothing to any loss or count.
    """
    out: dict[str, Any] = {}
    for name in views:
        rows = [
            _view_arrays(ex.views[name], t, k, pad_id) if ex is not None and name in ex.views else _empty_view(t, k)
            for ex in examples
        ]
        out[name] = {field: np.stack([r[field] for r in rows]) for field in VIEW_FIELDS}
    for name in scalars:
        out[name] = np.asarray([0.0 if ex is None else ex.scalars[name] for ex in examples], np.float32)
    return out


# ------------------------------------------------------------------------------------ batches


@dataclasses.dataclass(frozen=True)
class IteratorState:
    """Where the iterator stands: the next batch is plan(seed, epoch)[position]."""

    seed: int
    epoch: int = 0
    position: int = 0

    def to_json(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> IteratorState:
        return cls(int(d["seed"]), int(d["epoch"]), int(d["position"]))


def epoch_plan(
    examples: Sequence[Example], buckets: Buckets, batch_size: int, seed: int, epoch: int, reserve: int = 0
) -> list[np.ndarray]:
    """Global batches of example indices (-1 = padding row) for one epoch, deterministically.

    Examples are shuffled, grouped by bucket (so short rows are not padded to long ones), cut into
    batches of batch_size (the last of each bucket padded with -1), and the batches shuffled.
    """
    rng = np.random.default_rng([seed, epoch])
    by_bucket: dict[tuple[int, int], list[int]] = {}
    for i in rng.permutation(len(examples)):
        by_bucket.setdefault(buckets.of([examples[i]], reserve), []).append(int(i))
    batches = []
    for key in sorted(by_bucket):
        idx = by_bucket[key]
        for start in range(0, len(idx), batch_size):
            chunk = idx[start : start + batch_size]
            batches.append(np.asarray(chunk + [-1] * (batch_size - len(chunk)), np.int64))
    return [batches[i] for i in rng.permutation(len(batches))]


def process_rows(sharding: jax.sharding.Sharding, global_shape: tuple[int, ...], axis: int) -> slice:
    """The contiguous range of `axis` that this process's devices hold under `sharding`."""
    spans = sorted(
        {
            idx[axis].indices(global_shape[axis])[:2]
            for idx in sharding.addressable_devices_indices_map(global_shape).values()
        }
    )
    if any(stop < next_start for (_, stop), (next_start, _) in itertools.pairwise(spans)):
        raise ValueError(f"this process's rows along axis {axis} are not contiguous: {spans}")
    return slice(spans[0][0], max(stop for _, stop in spans))


@dataclasses.dataclass
class HostBatch:
    """The rows of one global batch, as examples, before collation (hooks edit these): the same in every
    process, which collates only its own rows (`BatchIterator.to_global`). A hook that samples (on-policy OPD)
    therefore sees every row, as one SPMD sampler over a model split between processes needs.

    bucket: the (T, K) of the whole global batch.
    """

    rows: list[list[Example | None]]  # [accum][micro]
    bucket: tuple[int, int]


class BatchIterator:
    """Yields each global batch, this process holding its slice; resumable from `state`.

    The global batch of `accum_steps * micro_batch` rows is laid out [accum, micro]: the step scans
    over accum (gradient accumulation) and shards micro over the mesh's batch axes. Every process
    computes the same plan and host batch and collates and transfers only its own rows. target_reserve: targets that a
    hook resamples (on-policy OPD) may grow up to this length; buckets leave room for it.
    """

    def __init__(
        self,
        examples: Sequence[Example],
        *,
        buckets: Buckets,
        micro_batch: int,
        accum_steps: int,
        views: Sequence[str],
        pad_id: int,
        batch_sharding: jax.sharding.NamedSharding,
        state: IteratorState,
        scalars: Sequence[str] = (),
        target_reserve: int = 0,
    ):
        if not examples:
            raise DataError("no training examples")
        self.examples, self.buckets, self.target_reserve = list(examples), buckets, target_reserve
        self.micro_batch, self.accum_steps = micro_batch, accum_steps
        self.views, self.scalars, self.pad_id = tuple(views), tuple(scalars), pad_id
        self.sharding, self.state = batch_sharding, state
        self.rows = process_rows(batch_sharding, (accum_steps, micro_batch), axis=1)
        self._plan: tuple[int, list[np.ndarray]] | None = None

    def _epoch(self, epoch: int) -> list[np.ndarray]:
        if self._plan is None or self._plan[0] != epoch:
            batch = self.micro_batch * self.accum_steps
            self._plan = (
                epoch,
                epoch_plan(self.examples, self.buckets, batch, self.state.seed, epoch, self.target_reserve),
            )
        return self._plan[1]

    def next_host_batch(self) -> HostBatch:
        """The examples of the next global batch (the same in every process); advances the state."""
        if self.state.position >= len(self._epoch(self.state.epoch)):
            self.state = IteratorState(self.state.seed, self.state.epoch + 1, 0)
        indices = self._epoch(self.state.epoch)[self.state.position]
        self.state = dataclasses.replace(self.state, position=self.state.position + 1)
        bucket = self.buckets.of((self.examples[i] for i in indices if i >= 0), self.target_reserve)
        rows = indices.reshape(self.accum_steps, self.micro_batch)
        return HostBatch([[self.examples[i] if i >= 0 else None for i in micro] for micro in rows], bucket)

    def to_global(self, host: HostBatch) -> dict[str, Any]:
        """Collates this process's rows and assembles global arrays [accum, micro, ...] on the mesh."""
        t, k = host.bucket
        need = self.buckets.of(ex for micro in host.rows for ex in micro)
        if need[0] > t or need[1] > k:
            raise DataError(f"rows outgrew their bucket {host.bucket} (need {need}): raise target_reserve")
        mine = [micro[self.rows] for micro in host.rows]
        parts = [collate(micro, self.views, self.scalars, t, k, pad_id=self.pad_id) for micro in mine]
        local = jax.tree.map(lambda *xs: np.stack(xs), *parts)

        def put(x: np.ndarray) -> jax.Array:
            sharding = jax.sharding.NamedSharding(self.sharding.mesh, _pad_spec(self.sharding.spec, x.ndim))
            return jax.make_array_from_process_local_data(
                sharding, x, (self.accum_steps, self.micro_batch) + x.shape[2:]
            )

        return jax.tree.map(put, local)

    def __next__(self) -> dict[str, Any]:
        return self.to_global(self.next_host_batch())

    def __iter__(self) -> BatchIterator:
        return self


def _pad_spec(spec: jax.sharding.PartitionSpec, ndim: int) -> jax.sharding.PartitionSpec:
    return jax.sharding.PartitionSpec(*(tuple(spec) + (None,) * (ndim - len(spec)))[:ndim])


def hint_table(rows: Iterable[Mapping[str, Any]]) -> dict[DecisionKey, str]:
    """{(episode_id, index): hint} from attribution rows, keeping only attributable ones (FLAG = true)."""
    table = {}
    for row in rows:
        if row.get("attributable", True) and row.get("hint"):
            table[(str(row["episode_id"]), int(row["index"]))] = str(row["hint"])
    return table
