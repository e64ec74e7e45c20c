"""The real model's own nonsense: SmolLM2-135M-Instruct's replies at temperatures 1.5 (word salad) and 0.7 (bad
imitations of the protocol) to the engine's real contexts (tests/fixtures/smollm2_replies.jsonl, sampled once by
scripts/sample_smollm2_replies.py; no server here), and mutations of them, through the parser and the engine.

Every reply parses to an action or to a ProtocolError of a known kind; a mutated one too (truncated, braces and
quotes dropped or doubled, the closing tag cut, an unknown tool, empty, unicode noise, huge); and an episode fed such
replies in both roles never raises, counts each invalid reply under its kind, feeds the error back to the model and
charges the decision or step to the budget.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from porch_jax.backends import ChatRequest, ScriptedBackend
from porch_jax.envs.workplace import TOOLS, WorkplaceEnv, make_tasks
from porch_jax.protocol import (
    COMM_ACTIONS,
    INVALID_KINDS,
    PROTOCOL_ERRORS,
    REVISABLE_FIELDS,
    Delegate,
    EmptyReply,
    Finish,
    Harness,
    Message,
    ProtocolError,
    Revise,
    ReviseRequest,
    Stop,
    StopRequest,
    Submit,
    ToolCall,
    ToolNotAllowed,
    Truncated,
    UnclosedToolCall,
    UnknownAction,
    parse_orchestrator_action,
    parse_subagent_action,
    render_action,
)
from porch_jax.rollout import Budgets, Engine, EngineConfig, system_config

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "smollm2_replies.jsonl"
ROWS = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()]
BY_ROLE = {role: [r for r in ROWS if r["role"] == role] for role in ("orchestrator", "subagent")}
ENV_TOOLS = tuple(TOOLS)
MAX_CHARS = 300_000  # a mutated reply's cap (huge, yet a test run stays fast)
BOUNDED = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def env_tools(row: dict) -> list[str]:
    """The environment tools a sub-agent reply was sampled with (its schemas also listed the communication actions)."""
    return [t for t in row["tools"] if t not in COMM_ACTIONS]


def parse(
    role: str,
    text: str,
    *,
    truncated: bool = False,
    tools=ENV_TOOLS,
    live=None,
    revisable=REVISABLE_FIELDS,
    comm=COMM_ACTIONS,
):
    """The engine's parse for ``role`` with its checks: an action, or the ProtocolError it raised."""
    try:
        if role == "orchestrator":
            return parse_orchestrator_action(
                text, truncated=truncated, available_tools=ENV_TOOLS, agent_ids=live, revisable=revisable
            )
        return parse_subagent_action(text, tools, comm, truncated=truncated)
    except ProtocolError as e:
        return e


def kind_of(outcome) -> str:
    return type(outcome).__name__ if isinstance(outcome, ProtocolError) else "valid"


def check_error(outcome) -> None:
    """A parse failure is one of the documented classes, and its observation names its kind and stays short."""
    if isinstance(outcome, ProtocolError):
        assert type(outcome) in PROTOCOL_ERRORS, type(outcome)
        assert outcome.observation.startswith(f"Error ({outcome.kind}): ") and len(outcome.observation) < 500


# ---- (a) the fixture as sampled ------------------------------------------------------------------------------------


def test_the_fixture_is_what_the_script_wrote():
    assert 400 <= len(ROWS) <= 600 and FIXTURE.stat().st_size < 2**20
    cells = {(r["role"], r["few_shot"], r["temperature"]) for r in ROWS}
    assert cells == {(a, b, t) for a in BY_ROLE for b in (False, True) for t in (1.5, 0.7)}
    assert {r["finish_reason"] for r in ROWS} <= {"stop", "length"}
    assert all(set(COMM_ACTIONS) <= set(r["tools"]) for r in BY_ROLE["subagent"])  # a harness may grant no tool


def test_every_sampled_reply_parses_to_an_action_or_a_known_kind():
    table: Counter[tuple[str, float, str, str]] = Counter()
    for row in ROWS:
        cut = row["finish_reason"] == "length"
        tools = env_tools(row) if row["role"] == "subagent" else ENV_TOOLS
        outcome = parse(row["role"], row["text"], truncated=cut, tools=tools)
        check_error(outcome)
        kind = kind_of(outcome)
        assert kind == "valid" or kind in INVALID_KINDS
        assert (kind == "Truncated") <= cut  # only a reply the token limit cut is Truncated
        # what the cut hides: the same text read as if the model had stopped there itself
        uncut = kind_of(parse(row["role"], row["text"], tools=tools)) if cut else kind
        assert uncut != "Truncated"
        table[row["role"], row["temperature"], kind, uncut] += 1
    print("\nSmolLM2 replies (role, temperature, kind, kind had the token limit not cut it): count")
    for key, n in sorted(table.items()):
        print(f"  {key}: {n}")
    kinds = {k for _, _, k, _ in table} | {k for _, _, _, k in table}
    assert len(kinds - {"valid"}) >= 3, kinds  # the model's nonsense comes in several kinds
    assert {"Truncated", "NoToolCall", "UnclosedToolCall"} <= kinds, kinds


# ---- (b) mutated replies through the parser --------------------------------------------------------------------------

_NOISE = st.text(st.characters(codec="utf-8"), min_size=1, max_size=8) | st.sampled_from(
    ["\u2028", "\x00", "\ufeff", "🙂", "漢字", "\\u003c", "\\", "\u202e", "\U0010ffff", "</tool_call>", "<think>"]
)
_SYNTAX = st.sampled_from(list("{}[]\"':,"))


@st.composite
def mutated(draw, text: str) -> str:
    """``text`` after one to three random mutations of the kinds a sampled reply shows (and worse)."""
    for _ in range(draw(st.integers(1, 3))):
        op = draw(
            st.sampled_from(
                ["truncate", "drop", "duplicate", "insert", "cut_close", "rename", "empty", "noise", "huge", "double"]
            )
        )
        at = draw(st.integers(0, len(text)))
        if op == "truncate":
            text = text[:at]
        elif op in ("drop", "duplicate"):
            spots = [i for i, c in enumerate(text) if c in "{}[]\"'"] or [None]
            i = draw(st.sampled_from(spots))
            if i is not None:
                text = text[:i] + (text[i] * 2 if op == "duplicate" else "") + text[i + 1 :]
        elif op == "insert":
            text = text[:at] + draw(_SYNTAX) + text[at:]
        elif op == "cut_close":
            text = text.replace("</tool_call>", "", 1) + draw(st.sampled_from(["", " ok", "\n}", "</tool_"]))
        elif op == "rename":
            name = draw(st.from_regex(r"[a-z_]{1,12}", fullmatch=True))
            named = f'"name": {json.dumps(name)}'
            text = re.sub(r'"name":\s*"[^"]*"', lambda _, named=named: named, text, count=1)
        elif op == "empty":
            text = draw(st.sampled_from(["", " ", "\n\n", "\t "]))
        elif op == "noise":
            text = text[:at] + draw(_NOISE) + text[at:]
        elif op == "huge":
            text = text * draw(st.integers(50, 400)) + "x" * draw(st.integers(0, 50_000))
        else:
            text = text + text
        text = text[:MAX_CHARS]
    return text


def _plain(text: str) -> bool:
    """Prose with no markup the parser reads (so a call after it is the only one)."""
    return not any(tag in text for tag in ("<tool_call", "</tool_call", "<think", "</think", '"name"'))


def _valid(role: str):
    """Well-formed replies to mutate (the model seldom writes one itself): each action of the role, sometimes after
    the model's own prose."""
    tool = st.sampled_from(ENV_TOOLS)
    if role == "orchestrator":
        actions = st.one_of(
            st.builds(lambda t, b: Delegate(Harness("find the venue", ("a fact",), (t,), b)), tool, st.integers(1, 9)),
            st.builds(lambda i: Revise(i, tools=("contacts",), budget=3, note="use contacts"), st.integers(0, 3)),
            st.builds(lambda i: Stop(i, "stuck"), st.integers(0, 3)),
            st.just(Finish("42")),
        )
    else:
        actions = st.one_of(
            st.builds(lambda t: ToolCall(t, {"query": "order 17"}), tool),
            st.just(Submit("order 17: shipped", Message(status="done", evidence=("status=shipped",)))),
            st.just(ReviseRequest(Message(status="blocked"))),
            st.just(StopRequest(Message(status="no way"))),
        )
    prose = st.sampled_from([""] + [p for p in (r["text"][:60] for r in BY_ROLE[role]) if _plain(p)][:20])
    return st.builds(lambda p, a: p + render_action(a), prose, actions)


def replies(role: str):
    """A reply of ``role`` with whether the token limit cut it: a sampled one as the model wrote it (with its finish
    reason), or a sampled or well-formed one mutated (cut or not at random)."""
    sampled = st.sampled_from([(r["text"], r["finish_reason"] == "length") for r in BY_ROLE[role]])
    base = st.sampled_from([r["text"] for r in BY_ROLE[role]]) | _valid(role)
    return sampled | st.tuples(base.flatmap(mutated), st.booleans())


@BOUNDED
@given(reply=replies("orchestrator"), live=st.none() | st.lists(st.integers(0, 3), max_size=3).map(tuple))
def test_a_mutated_orchestrator_reply_fails_only_with_a_protocol_error(reply, live):
    text, cut = reply
    check_error(parse("orchestrator", text, truncated=cut, live=live))


@BOUNDED
@given(reply=replies("subagent"), row=st.sampled_from(BY_ROLE["subagent"]))
def test_a_mutated_subagent_reply_fails_only_with_a_protocol_error(reply, row):
    text, cut = reply
    check_error(parse("subagent", text, truncated=cut, tools=env_tools(row)))


@BOUNDED
@given(role=st.sampled_from(["orchestrator", "subagent"]), data=st.data())
def test_each_kind_of_damage_to_a_valid_call_has_its_kind(role, data):
    text = data.draw(_valid(role))
    assert kind_of(parse(role, text)) == "valid"
    start = text.index("<tool_call>") + len("<tool_call>")
    end = text.index("</tool_call>")
    # the closing tag never written: read to the end like vLLM; with more after it, an unclosed call
    assert kind_of(parse(role, text[:end])) == "valid"
    assert isinstance(parse(role, text[:end] + " then I will"), UnclosedToolCall)
    # cut inside the JSON: an unclosed call, or Truncated when the token limit did the cutting
    body_end = text.rindex("}", start, end)
    at = data.draw(st.integers(start + 1, body_end))
    assert isinstance(parse(role, text[:at]), UnclosedToolCall)
    assert isinstance(parse(role, text[:at], truncated=True), Truncated)
    # a name that is no action and no tool
    unknown = re.sub(r'"name": "[^"]*"', '"name": "teleport"', text, count=1)
    assert isinstance(parse(role, unknown), UnknownAction if role == "orchestrator" else ToolNotAllowed)
    # nothing at all
    assert isinstance(
        parse(role, data.draw(st.sampled_from(["", "  ", "\n"])), truncated=data.draw(st.booleans())), EmptyReply
    )


# ---- (c) mutated replies through the engine --------------------------------------------------------------------------


class Replay:
    """A scripted backend serving drawn replies (text, finish_reason) in order, then ``fallback``; it keeps every
    request and the reply it got."""

    def __init__(self, replies: list[tuple[str, bool]], fallback: str):
        self.replies, self.fallback, self.served = list(replies), fallback, []
        self.inner = ScriptedBackend(self._next)

    def _next(self, request: ChatRequest) -> str:
        text, cut = self.replies.pop(0) if self.replies else (self.fallback, False)
        self.served.append((request, text, cut))
        return text

    async def chat(self, request: ChatRequest):
        result = await self.inner.chat(request)
        return dataclasses.replace(result, finish_reason="length" if self.served[-1][2] else "stop")


def _count(messages: list[dict], content: str) -> int:
    return sum(m["role"] == "user" and m["content"].startswith(content) for m in messages)


TASKS = make_tasks(3)
DELEGATE = render_action(Delegate(Harness("find the venue", (), ("calendar", "contacts"), 3)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    orchestrator=st.tuples(
        st.sampled_from([[], [(DELEGATE, False)]]),  # half the episodes start a sub-agent for sure
        st.lists(replies("orchestrator") | _valid("orchestrator").map(lambda t: (t, False)), max_size=6),
    ).map(lambda parts: parts[0] + parts[1]),
    subagent=st.lists(replies("subagent"), max_size=8),
    system=st.sampled_from(["proactive", "lifecycle", "react"]),
    few_shot=st.booleans(),
    task=st.sampled_from(TASKS),
)
def test_an_episode_of_mutated_replies_never_raises_and_counts_each_kind(
    orchestrator, subagent, system, few_shot, task
):
    orch = Replay(orchestrator, render_action(Finish("done")))
    sub = Replay(subagent, render_action(Submit("done")))
    config = system_config(system, EngineConfig(budgets=Budgets(6, 2, 3), max_decisions=5, few_shot=few_shot))
    record = asyncio.run(Engine(WorkplaceEnv, orch, sub, config).run(task, episode_id="nonsense"))
    meta = record.meta

    # every reply re-parsed with the checks the engine applied: the kinds it counted, and nothing else
    expected = {"orchestrator": Counter(), "subagent": Counter()}
    for role, backend in (("orchestrator", orch), ("subagent", sub)):
        for i, (request, text, cut) in enumerate(backend.served):
            view = request.state
            if role == "orchestrator":
                outcome = parse(role, text, truncated=cut, live=view.live, revisable=view.revisable)
            else:
                outcome = parse(role, text, truncated=cut, tools=view.harness.tools, comm=view.comm)
            check_error(outcome)
            if not isinstance(outcome, ProtocolError):
                continue
            expected[role][type(outcome).__name__] += 1
            # the error goes back to the model: the same role's next request (the same sub-agent's) carries it
            same = [
                r for r, _, _ in backend.served[i + 1 :] if role == "orchestrator" or r.state.agent_id == view.agent_id
            ]
            if same:
                assert _count(same[0].messages, outcome.observation) > _count(request.messages, outcome.observation)
    for role in ("orchestrator", "subagent"):
        assert meta["invalid_kinds"][role] == dict(expected[role]), role
        assert sum(meta["invalid_kinds"][role].values()) == meta["invalid"][role]
        assert set(meta["invalid_kinds"][role]) <= set(INVALID_KINDS)
    assert meta["backend_errors"] == {"orchestrator": 0, "subagent": 0}
    event(f"sub-agent steps: {'some' if sub.served else 'none'}")
    for role in expected:
        for kind in expected[role]:
            event(f"{role}: {kind}")

    # each decision and each sub-agent step is charged, valid or not
    assert len(record.decisions) == len(orch.served) <= config.max_decisions
    assert meta["steps"] == len(sub.served) <= meta["total_budget"]
    for decision, (_, text, _) in zip(record.decisions, orch.served, strict=True):
        assert decision.action_text == text
        assert (decision.action is None) == (decision.parse_error is not None)
        if decision.parse_error is not None:
            assert decision.feedback.startswith(decision.parse_error)


@pytest.mark.parametrize("cut", [False, True])
def test_a_cut_reply_is_counted_as_truncated_by_the_engine(cut):
    text = '<tool_call>\n{"name": "delegate", "arguments": {"subgoal": "find the venue of'
    orch = Replay([(text, cut)], render_action(Finish("done")))
    record = asyncio.run(Engine(WorkplaceEnv, orch, Replay([], "")).run(TASKS[0]))
    kind = "Truncated" if cut else "UnclosedToolCall"
    assert record.meta["invalid_kinds"]["orchestrator"] == {kind: 1}
    assert record.decisions[0].parse_error.startswith(f"Error ({'truncated' if cut else 'unclosed_tool_call'})")
    assert orch.served[1][0].messages[-1]["content"].startswith(record.decisions[0].parse_error)
