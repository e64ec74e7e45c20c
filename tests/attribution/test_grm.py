"""The GRM reply parser (valid and malformed replies), the I_GRM prompt, the teacher context."""

import pytest

from porch_jax.attribution.grm import (
    HINT_PREFIX,
    Attribution,
    AttributionUnit,
    GRMReplyError,
    format_reply,
    grm_messages,
    parse_reply,
    teacher_context,
)
from porch_jax.trajectories import SubStep


@pytest.mark.parametrize(
    "text, expected",
    [
        ("FLAG: true\nHINT: add archive to tools", Attribution(True, "add archive to tools")),
        ("FLAG: false\nHINT:", Attribution(False)),
        ("FLAG: false", Attribution(False)),
        ("FLAG: False\nHINT: none", Attribution(False)),
        ("flag = TRUE\nhint: set budget to 7", Attribution(True, "set budget to 7")),
        ("**FLAG**: true\n**HINT**: add 'k: v' to context", Attribution(True, "add 'k: v' to context")),
        (
            "<think>the archive tool was missing</think>\nFLAG: true\nHINT: add archive to tools",
            Attribution(True, "add archive to tools"),
        ),
        (
            "Judgement below.\nFLAG: true\nHINT: grant archive;\nthe page had no 2014 figure",
            Attribution(True, "grant archive;\nthe page had no 2014 figure"),
        ),
        ("HINT: set budget to 5\nFLAG: true", Attribution(True, "set budget to 5")),
    ],
)
def test_valid_replies(text, expected):
    assert parse_reply(text) == expected


@pytest.mark.parametrize(
    "text, kind",
    [
        ("", "no_flag"),
        ("HINT: add archive to tools", "no_flag"),
        ("The decision was fine.", "no_flag"),
        ("FLAG: maybe\nHINT: x", "bad_flag"),
        ("FLAG: 1", "bad_flag"),
        ("FLAG:\nHINT: x", "bad_flag"),
        ("FLAG: true\nFLAG: false", "duplicate_flag"),
        ("FLAG: true", "missing_hint"),
        ("FLAG: true\nHINT:   ", "missing_hint"),
        ("FLAG: true\nHINT: none", "missing_hint"),
        ("FLAG: false\nHINT: add archive to tools", "unexpected_hint"),
        ("HINT: a\nHINT: b\nFLAG: true", "duplicate_hint"),
        ("<think>FLAG: true", "no_flag"),  # an unclosed think block hides everything after it
    ],
)
def test_malformed_replies_raise_typed_errors(text, kind):
    with pytest.raises(GRMReplyError) as e:
        parse_reply(text)
    assert e.value.kind == kind and kind in str(e.value)


def test_non_text_reply_is_a_typed_error():
    with pytest.raises(GRMReplyError):
        parse_reply(None)  # type: ignore[arg-type]


def test_format_and_parse_round_trip():
    for a in (Attribution(True, "set subgoal to 'find phone of Ana Kaya'"), Attribution(False)):
        assert parse_reply(format_reply(a)) == a
    with pytest.raises(ValueError):
        Attribution(True, "")
    with pytest.raises(ValueError):
        Attribution(False, "add x to tools")


def test_prompt_holds_state_decision_segment_and_feedback():
    unit = AttributionUnit(
        ({"role": "system", "content": "Orchestrate."}, {"role": "user", "content": "Task: 1) find x"}),
        '<tool_call>\n{"name": "delegate", "arguments": {}}\n</tool_call>',
        (SubStep(0, 0, "tool", "search q", "search", "found wiki/X"), SubStep(0, 0, "comm", "revise", "revise")),
        "[agent 0 v0 revise 2/4 steps]\nrequest: tools add: archive",
    )
    system, user = grm_messages(unit)
    assert system["role"] == "system" and "FLAG" in system["content"] and "HINT" in system["content"]
    body = user["content"]
    for part in (
        "[user] Task: 1) find x",
        '"name": "delegate"',
        "1. agent 0 v0 tool: search q",
        "-> found wiki/X",
        "2. agent 0 v0 comm: revise",
        "request: tools add: archive",
    ):
        assert part in body
    assert body.index("Orchestration state") < body.index("Decision") < body.index("Sub-agent") < body.index("Feedback")


def test_teacher_context_appends_the_hint_and_leaves_the_stored_context_alone():
    context = [{"role": "system", "content": "s"}, {"role": "user", "content": "Task: t"}]
    teacher = teacher_context(context, " add archive to tools ")
    assert teacher[:2] == context and len(context) == 2
    assert teacher[2] == {"role": "user", "content": HINT_PREFIX + "add archive to tools"}
    assert teacher_context(context, "")[2] == {"role": "user", "content": HINT_PREFIX.strip()}
