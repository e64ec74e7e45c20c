"""Token rows of the OPOD experiment built from episodes, in the policy's view (porch_jax/envs/views.py):
packed decision sequences (SFT, RWR, hint following), OPD context pairs (student s, teacher s + H)
and DA-GRPO contexts. Their arrays are porch_jax/train/packing.py's.

A decision joins an episode's packed row only if its rendered prompt extends the row token for
token (otherwise it starts a new row), so every action is still predicted from exactly the tokens
it was sampled or imitated under, at a quarter of the cost of one row per decision.
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from porch_jax.attribution.grm import teacher_context
from porch_jax.envs.views import policy_view
from porch_jax.envs.workplace import codec
from porch_jax.protocol import render_call
from porch_jax.protocol.render import prompt_ids
from porch_jax.rows.decisions import decision_target
from porch_jax.train.packing import ExpertContext, OpdRow, SeqRow, Span
from porch_jax.trajectories import DecisionKey as Key
from porch_jax.trajectories import DecisionRecord, EpisodeRecord


def policy_prompt(tokenizer: Any, context: Sequence[Mapping[str, Any]], view: str) -> list[int]:
    return prompt_ids(tokenizer, policy_view(context, view))


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
    return prompt_ids(tokenizer, policy_view(teacher_context(context, hint), view))


def _valid(decision: DecisionRecord) -> bool:
    return decision.action is not None


def pack_episode(episode: EpisodeRecord, tokenizer: Any, view: str, weight: float, max_len: int) -> list[SeqRow]:
    """The episode's valid decisions as few rows as exact prefixes allow (see the module docstring); each row's
    key is its first decision.

    A decision longer than ``max_len`` with its context joins no row: it gets a row of its own, after the
    episode's other rows, which the batch source drops, cuts or refuses by its ``overlong`` rule
    (porch_jax/train/overlong.py), so the rows within ``max_len`` are the same under every rule.
    """
    rows: list[tuple[list[int], list[Span], Key]] = []
    over: list[SeqRow] = []
    for d in episode.decisions:
        if not _valid(d):
            continue
        key = (episode.episode_id, d.index)
        prompt, target = policy_prompt(tokenizer, d.context, view), policy_target(tokenizer, d, view)
        if len(prompt) + len(target) > max_len:
            over.append(SeqRow(tuple(prompt) + tuple(target), (Span(len(prompt), len(target), weight),), key))
            continue
        tokens = rows[-1][0] if rows else None
        if tokens is None or prompt[: len(tokens)] != tokens:
            rows.append((list(prompt), [], key))
        else:
            rows[-1][0].extend(prompt[len(tokens) :])
        tokens, spans, _ = rows[-1]
        spans.append(Span(len(tokens), len(target), weight))
        tokens.extend(target)
    return [SeqRow(tuple(t), tuple(s), k) for t, s, k in rows if s] + over


def validation_split(episodes: Sequence[EpisodeRecord], share: float) -> tuple[list[Any], list[Any]]:
    """(training, validation) episodes: the `share` whose ids hash lowest are held out (at least one when share > 0
    and there are two or more), so the split depends on the ids alone, not their order."""
    if share <= 0 or len(episodes) < 2:
        return list(episodes), []
    rank = sorted(episodes, key=lambda ep: hashlib.blake2b(ep.episode_id.encode(), digest_size=8).digest())
    held = {ep.episode_id for ep in rank[: max(1, round(share * len(episodes)))]}
    return [ep for ep in episodes if ep.episode_id not in held], [ep for ep in episodes if ep.episode_id in held]


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


def _hinted_row(tokenizer: Any, key: Key, context: Any, hint: str, action: Mapping[str, Any], view: str) -> SeqRow:
    """One SFT row: the teacher prompt for ``context`` ⊕ ``hint`` -> ``action``'s tokens."""
    prompt = teacher_prompt(tokenizer, context, hint, view)
    target = action_tokens(tokenizer, action, context, view)
    return SeqRow(tuple(prompt) + tuple(target), (Span(len(prompt), len(target)),), key)


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
            rows.append(_hinted_row(tokenizer, (ep.episode_id, d.index), d.context, hint, corrected, view))
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
            rows.append(_hinted_row(tokenizer, (ep.episode_id, d.index), d.context, "", d.action, view))
    return rows


# ---- OPD pairs and DA-GRPO contexts -------------------------------------------------------------------


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


def wrong_hints(hints: Mapping[Key, str], seed: int) -> dict[Key, str]:
    """Each flagged decision with the hint of another flagged decision (a seeded derangement over decisions whose
    hints differ from its own, so no decision keeps its own hint's text): the wrong-hint control of OPD, whose
    teacher context carries a hint that says nothing about its decision. Empty with fewer than two distinct hints."""
    keys = sorted(hints)
    if len(set(hints.values())) < 2:
        return {}
    rng = random.Random(seed)
    out: dict[Key, str] = {}
    for key in keys:
        others = [k for k in keys if hints[k] != hints[key]]
        out[key] = hints[rng.choice(others)]
    return out


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
