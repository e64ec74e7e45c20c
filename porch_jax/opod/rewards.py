"""DA-GRPO's per-decision reward: a sampled action judged against the expert's action at the same
context, with Orchestra-o1's weights: format 0.1, action validity 0.1, tool (action) choice 0.2,
decision quality 0.6.

Orchestra-o1 asks an LLM judge for these; the synthetic suite scores them by rule, so the reward
is deterministic: format = exactly one well-formed tool call; validity = it parses as an
orchestrator action with this suite's tools; tool = the same action as the expert's; quality = how
close its arguments are to the expert's (exact subgoal / agent / answer, Jaccard overlap of tool
and context lists, budget within a relative distance), 0 when the action differs. Because the
reference is the expert, DA-GRPO can at best reach the expert, blind spots included.

Every framework an experiment trains is scored the same way against its own expert (the one that plays its action
set): validity checks the reply against that framework's actions (``actions``: Orchestra-o1's ``delegate_all`` and
``finish``, the lifecycle orchestrator's ``delegate`` / ``revise`` / ``stop`` / ``finish``), and a joined
delegation's ``subtasks`` are scored harness by harness (``subtask_similarity``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from porch_jax.protocol import ORCHESTRATOR_ACTIONS, ProtocolError, extract_call, orchestrator_action_from_call

WEIGHTS = {"format": 0.1, "validity": 0.1, "tool": 0.2, "quality": 0.6}


def _jaccard(a: Any, b: Any) -> float:
    sa, sb = set(a or ()), set(b or ())
    return 1.0 if not sa and not sb else len(sa & sb) / len(sa | sb)


def _budget(a: Any, b: Any) -> float:
    if not isinstance(a, int) or not isinstance(b, int) or isinstance(a, bool):
        return 0.0
    return max(0.0, 1.0 - abs(a - b) / max(abs(b), 1))


def _same(a: Any, b: Any) -> float:
    norm = (lambda x: " ".join(x.split()).lower()) if isinstance(b, str) and isinstance(a, str) else (lambda x: x)
    return float(norm(a) == norm(b))


def subtask_similarity(a: Any, b: Any) -> float:
    """A joined delegation's subtasks against the reference's: each reference subtask paired with the sampled one
    for the same subgoal (else the next unpaired one, in order) and scored as a delegation's arguments; the sum over
    the longer of the two lists, so a missing or extra subtask scores 0."""
    if not isinstance(a, (list, tuple)) or not isinstance(b, (list, tuple)):
        return 0.0
    mine = [t for t in a if isinstance(t, Mapping)]
    ref = [t for t in b if isinstance(t, Mapping)]
    if not mine and not ref:
        return 1.0
    free = list(range(len(mine)))
    total = 0.0
    for r in ref:
        same = [i for i in free if _same(mine[i].get("subgoal"), r.get("subgoal"))]
        if not (same or free):
            break
        i = (same or free)[0]
        free.remove(i)
        total += argument_similarity(mine[i], r)
    return total / max(len(mine), len(ref))


_FIELD_SCORES = {
    "subtasks": subtask_similarity,
    "subgoal": _same,
    "context": _jaccard,
    "tools": _jaccard,
    "budget": _budget,
    "agent_id": _same,
    "answer": _same,
    "reason": lambda a, b: 1.0,
}


def argument_similarity(args: Mapping[str, Any], reference: Mapping[str, Any]) -> float:
    """Mean per-field score over the fields either side sets (a free-text ``note`` is not judged)."""
    fields = [f for f in dict.fromkeys([*reference, *args]) if f in _FIELD_SCORES]
    if not fields:
        return 1.0
    return sum(_FIELD_SCORES[f](args.get(f), reference.get(f)) for f in fields) / len(fields)


def decision_reward(
    text: str,
    reference: Mapping[str, Any],
    available_tools: Collection[str],
    actions: Collection[str] = ORCHESTRATOR_ACTIONS,
) -> dict[str, float]:
    """The four components (each in [0, 1]) and their weighted ``reward`` for one sampled reply; ``actions``: the
    framework's orchestrator actions (rollout/config.py EngineConfig.prompt_actions; POrchestra's by default)."""
    parts = dict.fromkeys(WEIGHTS, 0.0)
    try:
        call = extract_call(text)
    except ProtocolError:
        call = None
    if call is not None:
        parts["format"] = 1.0
        try:
            orchestrator_action_from_call(call, available_tools=available_tools, actions=actions)
            parts["validity"] = 1.0
        except ProtocolError:
            pass
        if call["name"] == reference["name"]:
            parts["tool"] = 1.0
            parts["quality"] = argument_similarity(call["arguments"], reference["arguments"])
    parts["reward"] = sum(WEIGHTS[k] * parts[k] for k in WEIGHTS)
    return parts


def dagrpo_reward(
    available_tools: Collection[str], actions: Collection[str] = ORCHESTRATOR_ACTIONS
) -> Callable[[Any, str], float]:
    """The reward `train.sources.GroupSource` calls per sample: (expert context, the reply as the engine reads
    it) -> `decision_reward` against the context's expert action, with this suite's tools and the framework's
    actions."""
    tools, names = tuple(available_tools), tuple(actions)
    return lambda context, text: decision_reward(text, context.reference, tools, names)["reward"]
