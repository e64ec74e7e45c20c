"""Trajectory record schema (versioned): the contract between rollout and training.

One ``EpisodeRecord`` per JSONL line. ``from_dict`` checks every field's presence and type and
raises ``RecordError`` naming the field path (e.g. ``decisions[2].segment[0].kind``), so a bad
record fails loudly at load time instead of silently in a training batch.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, Union

SCHEMA_VERSION = 3
# Version 1 lacks the decisions' token provenance; it reads with token_source inferred (ids present: "sampler").
# Versions 1 and 2 lack ``outcome.retryable``; their outcomes read as finished (retryable False).
READABLE_VERSIONS = (1, 2, 3)
TokenSource = Literal["sampler", "server", "none"]  # backends.base.TOKEN_SOURCES
DecisionKey = tuple[str, int]  # (episode_id, decision index): how attribution rows and training rows name a decision

ROLES = ("orchestrator", "subagent")


class RecordError(ValueError):
    """A record that does not match the schema; names the file, line and field when known."""

    def __init__(self, message: str, *, field: str = "", path: str | None = None, line: int | None = None):
        self.message, self.field, self.path, self.line = message, field, path, line
        where = "".join([f"{path}:" if path else "", f"{line}: " if line is not None else (" " if path else "")])
        super().__init__(f"{where}{'field ' + repr(field) + ': ' if field else ''}{message}")

    def at(self, path: str, line: int) -> RecordError:
        return RecordError(self.message, field=self.field, path=path, line=line)


@dataclass
class Outcome:
    """How an episode ended. ``retryable``: the episode did not finish because its backend could not answer (every
    server down, stalled or overloaded past the retries; ``reason`` starts with "backend_unavailable: "), so the
    record is a placeholder, not a result: the store's ``read`` leaves it out and a resumed run plays the episode
    again. A finished episode, failed or not, has ``retryable`` False."""

    success: bool
    score: float
    reason: str
    retryable: bool = False


@dataclass
class RoleCost:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


SubStepKind = Literal["tool", "comm", "notification", "error"]


@dataclass
class SubStep:
    """One step of a sub-agent's execution segment between two orchestration decisions.

    ``text`` is what the sub-agent produced (its action text, or the notification); ``tool`` the
    tool or communication action name when there is one; ``observation`` what came back.
    """

    agent_id: int
    harness_version: int
    kind: SubStepKind
    text: str
    tool: str | None = None
    observation: str = ""


@dataclass
class DecisionRecord:
    """One orchestration decision: state (exact context), action, feedback, and the segment between.

    ``action_token_ids``/``action_logprobs`` are what the policy sampled (empty when the action
    was not sampled by a model, e.g. a scripted expert, or when the provider returns text only);
    ``token_source`` says which: "sampler" (our embedded sampler), "server" (the serving engine's
    own ids) or "none" (training tokenizes ``action_text`` and counts the row as re-tokenized).
    ``prompt_token_ids`` is the prompt as the server tokenized it, where it says (vLLM); training
    checks its own rendering of ``context`` against it. ``action`` is the parsed call
    ``{"name", "arguments"}`` or None with ``parse_error`` set.
    """

    index: int
    context: list[dict[str, Any]]
    action_text: str
    action_token_ids: list[int]
    action_logprobs: list[float]
    action: dict[str, Any] | None
    feedback: str
    agent_id: int | None = None
    segment: list[SubStep] = field(default_factory=list)
    parse_error: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    token_source: TokenSource = "none"
    prompt_token_ids: list[int] = field(default_factory=list)


@dataclass(kw_only=True)
class EpisodeRecord:
    """One episode. Keyword-only, so a positional call in some other field order fails loudly."""

    episode_id: str
    task_id: str
    env: str
    system: str
    config_hash: str
    seed: int
    outcome: Outcome
    cost: dict[str, RoleCost] = field(default_factory=dict)
    decisions: list[DecisionRecord] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> EpisodeRecord:
        """Validate and build; raises RecordError naming the offending field."""
        if not isinstance(d, dict):
            raise RecordError(f"expected a JSON object, got {type(d).__name__}")
        version = d.get("schema_version")
        if type(version) is not int or version not in READABLE_VERSIONS:  # True == 1, so the type first
            raise RecordError(
                f"unsupported schema_version {version!r} (this code reads {', '.join(map(str, READABLE_VERSIONS))})",
                field="schema_version",
            )
        if version == 1:
            for i, decision in enumerate(d.get("decisions") or ()):
                for name in ("token_source", "prompt_token_ids"):
                    if isinstance(decision, dict) and name in decision:
                        raise RecordError("not a field of schema_version 1", field=f"decisions[{i}].{name}")
        if version < 3 and isinstance(d.get("outcome"), dict) and "retryable" in d["outcome"]:
            raise RecordError(f"not a field of schema_version {version}", field="outcome.retryable")
        record = _build(cls, d, "")
        if version == 1:
            for decision in record.decisions:
                decision.token_source = "sampler" if decision.action_token_ids else "none"
        record.schema_version = SCHEMA_VERSION
        return record


# ---- generic typed construction --------------------------------------------------------------------

T = TypeVar("T")
_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _build(cls: type[T], d: dict[str, Any], path: str) -> T:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise RecordError(f"unknown field(s) {unknown}", field=f"{path}{unknown[0]}")
    kwargs = {}
    for name, f in fields.items():
        fpath = f"{path}{name}"
        if name not in d:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise RecordError("missing", field=fpath)
            continue
        kwargs[name] = _convert(_hints(cls)[name], d[name], fpath)
    return cls(**kwargs)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(tp: Any, v: Any, path: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0] if len(inner) == 1 else Any, v, path)
    if tp is Any:
        return v
    if origin is Literal:
        if v not in args:
            raise RecordError(f"must be one of {list(args)}, got {v!r}", field=path)
        return v
    if origin is list:
        if not isinstance(v, list):
            raise RecordError(f"expected list, got {type(v).__name__}", field=path)
        return [_convert(args[0], x, f"{path}[{i}]") for i, x in enumerate(v)]
    if origin is dict:
        if not isinstance(v, dict):
            raise RecordError(f"expected object, got {type(v).__name__}", field=path)
        return {k: _convert(args[1], x, f"{path}.{k}") for k, x in v.items()}
    if dataclasses.is_dataclass(tp):
        if not isinstance(v, dict):
            raise RecordError(f"expected object, got {type(v).__name__}", field=path)
        return _build(tp, v, f"{path}.")
    ok = (
        isinstance(v, bool)
        if tp is bool
        else isinstance(v, (int, float)) and not isinstance(v, bool)
        if tp is float
        else isinstance(v, int) and not isinstance(v, bool)
        if tp is int
        else isinstance(v, tp)
    )
    if not ok:
        raise RecordError(f"expected {_type_name(tp)}, got {type(v).__name__}", field=path)
    return float(v) if tp is float else v
