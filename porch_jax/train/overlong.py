"""Rows longer than a batch source's largest bucket: the configured rule, applied once when the source is built,
and its counts.

    overlong = "drop"    # the row is left out
             | "cut"     # its targets are cut from the right, its prompts never (below)
             | "error"   # DataError naming the row (episode id, decision index) and its lengths

A source keeps the rows that fit unchanged and reports `RowCounts` (kept, cut, dropped; the trainer writes them to
WORKDIR/rows.json and prints them). The functions here are pure: no logging, no state.

What "cut" does to each row kind. One principle: every target token kept is still predicted from exactly the
tokens it was sampled or imitated under, so a prompt is never cut. Cutting a prompt from the left loses the system
message and the task every context starts with (and shifts every position); from the right, the generation
prompt and, for a teacher, the hint.

- A packed decision sequence (`SeqRow`: SFT, RWR, hint following): the row keeps its first `limit` tokens. A
  causal model predicts each kept token from the tokens before it, so the prefix is unchanged: a span wholly
  beyond the cut (its prompt does not fit) is removed, a span crossing it keeps its first tokens and its decision
  weight (averaged over the tokens kept, so it still counts as one decision); tokens after the last kept span are
  trimmed. A row left with no target token is dropped and counted as dropped.
- A records example (data.py): each view keeps its whole prompt and the first target tokens that fit the largest
  (T, K), counting targets as at least `reserve` (room for an on-policy resample). An OPD pair ("student" and
  "teacher") is cut to one length, so both score the same tokens position by position. A view whose prompt (with
  the reserved room) does not fit is removed, an OPD pair together; an example left with no view is dropped.
- A GRPO sample (a view with sampler log-probabilities): "cut" refuses (ValueError naming `overlong` and the row
  kind). Its advantage is its whole sample's reward relative to its group; a cut prefix would take credit for
  tokens it no longer has.
- An OPD row (`OpdRow`: the student's prompt s, the teacher's s ⊕ H) and a DA-GRPO context (`ExpertContext`): only
  prompts are stored, and the source reserves room for the continuation the student samples (max_new_tokens), so
  an over-long row is an over-long prompt, which is never cut: the row is dropped and counted as dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from porch_jax.train.data import DataError, Example, View
from porch_jax.train.packing import ExpertContext, OpdRow, SeqRow, Span

RULES: tuple[str, ...] = ("drop", "cut", "error")
ROWS_FILE = "rows.json"  # WORKDIR/rows.json: each source's RowCounts (trainer.py)

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class RowCounts:
    """How one source's rows fared against its length limit: `kept` fit as they were, `cut` were shortened,
    `dropped` were left out (over-long under "drop", or left with no target by "cut"). limit: the largest bucket
    (tokens per row); target_limit: the largest target bucket, where there is one (records)."""

    rule: str
    limit: int
    kept: int = 0
    cut: int = 0
    dropped: int = 0
    target_limit: int | None = None

    @property
    def total(self) -> int:
        return self.kept + self.cut + self.dropped

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """One line: '40 kept, 2 cut, 1 dropped of 43 rows (largest bucket 256 tokens; overlong='cut')'."""
        limit = f"{self.limit} tokens" + ("" if self.target_limit is None else f", {self.target_limit} targets")
        return (
            f"{self.kept} kept, {self.cut} cut, {self.dropped} dropped of {self.total} rows "
            f"(largest bucket {limit}; overlong={self.rule!r})"
        )


def apply(
    items: Sequence[T],
    rule: str,
    *,
    overflow: Callable[[T], str | None],
    cut: Callable[[T], T | None],
    limit: int,
    target_limit: int | None = None,
) -> tuple[list[T], RowCounts]:
    """The items under `rule`, in order, and their counts. overflow(x): None when x fits, else what exceeds (the
    row's name and lengths, for the error); cut(x): x shortened to fit, None when nothing trainable is left (or a
    ValueError where a cut would be wrong)."""
    if rule not in RULES:
        raise ValueError(f"overlong must be one of {RULES}, got {rule!r}")
    out, kept, shortened, dropped = [], 0, 0, 0
    for x in items:
        reason = overflow(x)
        if reason is None:
            out.append(x)
            kept += 1
            continue
        if rule == "error":
            raise DataError(f"{reason} (overlong='error'; 'drop' leaves such rows out, 'cut' shortens their targets)")
        y = cut(x) if rule == "cut" else None
        if y is None:
            dropped += 1
        else:
            out.append(y)
            shortened += 1
    return out, RowCounts(rule, limit, kept, shortened, dropped, target_limit)


def _key_name(key: Any) -> str:
    if isinstance(key, tuple) and len(key) == 2:
        return f"episode {key[0]!r} decision {key[1]}"
    return "a row" if key is None else repr(key)


# ---- packed rows (packing.py) ----------------------------------------------------------------------------


def cut_row(row: SeqRow, limit: int) -> SeqRow | None:
    """`row` cut to its first `limit` tokens (module docstring); None when no target token is left."""
    if len(row.tokens) <= limit:
        return row
    spans = tuple(
        Span(s.start, min(s.length, limit - s.start), s.weight) for s in row.spans if s.length > 0 and s.start < limit
    )
    if not spans:
        return None
    end = max(s.start + s.length for s in spans)
    return dataclasses.replace(row, tokens=row.tokens[:end], spans=spans)


def seq_rows(rows: Sequence[SeqRow], limit: int, rule: str) -> tuple[list[SeqRow], RowCounts]:
    """Packed decision rows within `limit` tokens under `rule`."""

    def overflow(r: SeqRow) -> str | None:
        if len(r.tokens) <= limit:
            return None
        return f"{_key_name(r.key)}: a packed row of {len(r.tokens)} tokens exceeds the largest bucket ({limit})"

    return apply(rows, rule, overflow=overflow, cut=lambda r: cut_row(r, limit), limit=limit)


def opd_rows(rows: Sequence[OpdRow], limit: int, rule: str) -> tuple[list[OpdRow], RowCounts]:
    """OPD rows whose student and teacher prompts fit `limit` tokens; "cut" drops the others (prompts are never cut)."""

    def overflow(r: OpdRow) -> str | None:
        if max(len(r.student), len(r.teacher)) <= limit:
            return None
        return (
            f"{_key_name(r.key)}: OPD prompts of {len(r.student)} (student) and {len(r.teacher)} (teacher) tokens; "
            f"the largest bucket is {limit}"
        )

    return apply(rows, rule, overflow=overflow, cut=lambda r: None, limit=limit)


def expert_contexts(contexts: Sequence[ExpertContext], limit: int, rule: str) -> tuple[list[ExpertContext], RowCounts]:
    """DA-GRPO contexts whose prompt fits `limit` tokens; "cut" drops the others (prompts are never cut)."""

    def overflow(c: ExpertContext) -> str | None:
        if len(c.prompt) <= limit:
            return None
        return f"{_key_name(c.key)}: a DA-GRPO prompt of {len(c.prompt)} tokens exceeds the largest bucket ({limit})"

    return apply(contexts, rule, overflow=overflow, cut=lambda c: None, limit=limit)


# ---- records examples (data.py) --------------------------------------------------------------------------

OPD_PAIR = ("student", "teacher")


def _record_name(example: Example) -> str:
    """ "episode 'ep3' decision 1" for a decision's example (its key is data.decision_key's); "GRPO sample 'key'"
    for a sample (a view with sampler log-probabilities: its key is its group's and its index)."""
    if any(v.logprobs is not None for v in example.views.values()):
        return f"GRPO sample {example.key!r}"
    episode, _, index = example.key.rpartition("/")
    return f"episode {episode!r} decision {index}" if episode and index.isdigit() else repr(example.key)


def _room(view: View, t: int, k: int, reserve: int) -> int:
    """The most target tokens `view` keeps within (t, k) with its whole prompt and `reserve` tokens of room; 0: none."""
    if len(view.prompt) + reserve > t or reserve > k:
        return 0
    return max(0, min(k, t - len(view.prompt)))


def cut_example(example: Example, t: int, k: int, reserve: int = 0) -> Example | None:
    """`example` with every view cut to fit (t, k) (module docstring); None when no view is left."""
    views = dict(example.views)
    pair = [v for v in OPD_PAIR if v in views]
    groups = ([pair] if pair else []) + [[v] for v in views if v not in OPD_PAIR]
    out: dict[str, View] = {}
    for names in groups:
        room = min(_room(views[v], t, k, reserve) for v in names)
        if room == 0:
            continue  # a prompt (with the reserved room) that does not fit: never cut, so the view goes
        for v in names:
            view = views[v]
            if len(view.target) <= room:
                out[v] = view
                continue
            if view.logprobs is not None:
                raise ValueError(
                    f"overlong='cut' cannot cut a {_record_name(example)} (view {v!r}: prompt {len(view.prompt)}, "
                    f"target {len(view.target)} tokens; largest bucket T={t}, K={k}): its advantage is the whole "
                    "sample's reward, which a cut prefix would take credit for; use overlong='drop' or 'error'"
                )
            out[v] = dataclasses.replace(view, target=view.target[:room])
    return dataclasses.replace(example, views={v: out[v] for v in views if v in out}) if out else None


def examples(rows: Sequence[Example], t: int, k: int, rule: str, reserve: int = 0) -> tuple[list[Example], RowCounts]:
    """Records examples within the largest bucket (t, k) under `rule`; targets count as at least `reserve` tokens,
    as `Buckets.of` counts them."""

    def overflow(ex: Example) -> str | None:
        for name, view in ex.views.items():
            n = max(len(view.target), reserve)
            if len(view.prompt) + n > t or n > k:
                room = f", {reserve} reserved" if reserve > len(view.target) else ""
                return (
                    f"{_record_name(ex)}: view {name!r} of {len(view)} tokens (prompt {len(view.prompt)}, target "
                    f"{len(view.target)}{room}) exceeds the largest bucket (T={t}, K={k})"
                )
        return None

    return apply(rows, rule, overflow=overflow, cut=lambda ex: cut_example(ex, t, k, reserve), limit=t, target_limit=k)
