"""The scripted judge on real expert decisions (each blind spot and slip is attributed, with the
right correction), on what it must not attribute, through the backend interface, and
``follow_hint``."""

import asyncio
import collections
import dataclasses
import re

import pytest

from porch_jax.attribution.grm import AttributionUnit, grm_request, parse_reply
from porch_jax.attribution.judge import ScriptedJudge, follow_hint, judge, known_facts
from porch_jax.backends import ScriptedBackend
from porch_jax.envs.workplace import ExpertConfig, TaskMixture, make_tasks
from porch_jax.eval import suite as suite_lib
from porch_jax.eval.suite import SuiteConfig
from porch_jax.protocol import render_call

SUITE = SuiteConfig(
    max_decisions=20,
    max_evidence_chars=160,
    expert=ExpertConfig(p_omit_context=0.1, p_omit_tool=0.1, p_misscope=0.1, p_underbudget=0.1),
)


@pytest.fixture(scope="module")
def judged():
    """(decision, attribution) for every decision of 80 expert episodes (notifications included)."""
    engine = suite_lib.expert_engine(SUITE)
    tasks = make_tasks(80, TaskMixture(slack=(1, 3)))

    async def run():
        return [await engine.run(t, episode_id=t.task_id) for t in tasks]

    return [(d, judge(AttributionUnit.of(d))) for ep in asyncio.run(run()) for d in ep.decisions]


def _kind(hint: str) -> str:
    return re.sub(r"'.*'|\d+", "X", hint)


def test_blind_spots_and_slips_get_their_corrections(judged):
    kinds = collections.Counter(_kind(a.hint) for _, a in judged if a.attributable)
    assert {"add archive to tools", "add X to context", "set budget to X", "set subgoal to X"} <= set(kinds)
    for d, a in judged:
        if not a.attributable:
            continue
        fixed = follow_hint(d.action, a.hint)
        if fixed is None:  # a revise that does not set the field the hint adds to
            assert d.action["name"] == "revise" and a.hint.startswith("add ")
            continue
        if a.hint == "add archive to tools":
            assert "no " in d.feedback and "figure on the current page" in d.feedback
            assert "archive" in fixed["arguments"]["tools"]
        elif a.hint.startswith("add '"):  # the fact was in an earlier result, with this exact value
            key, value = re.fullmatch(r"add '(.+?): (.+)' to context", a.hint).groups()
            assert known_facts(d.context)[key] == value and "result: " in str(d.context)
            assert key not in " ".join(d.action["arguments"].get("context", []))
        elif a.hint.startswith("set budget to "):
            extra = int(re.search(r"budget add: \+(\d+)", d.feedback)[1])
            _, budget = map(int, re.search(r"(\d+)/(\d+) steps\]", d.feedback).groups())
            assert int(a.hint.split()[-1]) == budget + extra
        elif a.hint.startswith("set subgoal to "):
            clause = a.hint[len("set subgoal to '") : -1]
            assert clause.startswith(d.action["arguments"]["subgoal"] + " ") and clause in d.context[1]["content"]


def test_not_attributable(judged):
    for d, a in judged:
        fb = d.feedback
        if "status: user change" in fb or d.action is None or d.action["name"] in ("finish", "stop"):
            assert not a.attributable and a.hint == "", (d.action_text, fb)
        if "status: done" in fb and "request:" not in fb:
            assert not a.attributable
    user_changes = [d for d, _ in judged if "status: user change" in d.feedback]
    assert user_changes  # the fixture does exercise notifications


def test_a_fact_never_seen_is_not_attributable():
    unit = AttributionUnit(
        ({"role": "user", "content": "Task: 1) find phone of Ana Kaya 2) text Ana Kaya the door code"},),
        render_call(
            {
                "name": "delegate",
                "arguments": {
                    "subgoal": "text Ana Kaya the door code",
                    "context": [],
                    "tools": ["messaging"],
                    "budget": 4,
                },
            }
        ),
        (),
        "[agent 0 v0 revise 1/4 steps]\nstatus: blocked: missing context 'door code'; step 1/4\n"
        "request: context add: door code",
    )
    assert not judge(unit).attributable
    seen = AttributionUnit(
        unit.context
        + ({"role": "user", "content": "[agent 0 v0 submit 3/4 steps]\nresult: door code: 4411\nstatus: done"},),
        *list(vars(unit).values())[1:],
    )
    assert judge(seen).hint == "add 'door code: 4411' to context"


def _history_first_delegations(blind_rate):
    """(archive granted, attribution) of each first delegation of a history clause ("find X of Y in YEAR")."""
    suite = dataclasses.replace(SUITE, expert=dataclasses.replace(SUITE.expert, p_omit_tool=0.0, blind_rate=blind_rate))
    engine = suite_lib.expert_engine(suite)
    tasks = make_tasks(40, TaskMixture(templates={"history": 1.0}, slack=(1, 2)))

    async def run():
        return [await engine.run(t, episode_id=t.task_id) for t in tasks]

    out = []
    for ep in asyncio.run(run()):
        d = next(d for d in ep.decisions if d.action["name"] == "delegate")
        assert re.search(r" in \d{4}$", d.action["arguments"]["subgoal"])
        out.append(("archive" in d.action["arguments"]["tools"], judge(AttributionUnit.of(d))))
    return out


def test_blind_rate_makes_a_blind_spot_act_on_part_of_the_decisions_and_the_judge_flags_those():
    always = _history_first_delegations(1.0)
    assert not any(granted for granted, _ in always)  # the default: the blind spot always acts
    part = _history_first_delegations(0.5)
    granted = [g for g, _ in part]
    assert 0.25 < sum(granted) / len(granted) < 0.75  # the expert sometimes demonstrates the fix
    assert part == _history_first_delegations(0.5)  # drawn per seed: deterministic
    flagged = [g for g, a in part if a.hint == "add archive to tools"]
    assert flagged and not any(flagged)  # the judge flags blind decisions only
    assert all(g for g, _ in _history_first_delegations(0.0))
    assert all(g for g, _ in _history_first_delegations({"archive": 0.0}))  # a rate per blind spot
    assert not any(g for g, _ in _history_first_delegations({"long_file": 0.0}))  # the others: always blind
    with pytest.raises(ValueError):
        suite_lib.expert_engine(dataclasses.replace(SUITE, expert=ExpertConfig(blind_rate=1.5)))
    with pytest.raises(ValueError):
        suite_lib.expert_engine(dataclasses.replace(SUITE, expert=ExpertConfig(blind_rate={"archives": 0.5})))


def test_through_the_backend_interface(judged):
    backend = ScriptedBackend(ScriptedJudge())
    d, a = next((d, a) for d, a in judged if a.attributable)
    reply = asyncio.run(backend.chat(grm_request(AttributionUnit.of(d))))
    assert parse_reply(reply.text) == a


@pytest.mark.parametrize(
    "call, hint, expected",
    [
        (
            {
                "name": "delegate",
                "arguments": {"subgoal": "s", "context": [], "tools": ["search", "extract"], "budget": 5},
            },
            "add archive to tools",
            {"tools": ["archive", "extract", "search"]},
        ),
        (
            {"name": "delegate", "arguments": {"subgoal": "s", "context": ["z: 1"], "tools": [], "budget": 5}},
            "add 'door code: 4411' to context",
            {"context": ["door code: 4411", "z: 1"]},
        ),
        (
            {"name": "delegate", "arguments": {"subgoal": "s", "context": [], "tools": [], "budget": 4}},
            "set budget to 7",
            {"budget": 7},
        ),
        (
            {"name": "revise", "arguments": {"agent_id": 1, "budget": 4}},
            "set subgoal to 'find phone of Ana Kaya'",
            {"subgoal": "find phone of Ana Kaya"},
        ),
    ],
)
def test_follow_hint(call, hint, expected):
    out = follow_hint(call, hint)
    assert out["name"] == call["name"] and out["arguments"] == {**call["arguments"], **expected}
    assert call["arguments"] != out["arguments"]  # the input is not mutated


@pytest.mark.parametrize(
    "call, hint",
    [
        ({"name": "revise", "arguments": {"agent_id": 1, "budget": 4}}, "add archive to tools"),  # would drop tools
        ({"name": "finish", "arguments": {"answer": "x"}}, "set budget to 3"),
        ({"name": "delegate", "arguments": {"subgoal": "s", "context": [], "tools": [], "budget": 4}}, "be smarter"),
    ],
)
def test_follow_hint_declines(call, hint):
    assert follow_hint(call, hint) is None
