"""The one row format of language-model training: a token sequence with target spans, as fixed-shape arrays.

Packing: decision t's context is the conversation up to t, so one episode's decisions share one
sequence: the row holds the conversation and marks each decision's action tokens (and eos) as a
span. A single recorded decision is the same row with one span. A span's loss weight is its
decision weight over its length, so summed losses are sums of per-decision means and the count is
the number of decisions: the paper's "average output-token losses within each decision, then across
decisions". OPD and GRPO rows hold one sampled action each (`scored_batch`), with the sampler's
log-probabilities. porch_jax/opod/rows.py builds rows from episodes, porch_jax/rows/records.py from
record files; this module knows no task.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from porch_jax.train.views import SampledView, TokenView
from porch_jax.trajectories import DecisionKey as Key


class DataError(ValueError):
    """A row that cannot be batched; the message names it."""


@dataclass(frozen=True)
class Span:
    """Target tokens ``tokens[start:start + length]`` of one decision, with its loss weight."""

    start: int
    length: int
    weight: float = 1.0


@dataclass(frozen=True)
class SeqRow:
    """A token sequence and its decisions' target spans. key: the decision it starts with, (episode id, decision
    index), which messages about the row name (None: unnamed, e.g. a padding row)."""

    tokens: tuple[int, ...]
    spans: tuple[Span, ...]
    key: Key | None = None


@dataclass(frozen=True)
class OpdRow:
    """A FLAG=true decision: the student's prompt (s) and the teacher's (s ⊕ H); the action is sampled.

    ``is_action`` (dsl view): whether a sampled reply decodes into an action at all. OPD distils only
    those: on a malformed reply's tokens a tiny teacher has no knowledge to give (its distribution there
    is noise) and following it taught malformed actions."""

    key: Key
    student: tuple[int, ...]
    teacher: tuple[int, ...]
    is_action: Callable[[str], bool] | None = None


@dataclass(frozen=True)
class ExpertContext:
    """An expert decision context for DA-GRPO: the prompt and the expert's action (the reference)."""

    key: Key
    prompt: tuple[int, ...]
    reference: Mapping[str, Any]
    decode: Callable[[str], str] | None = None  # a sampled reply as the engine would parse it (dsl view)


@dataclass(frozen=True)
class RecordedSample:
    """One recorded GRPO sample: its token ids, the sampler's log-probabilities of its first len(logprobs) tokens
    (the rest count as on-policy) and its reward."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    reward: float


@dataclass(frozen=True)
class RecordedGroup:
    """A recorded GRPO group: the prompt its samples were drawn under, and the samples. key: a name for messages."""

    key: Any
    prompt: tuple[int, ...]
    samples: tuple[RecordedSample, ...]


def bucket(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket holding ``n``."""
    fit = [b for b in sorted(buckets) if b >= n]
    if not fit:
        raise DataError(f"{n} tokens exceed the largest bucket {max(buckets)}")
    return fit[0]


def seq_batch(rows: Sequence[SeqRow], t: int, k: int) -> TokenView:
    """Rows as a TokenView: tokens/mask [B, t]; index/targets/target_mask/weight [B, k] (weight: the
    decision's weight over its length, per token); count [B]: each row's decisions with a non-zero weight."""
    return TokenView(**_token_arrays(rows, t, k))


def _token_arrays(rows: Sequence[SeqRow], t: int, k: int) -> dict[str, np.ndarray]:
    b = len(rows)
    out = {
        "tokens": np.zeros((b, t), np.int32),
        "mask": np.zeros((b, t), bool),
        "index": np.zeros((b, k), np.int32),
        "targets": np.zeros((b, k), np.int32),
        "target_mask": np.zeros((b, k), bool),
        "weight": np.zeros((b, k), np.float32),
        "count": np.zeros(b, np.float32),
    }
    for i, row in enumerate(rows):
        if len(row.tokens) > t or sum(s.length for s in row.spans) > k:
            raise DataError(
                f"row of {len(row.tokens)} tokens / {sum(s.length for s in row.spans)} targets > ({t}, {k})"
            )
        out["tokens"][i, : len(row.tokens)] = row.tokens
        out["mask"][i, : len(row.tokens)] = True
        j = 0
        for s in row.spans:
            sl = slice(j, j + s.length)
            out["index"][i, sl] = np.arange(s.start - 1, s.start - 1 + s.length)  # column c predicts token c + 1
            out["targets"][i, sl] = row.tokens[s.start : s.start + s.length]
            out["target_mask"][i, sl] = True
            out["weight"][i, sl] = s.weight / s.length
            out["count"][i] += s.weight != 0
            j += s.length
    return out


def scored_batch(
    prompts: Sequence[Sequence[int]],
    actions: Sequence[Sequence[int]],
    t: int,
    k: int,
    logprobs: Sequence[Sequence[float]] | None = None,
) -> SampledView:
    """One decision per row: prompt then action, every action token scored (OPD, GRPO).

    ``logprobs``/``sampled`` [B, k]: the sampler's log-probabilities of each row's first len(logprobs[i]) action
    tokens and where they exist (a recorded action may stop short of an appended eos, which was not sampled);
    without ``logprobs`` (a teacher's view), no token is sampled."""
    rows = [
        SeqRow(tuple(p) + tuple(a), (Span(len(p), len(a)),) if a else ())
        for p, a in zip(prompts, actions, strict=False)
    ]
    out = _token_arrays(rows, t, k)
    out["logprobs"] = np.zeros((len(rows), k), np.float32)
    out["sampled"] = np.zeros((len(rows), k), bool)
    for i, lp in enumerate(logprobs or ()):
        if len(lp) > len(actions[i]):
            raise DataError(f"row {i}: {len(lp)} logprobs for a {len(actions[i])}-token action")
        out["logprobs"][i, : len(lp)] = lp
        out["sampled"][i, : len(lp)] = True
    return SampledView(**out)
