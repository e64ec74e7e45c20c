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
- A recorded GRPO group (`RecordedGroup`): its samples are never cut (each one's advantage is its whole
  sample's reward relative to its group; a cut prefix would take credit for tokens it no longer has) and its
  prompt never is, so a group whose prompt does not fit is dropped.
- An OPD row (`OpdRow`: the student's prompt s, the teacher's s ⊕ H) and a DA-GRPO context (`ExpertContext`): only
  prompts are stored, and the source reserves room for the continuation the student samples (max_new_tokens), so
  an over-long row is an over-long prompt, which is never cut: the row is dropped and counted as dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from porch_jax.train.packing import DataError, ExpertContext, OpdRow, RecordedGroup, SeqRow, Span

RULES: tuple[str, ...] = ("drop", "cut", "error")
ROWS_FILE = "rows.json"  # WORKDIR/rows.json: each source's RowCounts (trainer.py)

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class RowCounts:
    """How one source's rows fared against its length limit: `kept` fit as they were, `cut` were shortened,
    `dropped` were left out (over-long under "drop", or left with no target by "cut"). limit: the largest bucket
    (tokens per row)."""

    rule: str
    limit: int
    kept: int = 0
    cut: int = 0
    dropped: int = 0

    @property
    def total(self) -> int:
        return self.kept + self.cut + self.dropped

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """One line: '40 kept, 2 cut, 1 dropped of 43 rows (largest bucket 256 tokens; overlong='cut')'."""
        return (
            f"{self.kept} kept, {self.cut} cut, {self.dropped} dropped of {self.total} rows "
            f"(largest bucket {self.limit} tokens; overlong={self.rule!r})"
        )


def apply(
    items: Sequence[T],
    rule: str,
    *,
    overflow: Callable[[T], str | None],
    cut: Callable[[T], T | None],
    limit: int,
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
    return out, RowCounts(rule, limit, kept, shortened, dropped)


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
        return f"{_key_name(r.key)}: a row of {len(r.tokens)} tokens exceeds the largest bucket ({limit})"

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


def _prompts(items: Sequence[T], limit: int, rule: str, kind: str) -> tuple[list[T], RowCounts]:
    """Items (with a `key` and a `prompt`) whose prompt fits `limit` tokens; "cut" drops the others (prompts are
    never cut)."""

    def overflow(c: Any) -> str | None:
        if len(c.prompt) <= limit:
            return None
        return f"{_key_name(c.key)}: a {kind} prompt of {len(c.prompt)} tokens exceeds the largest bucket ({limit})"

    return apply(items, rule, overflow=overflow, cut=lambda c: None, limit=limit)


def expert_contexts(contexts: Sequence[ExpertContext], limit: int, rule: str) -> tuple[list[ExpertContext], RowCounts]:
    """DA-GRPO contexts whose prompt fits `limit` tokens; "cut" drops the others (prompts are never cut)."""
    return _prompts(contexts, limit, rule, "DA-GRPO")


def recorded_groups(groups: Sequence[RecordedGroup], limit: int, rule: str) -> tuple[list[RecordedGroup], RowCounts]:
    """Recorded GRPO groups whose prompt fits `limit` tokens; "cut" drops the others: neither the prompt nor a
    sample is cut (a sample's advantage is its whole reward relative to its group; a cut prefix would take credit
    for tokens it no longer has)."""
    return _prompts(groups, limit, rule, "GRPO group")
