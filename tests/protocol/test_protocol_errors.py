"""Typed parse errors, checks, schemas and the compact renderers."""

import json

import pytest

from porch_jax.protocol import (
    BadArguments,
    Delegate,
    EmptyReply,
    FeedbackView,
    Harness,
    MalformedJSON,
    Message,
    MultipleToolCalls,
    NoToolCall,
    Request,
    RequestTarget,
    Revise,
    ReviseRequest,
    Stop,
    Submit,
    ToolNotAllowed,
    Truncated,
    UnclosedToolCall,
    UnknownAction,
    comm_feedback,
    harness_update_text,
    orchestrator_system_prompt,
    orchestrator_tool_schemas,
    parse_orchestrator_action,
    parse_subagent_action,
    render_action,
    subagent_messages,
    subagent_tool_schemas,
)


def call(name, **arguments):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.mark.parametrize(
    "text,error",
    [
        ("I will finish now.", NoToolCall),
        ("", EmptyReply),
        (" \n\t", EmptyReply),
        ('<tool_call>\n{"name": "finish", "arguments": {"answer": "4', UnclosedToolCall),
        ('<tool_call>{"name": "finish", "arguments": {"answer": "4"}} and then I', UnclosedToolCall),
        ("<think>" + call("finish", answer="x"), NoToolCall),  # an unclosed think block eats the call
        (call("finish", answer="a") + call("finish", answer="b"), MultipleToolCalls),
        ("<tool_call>{'name': 'finish'}</tool_call>", MalformedJSON),
        ('<tool_call>["finish"]</tool_call>', MalformedJSON),
        ('<tool_call>{"name": "finish", "arguments": {"answer": "x"}, "id": 1}</tool_call>', MalformedJSON),
        (call("launch"), UnknownAction),
        (call("finish"), BadArguments),
        (call("finish", answer=3), BadArguments),
        (call("finish", answer="x", why="y"), BadArguments),
        (call("delegate", subgoal="s", context=[], tools=["t"], budget=0), BadArguments),
        (call("delegate", subgoal="s", context=[], tools=["t"], budget=True), BadArguments),
        (call("delegate", subgoal="s", context=[1], tools=["t"], budget=3), BadArguments),
        (call("stop", agent_id=-1), BadArguments),
    ],
)
def test_orchestrator_errors(text, error):
    with pytest.raises(error) as info:
        parse_orchestrator_action(text)
    assert info.value.kind in info.value.observation


def test_orchestrator_checks():
    with pytest.raises(ToolNotAllowed, match="archive"):
        parse_orchestrator_action(
            call("delegate", subgoal="s", context=[], tools=["archive"], budget=3), available_tools=["search"]
        )
    with pytest.raises(BadArguments, match="no live sub-agent 4"):
        parse_orchestrator_action(call("stop", agent_id=4), agent_ids=[0, 1])
    with pytest.raises(BadArguments, match="budget"):  # budget revisions ablated
        parse_orchestrator_action(call("revise", agent_id=0, budget=9), revisable=("subgoal", "tools"))
    assert parse_orchestrator_action(call("revise", agent_id=0, tools=["a"])) == Revise(0, tools=("a",))


def test_unclosed_call_at_end_is_read_like_vllm():
    text = '<tool_call>\n{"name": "finish", "arguments": {"answer": "42"}}'
    assert parse_orchestrator_action(text).answer == "42"
    assert parse_orchestrator_action(text, truncated=True).answer == "42"  # cut after a complete call: still read


def test_a_reply_cut_at_the_token_limit_is_truncated_when_no_complete_call_is_in_it():
    cut = '<tool_call>\n{"name": "finish", "arguments": {"answer": "4'
    for text in (cut, "Let me think about the task step by step and"):
        with pytest.raises(Truncated) as info:
            parse_orchestrator_action(text, truncated=True)
        assert "token limit" in info.value.observation and info.value.kind == "truncated"
    with pytest.raises(Truncated):
        parse_subagent_action(cut, ["search"], truncated=True)
    # what the cut did not cause keeps its own kind
    with pytest.raises(EmptyReply):
        parse_orchestrator_action("  ", truncated=True)
    with pytest.raises(MalformedJSON) as info:
        parse_orchestrator_action("<tool_call>{'name': 'finish'}</tool_call> and so", truncated=True)
    assert type(info.value) is MalformedJSON
    with pytest.raises(MultipleToolCalls):
        parse_orchestrator_action(call("finish", answer="a") + "<tool_call>{", truncated=True)
    with pytest.raises(UnknownAction):
        parse_orchestrator_action(call("launch") + " and more", truncated=True)


def test_lenient_forms():
    # a string where a list belongs, and OpenAI-style arguments-as-string
    a = parse_orchestrator_action(call("delegate", subgoal="s", context="one fact", tools="search", budget=2))
    assert a == Delegate(Harness("s", ("one fact",), ("search",), 2))
    text = '<tool_call>{"name": "finish", "arguments": "{\\"answer\\": \\"y\\"}"}</tool_call>'
    assert parse_orchestrator_action(text).answer == "y"
    # null for an optional argument means "not set"; for a required one it is an error
    assert parse_orchestrator_action(call("revise", agent_id=1, subgoal=None, budget=None)) == Revise(1)
    with pytest.raises(BadArguments, match="answer"):
        parse_orchestrator_action(call("finish", answer=None))


def test_subagent_errors():
    with pytest.raises(ToolNotAllowed, match="archive"):
        parse_subagent_action(call("archive", q="x"), ["search"])
    with pytest.raises(UnknownAction):  # lifecycle baseline: only submit
        parse_subagent_action(call("revise", status="blocked"), ["search"], comm=("submit",))
    with pytest.raises(BadArguments, match="target"):
        parse_subagent_action(call("revise", request={"target": "weather", "operation": "add"}), [])
    with pytest.raises(BadArguments, match="result"):
        parse_subagent_action(call("submit"), [])
    m = parse_subagent_action(call("revise", request={"target": "TOOLS", "operation": "add"}), [])
    assert m == ReviseRequest(Message(request=Request(RequestTarget.TOOLS, "add")))


def test_harness_versions():
    h = Harness("g", ["c"], ["t"], 5)
    assert h.context == ("c",) and h.version == 0
    h2 = Revise(0, tools=("t", "u"), budget=8).apply(h)
    assert (h2.tools, h2.budget, h2.subgoal, h2.version) == (("t", "u"), 8, "g", 1)
    with pytest.raises(ValueError):
        Delegate(h2)
    assert harness_update_text(h, h2, "use u") == "Harness revised v0->v1.\nTools: t, u\nBudget: 8 steps\nNote: use u"


def test_feedback_view_ablations():
    m = Message("stuck", Request(RequestTarget.TOOLS, "add", "archive"), ("search: no hits",))
    full = comm_feedback(2, ReviseRequest(m), version=1, steps_used=3, budget=10)
    assert full == (
        "[agent 2 v1 revise 3/10 steps]\nstatus: stuck\nrequest: tools add: archive\nevidence:\n> search: no hits"
    )
    for drop, gone in (("status", "stuck"), ("request", "archive"), ("evidence", "no hits")):
        shown = comm_feedback(2, ReviseRequest(m), view=FeedbackView(**{drop: False}))
        assert gone not in shown
    assert "result: 42" in comm_feedback(0, Submit("42", m))


def test_schemas_match_parser():
    names = [s["function"]["name"] for s in orchestrator_tool_schemas(["search"])]
    assert names == ["delegate", "revise", "stop", "finish"]
    revise = orchestrator_tool_schemas(revisable=("tools",))[1]["function"]["parameters"]["properties"]
    assert set(revise) == {"agent_id", "tools", "note"}
    env = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    assert [s["function"]["name"] for s in subagent_tool_schemas(env)] == ["search", "submit", "revise", "stop"]
    assert [s["function"]["name"] for s in subagent_tool_schemas(env, comm=("submit",))] == ["search", "submit"]
    with pytest.raises(ValueError, match="clash"):
        subagent_tool_schemas([{"type": "function", "function": {"name": "stop"}}])


def test_prompts_are_compact():
    h = Harness("Find the 1850 population of Greenland", ("Greenland is a Danish territory",), ("search",), 10)
    msgs = subagent_messages(h, [{"role": "assistant", "content": render_action(Stop(0))}])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant"]
    assert "proactive communication" in msgs[0]["content"]
    words = sum(len(m["content"].split()) for m in msgs) + len(orchestrator_system_prompt(["search"]).split())
    assert words < 200
