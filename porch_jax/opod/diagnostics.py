"""Does the self-teacher know better than the student where OPD trains? (OPD's precondition)

OPD moves the student toward the teacher's distribution under s ⊕ H only at FLAG=true decisions,
so it can help only if the teacher (the SFT weights reading the hint) acts as the hint says more
often than the student (the same weights without it). This measures both, greedily, against the
hinted action (the stored action corrected as the hint says, ``follow``), on the flagged
decisions of a rollout store, and the same for an empty hint and for another decision's hint (the controls: no
gain expected from either if the gain is the hint's information).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from porch_jax.models.sampler import SamplingParams
from porch_jax.opod import rows as episode_rows
from porch_jax.trajectories import EpisodeRecord


def hint_following(
    sampler: Any,
    episodes: Iterable[EpisodeRecord],
    hints: Mapping[tuple[str, int], str],
    view: str,
    follow: Callable[[Mapping[str, Any], str], dict[str, Any] | None],
    *,
    limit: int = 256,
    max_new_tokens: int = 24,
    seed: int = 0,
) -> dict[str, float]:
    """Exact-match rates with the hinted action: student (s), teacher (s ⊕ H), teacher (s ⊕ empty hint) and teacher
    (s ⊕ a wrong hint: another flagged decision's, `rows.wrong_hints(hints, seed)`, as OPD's wrong-hint control
    draws them; absent with fewer than two distinct hints). Each context's prompts go to the sampler in one call; its
    `max_batch_tokens` bounds what one forward holds (SmolLM2 at 64 prompts of ~1,000 tokens outgrew 23 GB)."""
    tok, rows = sampler.tokenizer, []
    wrong = episode_rows.wrong_hints(hints, seed)
    for ep in episodes:
        for d in ep.decisions:
            key = (ep.episode_id, d.index)
            hint = hints.get(key)
            target = follow(d.action, hint) if hint and d.action is not None else None
            if target is not None:
                rows.append(
                    (d.context, hint, tok.decode(episode_rows.action_tokens(tok, target, d.context, view)[:-1]), key)
                )
    rows = rows[:limit]
    if not rows:
        return {"n": 0}
    longest = max(sampler.prompt_buckets)
    prompts = {
        "student": [episode_rows.policy_prompt(tok, c, view) for c, _, _, _ in rows],
        "teacher": [episode_rows.teacher_prompt(tok, c, h, view) for c, h, _, _ in rows],
        "teacher_empty_hint": [episode_rows.teacher_prompt(tok, c, "", view) for c, _, _, _ in rows],
    }
    if wrong:
        prompts["teacher_wrong_hint"] = [episode_rows.teacher_prompt(tok, c, wrong[k], view) for c, _, _, k in rows]
    out: dict[str, float] = {"n": float(len(rows))}
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    for name, ps in prompts.items():
        keep = [i for i, p in enumerate(ps) if len(p) <= longest]
        texts = [c.text.strip() for c in sampler.generate([ps[i] for i in keep], params)]
        out[name] = sum(t == rows[i][2].strip() for i, t in zip(keep, texts, strict=True)) / max(len(keep), 1)
    return out
