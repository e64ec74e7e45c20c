"""A recorded decision as token ids: its prompt (the context the orchestrator saw, rendered with the tokenizer's
chat template, generation prompt included) and its target (the sampled token ids, since re-tokenizing sampled text
drifts from what was sampled, or, only when no ids were stored, its tokenized text; then eos). Only target tokens
carry loss."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from porch_jax.protocol.render import prompt_ids
from porch_jax.train.packing import DataError
from porch_jax.trajectories import DecisionKey


def decision_target(tokenizer, decision) -> list[int]:
    """The decision's tokens plus eos: stored action_token_ids when present, else tokenized action_text."""
    ids = list(decision.action_token_ids or ())
    if not ids:
        ids = tokenizer.encode(decision.action_text, add_special_tokens=False)
    eos = tokenizer.eos_token_id
    if not ids or ids[-1] != eos:
        ids.append(eos)
    return [int(t) for t in ids]


def valid_decisions(episodes: Iterable) -> Iterable[tuple[Any, Any]]:
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
    for _, d in valid_decisions(episodes):
        counts[d.token_source] += 1
    return counts


def hint_table(rows: Iterable[Mapping[str, Any]]) -> dict[DecisionKey, str]:
    """{(episode_id, index): hint} from attribution rows, keeping only attributable ones (FLAG = true)."""
    table = {}
    for row in rows:
        if row.get("attributable", True) and row.get("hint"):
            table[(str(row["episode_id"]), int(row["index"]))] = str(row["hint"])
    return table
