"""Hypothesis strategies for protocol values: arbitrary unicode, quotes, newlines and tag-like text."""

from hypothesis import strategies as st

from porch_jax.protocol import (
    COMM_ACTIONS,
    Delegate,
    Finish,
    Harness,
    Message,
    Request,
    RequestTarget,
    Revise,
    ReviseRequest,
    Stop,
    StopRequest,
    Submit,
    ToolCall,
)

# Text that likes to break parsers: JSON syntax, quotes, escapes, newlines and the call/think tags.
_NASTY = st.sampled_from(
    [
        '"',
        "'",
        "\\",
        "\n",
        "{",
        "}",
        "[",
        "<tool_call>",
        "</tool_call>",
        "<think>",
        "</think>",
        "\\u003c",
        "é",
        "漢",
        "\u2028",
        "\x00",
        "🙂",
    ]
)
text = st.lists(st.one_of(st.text(max_size=12), _NASTY), max_size=5).map("".join)
texts = st.lists(text, max_size=4).map(tuple)
names = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True).filter(lambda n: n not in COMM_ACTIONS)
ids = st.integers(min_value=0, max_value=2**40)
budgets = st.integers(min_value=1, max_value=10**6)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)

harnesses = st.builds(Harness, text, texts, st.lists(names, max_size=4).map(tuple), budgets)
requests = st.builds(Request, st.sampled_from(list(RequestTarget)), text, text)
messages = st.builds(Message, st.none() | text, st.none() | requests, texts)

orchestrator_actions = st.one_of(
    st.builds(Delegate, harnesses),
    st.builds(
        Revise,
        ids,
        st.none() | text,
        st.none() | texts,
        st.none() | st.lists(names, max_size=3).map(tuple),
        st.none() | budgets,
        text,
    ),
    st.builds(Stop, ids, text),
    st.builds(Finish, text),
)
subagent_actions = st.one_of(
    st.builds(ToolCall, names, st.dictionaries(text, json_values, max_size=4)),
    st.builds(Submit, text, messages),
    st.builds(ReviseRequest, messages),
    st.builds(StopRequest, messages),
)
