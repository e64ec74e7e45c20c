"""Token rows for the OPOD pipeline: packed decision sequences (SFT, RWR, hint following), OPD
context pairs (student s, teacher s ⊕ H) and DA-GRPO contexts, and their fixed-shape batches.

Packing: decision t's context is the conversation up to t, so one episode's decisions share one
sequence: the row holds the conversation and marks each decision's action tokens (and eos) as a
span. Every action is still predicted from exactly the tokens it was sampled or imitated under
(a decision joins the row only if its rendered prompt extends the row token for token; otherwise
it starts a new row), at a quarter of the cost of one row per decision. A span's loss weight is
its decision weight over its length, so summed losses are sums of per-decision means and the
count is the number of decisions: the paper's "average output-token losses within each decision,
then across decisions".

The policy reads contexts through a *view*. "full" is the rendered context itself. "compact" (the
CPU miniature) drops what a tiny model cannot use and pays for on every token: the fixed system
prompt (the same for every task of a suite) and the quoted evidence lines of feedback (the status
and request lines stay). "dsl" (the CPU miniature since the compact language) reads and writes
the workplace suite's compact action-and-state language (envs.workplace.codec): the policy's
actions are short pointers decoded into full tool calls before the engine parses them, so records
keep full actions while the policy is trained on, and samples, the compact form. The same view is applied wherever the policy reads a context: training,
on-policy sampling, the teacher's s ⊕ H, rollouts and evaluation; records keep the exact context.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from porch_jax.attribution.grm import hint_message
from porch_jax.envs.workplace import codec
from porch_jax.protocol import render_call
from porch_jax.train.data import DataError, decision_target, render_prompt
from porch_jax.trajectories import DecisionKey as Key
from porch_jax.trajectories import DecisionRecord, EpisodeRecord

log = logging.getLogger(__name__)
VIEWS = ("full", "compact", "dsl")


def policy_view(context: Sequence[Mapping[str, Any]], view: str = "full") -> list[dict[str, Any]]:
    """The messages the policy reads for a stored context (see the module docstring)."""
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}, got {view!r}")
    if view == "dsl":
        return codec.encode_context(context)
    messages = [dict(m) for m in context]
    if view == "full":
        return messages
    if messages and messages[0].get("role") == "system":
        messages = messages[1:]
    for m in messages:
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            lines = m["content"].split("\n")
            m["content"] = "\n".join(x for x in lines if x != "evidence:" and not x.startswith("> "))
    return messages


def policy_prompt(tokenizer: Any, context: Sequence[Mapping[str, Any]], view: str) -> list[int]:
    return render_prompt(tokenizer, policy_view(context, view))


def action_tokens(
    tokenizer: Any, call: Mapping[str, Any], context: Sequence[Mapping[str, Any]], view: str
) -> list[int]:
    """A stored action as the policy writes it (then eos): the compact form in the "dsl" view."""
    text = codec.encode_action(call, context) if view == "dsl" else render_call(call)
    return tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]


def policy_target(tokenizer: Any, decision: DecisionRecord, view: str) -> list[int]:
    """The decision's target tokens: those sampled when a policy of this view sampled them (stored
    ids), else the stored action as this view writes it."""
    if view != "dsl" or decision.action_token_ids:
        return decision_target(tokenizer, decision)
    return action_tokens(tokenizer, decision.action, decision.context, view)


def teacher_prompt(tokenizer: Any, context: Sequence[Mapping[str, Any]], hint: str, view: str) -> list[int]:
    """The self-teacher's prompt: the policy's view of s ⊕ H (the hint turn in the view's language)."""
    return render_prompt(tokenizer, policy_view(list(context) + [hint_message(hint)], view))


# ---- packed decision rows ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """Target tokens ``tokens[start:start + length]`` of one decision, with its loss weight."""

    start: int
    length: int
    weight: float = 1.0


@dataclass(frozen=True)
class SeqRow:
    tokens: tuple[int, ...]
    spans: tuple[Span, ...]


def _valid(decision: DecisionRecord) -> bool:
    return decision.action is not None


def pack_episode(episode: EpisodeRecord, tokenizer: Any, view: str, weight: float, max_len: int) -> list[SeqRow]:
    """The episode's valid decisions as few rows as exact prefixes allow (see the module docstring).

    A decision longer than ``max_len`` with its context cannot be trained on: it is left out with a
    warning (a runaway rollout's last decisions), never cut.
    """
    rows: list[tuple[list[int], list[Span]]] = []
    for d in episode.decisions:
        if not _valid(d):
            continue
        prompt, target = policy_prompt(tokenizer, d.context, view), policy_target(tokenizer, d, view)
        if len(prompt) + len(target) > max_len:
            log.warning(
                "%s/%d: %d tokens exceed max_len %d; left out",
                episode.episode_id,
                d.index,
                len(prompt) + len(target),
                max_len,
            )
            continue
        tokens = rows[-1][0] if rows else None
        if tokens is None or prompt[: len(tokens)] != tokens or len(prompt) + len(target) > max_len:
            rows.append((list(prompt), []))
        else:
            rows[-1][0].extend(prompt[len(tokens) :])
        tokens, spans = rows[-1]
        spans.append(Span(len(tokens), len(target), weight))
        tokens.extend(target)
    return [SeqRow(tuple(t), tuple(s)) for t, s in rows if s]


def packed_rows(
    episodes: Iterable[EpisodeRecord],
    tokenizer: Any,
    view: str,
    max_len: int,
    weight: Callable[[EpisodeRecord], float] = lambda ep: 1.0,
) -> list[SeqRow]:
    """SFT: every episode with weight 1. RWR: ``weight = reward`` (0/1 success drops failed episodes)."""
    rows = []
    for ep in episodes:
        w = float(weight(ep))
        if w != 0.0:
            rows += pack_episode(ep, tokenizer, view, w, max_len)
    return rows


def hint_following_rows(
    episodes: Iterable[EpisodeRecord],
    hints: Mapping[Key, str],
    tokenizer: Any,
    view: str,
    follow: Callable[[Mapping[str, Any], str], dict[str, Any] | None],
) -> list[SeqRow]:
    """SFT examples that teach hint following: context ⊕ H -> the decision corrected as H says.

    A tiny model trained from scratch follows a hint in its context only if it has seen contexts
    with hints and the actions that follow them; these rows are where it sees them (built from
    expert decisions and their attribution; ``follow`` applies a hint to an action, None skips).
    """
    rows = []
    for ep in episodes:
        for d in ep.decisions:
            hint = hints.get((ep.episode_id, d.index))
            corrected = follow(d.action, hint) if hint and _valid(d) else None
            if corrected is None:
                continue
            prompt = teacher_prompt(tokenizer, d.context, hint, view)
            target = action_tokens(tokenizer, corrected, d.context, view)
            rows.append(SeqRow(tuple(prompt) + tuple(target), (Span(len(prompt), len(target)),)))
    return rows


def empty_hint_rows(
    episodes: Iterable[EpisodeRecord],
    hints: Mapping[Key, str],
    tokenizer: Any,
    view: str,
    follow: Callable[[Mapping[str, Any], str], dict[str, Any] | None],
) -> list[SeqRow]:
    """The contrast to ``hint_following_rows`` on the same decisions (same order): context ⊕ empty
    hint -> the decision as it was. A model that has only seen hint turns followed by corrections
    reads any hint turn, even an empty one, as "fix the usual blind spot"; with these rows an empty
    hint carries no information, as for a capable base model, and OPD's empty-hint control is clean."""
    rows = []
    for ep in episodes:
        for d in ep.decisions:
            hint = hints.get((ep.episode_id, d.index))
            if not hint or not _valid(d) or follow(d.action, hint) is None:
                continue
            prompt = teacher_prompt(tokenizer, d.context, "", view)
            target = action_tokens(tokenizer, d.action, d.context, view)
            rows.append(SeqRow(tuple(prompt) + tuple(target), (Span(len(prompt), len(target)),)))
    return rows


# ---- OPD pairs and DA-GRPO contexts -------------------------------------------------------------------


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


def opd_rows(episodes: Iterable[EpisodeRecord], hints: Mapping[Key, str], tokenizer: Any, view: str) -> list[OpdRow]:
    """One row per attributable decision, of successful and failed episodes alike."""
    return [
        OpdRow(
            (ep.episode_id, d.index),
            tuple(policy_prompt(tokenizer, d.context, view)),
            tuple(teacher_prompt(tokenizer, d.context, hints[(ep.episode_id, d.index)], view)),
            functools.partial(codec.decodes, context=d.context) if view == "dsl" else None,
        )
        for ep in episodes
        for d in ep.decisions
        if (ep.episode_id, d.index) in hints and _valid(d)
    ]


@dataclass(frozen=True)
class ExpertContext:
    """An expert decision context for DA-GRPO: the prompt and the expert's action (the reference)."""

    key: Key
    prompt: tuple[int, ...]
    reference: Mapping[str, Any]
    decode: Callable[[str], str] | None = None  # a sampled reply as the engine would parse it (dsl view)


def expert_contexts(episodes: Iterable[EpisodeRecord], tokenizer: Any, view: str) -> list[ExpertContext]:
    def decoder(context: Any) -> Callable[[str], str] | None:
        return (lambda text: codec.decode_text(text, context)) if view == "dsl" else None

    return [
        ExpertContext(
            (ep.episode_id, d.index), tuple(policy_prompt(tokenizer, d.context, view)), d.action, decoder(d.context)
        )
        for ep in episodes
        for d in ep.decisions
        if _valid(d)
    ]


# ---- batches -------------------------------------------------------------------------------------------


def bucket(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket holding ``n``."""
    fit = [b for b in sorted(buckets) if b >= n]
    if not fit:
        raise DataError(f"{n} tokens exceed the largest bucket {max(buckets)}")
    return fit[0]


def seq_batch(rows: Sequence[SeqRow], t: int, k: int) -> dict[str, np.ndarray]:
    """Rows as arrays: tokens/mask [B, t]; index/targets/target_mask/weight [B, k] (weight: the
    decision's weight over its length, per token); count []: decisions with a non-zero weight."""
    b = len(rows)
    out = {
        "tokens": np.zeros((b, t), np.int32),
        "mask": np.zeros((b, t), bool),
        "index": np.zeros((b, k), np.int32),
        "targets": np.zeros((b, k), np.int32),
        "target_mask": np.zeros((b, k), bool),
        "weight": np.zeros((b, k), np.float32),
    }
    count = 0
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
            count += s.weight != 0
            j += s.length
    out["count"] = np.asarray(count, np.float32)
    return out


def scored_batch(
    prompts: Sequence[Sequence[int]],
    actions: Sequence[Sequence[int]],
    t: int,
    k: int,
    logprobs: Sequence[Sequence[float]] | None = None,
) -> dict[str, np.ndarray]:
    """One decision per row: prompt then action, every action token scored (OPD, GRPO).

    With ``logprobs`` (the sampler's), ``logprobs``/``sampled`` [B, k] travel with the row."""
    rows = [SeqRow(tuple(p) + tuple(a), (Span(len(p), len(a)),) if a else ()) for p, a in zip(prompts, actions)]
    out = seq_batch(rows, t, k)
    out["logprobs"] = np.zeros((len(rows), k), np.float32)
    for i, lp in enumerate(logprobs or ()):
        out["logprobs"][i, : len(lp)] = lp
    return out
