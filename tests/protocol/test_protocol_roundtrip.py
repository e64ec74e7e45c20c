"""render -> parse is the identity for every action; arbitrary text raises only ProtocolError."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from protocol_strategies import orchestrator_actions, subagent_actions, text

from porch_jax.protocol import (
    ProtocolError,
    ToolCall,
    extract_call,
    parse_orchestrator_action,
    parse_subagent_action,
    render_action,
    to_call,
)

_PREFIXES = st.sampled_from(["", "Sure.\n", "<think>\nplan: call it\n</think>\n\n", "ok </think>"])


def _allowed(action):
    return [action.name] if isinstance(action, ToolCall) else []


@settings(deadline=None)
@given(orchestrator_actions, _PREFIXES)
def test_orchestrator_roundtrip(action, prefix):
    assert parse_orchestrator_action(prefix + render_action(action)) == action


@settings(deadline=None)
@given(subagent_actions, _PREFIXES)
def test_subagent_roundtrip(action, prefix):
    assert parse_subagent_action(prefix + render_action(action), _allowed(action)) == action


@settings(deadline=None)
@given(orchestrator_actions)
def test_rendered_body_is_the_call_json(action):
    body = render_action(action).removeprefix("<tool_call>\n").removesuffix("\n</tool_call>")
    assert json.loads(body) == to_call(action)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        text,
        st.text(),
        st.binary().map(lambda b: b.decode("latin-1")),
        st.builds(lambda a, b: f"{a}<tool_call>{b}</tool_call>", text, text),
        st.builds(
            lambda a, b: f'<tool_call>{{"name": {json.dumps(a)}, "arguments": {b}}}',
            text,
            st.sampled_from(["{}", "[]", '"x"', "null", '{"agent_id": true}', '{"budget": 1e999}']),
        ),
    )
)
def test_arbitrary_text_raises_only_protocol_errors(s):
    for parse in (
        lambda t: parse_orchestrator_action(t, agent_ids=[0], available_tools=["a"]),
        lambda t: parse_subagent_action(t, ["a", ""]),
        extract_call,
    ):
        try:
            parse(s)
        except ProtocolError as e:
            assert isinstance(e.observation, str) and e.observation
