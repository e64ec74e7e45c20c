"""The compact action-and-state language of the workplace miniature (envs.workplace.codec): stored
actions round-trip through it, contexts shrink to pointers, and a malformed action is a typed
invalid action in the engine, never a crash."""

from __future__ import annotations

import asyncio

import pytest

from porch_jax.backends import ChatResult
from porch_jax.envs.workplace import ExpertConfig, TaskMixture, codec, make_tasks
from porch_jax.eval import suite as suite_lib
from porch_jax.eval.policy import ViewBackend
from porch_jax.eval.suite import SuiteConfig
from porch_jax.protocol import render_call
from porch_jax.protocol.parse import extract_call

SUITE = SuiteConfig(
    max_decisions=12,
    max_evidence_chars=160,
    mixture=TaskMixture(templates={"history": 1.0, "mail_text": 1.0, "file_text": 1.0}),
    expert=ExpertConfig(blind_spots=("handover_2back", "archive", "long_file")),
)
TASK = {
    "role": "user",
    "content": "Task: 1) find desk number in mail from Deniz Berg 2) find phone of Ravi Lopez "
    "3) text Ravi Lopez the desk number (budget 13 steps, 5 agents)",
}
FEEDBACK = [
    {"role": "user", "content": "[agent 0 v0 submit 3/4 steps]\nresult: desk number: 6096\nstatus: done"},
    {"role": "user", "content": "[agent 1 v0 submit 3/4 steps]\nresult: phone of Ravi Lopez: +1-555-0318"},
]


def _delegate(subgoal):
    return {
        "role": "assistant",
        "content": render_call(
            {"name": "delegate", "arguments": {"subgoal": subgoal, "context": [], "tools": [], "budget": 1}}
        ),
    }


def _context():
    return [
        {"role": "system", "content": "rules"},
        TASK,
        _delegate("find desk number in mail from Deniz Berg"),
        FEEDBACK[0],
        _delegate("find phone of Ravi Lopez"),
        FEEDBACK[1],
    ]


def _expert_episodes(n=6, system="proactive"):
    engine = suite_lib.expert_engine(SUITE, system=system)
    tasks = make_tasks(n, SUITE.mixture, prefix="codec")

    async def run():
        return [await engine.run(t, episode_id=t.task_id) for t in tasks]

    return asyncio.run(run())


def test_context_becomes_short_state_with_pointers():
    view = codec.encode_context(_context())
    assert [m["role"] for m in view] == ["user", "assistant", "user", "assistant", "user"]
    assert view[0]["content"] == "c1 mail c2 phone c3 text steps 13"
    assert view[1]["content"] == "delegate c1 budget=1"
    assert view[2]["content"] == "a0 submit 3/4 r1 todo=c2,c3" and view[4]["content"] == "a1 submit 3/4 r2 todo=c3"
    blocked = "[agent 2 v0 revise 3/5 steps]\nstatus: blocked\nrequest: tools add: archive\nevidence:\n> no 2017 figure"
    assert codec.encode_feedback(blocked, codec.State()) == "a2 revise 3/5 req tools+archive"  # no task: no todo
    hinted = codec.encode_context(
        _context() + [{"role": "user", "content": "Hint: add 'desk number: 6096' to context"}]
    )
    assert hinted[-1]["content"] == "hint ctx+r1"


def test_action_decodes_to_full_call_against_context():
    call = codec.decode_call("delegate c3 ctx=r1,r2 tools=messaging budget=5", codec.state_of(_context()))
    assert call == {
        "name": "delegate",
        "arguments": {
            "subgoal": "text Ravi Lopez the desk number",
            "context": ["desk number: 6096", "phone of Ravi Lopez: +1-555-0318"],
            "tools": ["messaging"],
            "budget": 5,
        },
    }
    assert codec.encode_action(call, _context()) == "delegate c3 ctx=r1,r2 tools=messaging budget=5"
    assert codec.decode_call("finish done", codec.state_of(_context()))["arguments"] == {"answer": "done"}
    assert codec.decode_call("revise a2 ctx=- budget=7", codec.state_of(_context()))["arguments"] == {
        "agent_id": 2,
        "context": [],
        "budget": 7,
    }


@pytest.mark.parametrize("system", ["proactive", "lifecycle", "orchestra_o1", "skill_mas"])
def test_expert_actions_round_trip(system):
    n = joined = 0
    for ep in _expert_episodes(system=system):
        for d in ep.decisions:
            if d.action is None:
                continue
            dsl = codec.encode_action(d.action, d.context)
            back = extract_call(codec.decode_text(dsl, d.context))
            assert back["name"] == d.action["name"], dsl
            if d.action["name"] in ("delegate_all", "plan"):  # every subtask back, in order, with its harness
                joined += 1
                assert codec.encode_action(back, d.context) == dsl
                assert [(sorted(t["tools"]), t["budget"]) for t in back["arguments"]["subtasks"]] == [
                    (sorted(t["tools"]), t["budget"]) for t in d.action["arguments"]["subtasks"]
                ], dsl
            for key in ("context", "tools", "budget", "agent_id"):
                if key in d.action["arguments"] and key in back["arguments"]:
                    want, got = d.action["arguments"][key], back["arguments"][key]
                    assert (sorted(want) if isinstance(want, list) else want) == (
                        sorted(got) if isinstance(got, list) else got
                    ), (dsl, d.action)
            n += 1
    assert n > 10 and (joined > 0) == (system in ("orchestra_o1", "skill_mas"))


def test_joined_delegations_round_trip_and_their_feedback_tracks_each_agent():
    state = codec.state_of(_context())
    for verb in ("delegate_all", "plan"):
        dsl = f"{verb} c3 ctx=r1,r2 tools=messaging budget=5 ; c2 tools=contacts budget=2"
        call = codec.decode_call(dsl, state)
        assert call == {
            "name": verb,
            "arguments": {
                "subtasks": [
                    {
                        "subgoal": "text Ravi Lopez the desk number",
                        "context": ["desk number: 6096", "phone of Ravi Lopez: +1-555-0318"],
                        "tools": ["messaging"],
                        "budget": 5,
                    },
                    {"subgoal": "find phone of Ravi Lopez", "context": [], "tools": ["contacts"], "budget": 2},
                ]
            },
        }
        assert codec.encode_action(call, _context()) == dsl
        assert extract_call(codec.decode_text(dsl, _context())) == call
    # Orchestra-o1's joined feedback: each agent's report in order, each agent on the clause its subtask named; a
    # submit without a result leaves its clause to do
    joined = [
        TASK,
        {
            "role": "assistant",
            "content": render_call(codec.decode_call("delegate_all c1 budget=4 ; c2 budget=2", codec.state_of([TASK]))),
        },
        {
            "role": "user",
            "content": "[agent 0 v0 submit 3/4 steps]\nresult: desk number: 6096\nstatus: done\n"
            "[agent 1 v0 submit 2/2 steps]\nresult: (nothing)\nstatus: partial: budget ran out\n"
            "request: budget add: +2",
        },
    ]
    view = codec.encode_context(joined)
    assert view[1]["content"] == "delegate_all c1 budget=4 ; c2 budget=2"
    assert view[2]["content"] == "a0 submit 3/4 r1 ; a1 submit 2/2 req budget+2 todo=c2,c3"
    assert codec.state_of(joined).agents == {0: 0, 1: 1}


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "delegate c9 budget=3",
        "delegate c1 budget=x",
        "revise c1 budget=2",
        "finish r7",
        "stop",
        "fly a1",
        "delegate c1 ctx=r1 ctx=r1",
        "delegate c1 sub=c2",
        "delegate_all",
        "delegate_all c1 budget=2 ;",
        "plan c1 ; c9",
        "delegate_all a1 budget=2",
    ],
)
def test_malformed_action_is_an_invalid_action_not_a_crash(bad):
    with pytest.raises(codec.CodecError):
        codec.decode_call(bad, codec.state_of(_context()))
    assert codec.decode_text(bad, _context()) == bad  # reaches the engine as written


def test_engine_records_malformed_dsl_as_invalid_action():
    class Replies:
        def __init__(self):
            self.n = 0

        async def chat(self, request):
            self.n += 1
            return ChatResult(text="delegate c9 budget=3" if self.n == 1 else "finish done", token_ids=[1, 2])

    engine = suite_lib.engine(ViewBackend(Replies(), "dsl"), SUITE, name="dsl")
    task = make_tasks(1, SUITE.mixture, prefix="codec")[0]
    ep = asyncio.run(engine.run(task, episode_id="e"))
    assert ep.decisions[0].action is None and ep.decisions[0].parse_error
    assert ep.decisions[1].action == {"name": "finish", "arguments": {"answer": "done"}}
    view = codec.encode_context(ep.decisions[1].context)
    assert view[1]["content"] == "delegate c9 budget=3" and view[2]["content"] == "invalid"
    assert view[0]["content"].startswith("c1 ")


def test_tokenizer_over_the_language_spells_every_tool_one_way():
    from porch_jax.models.tiny import build_tokenizer

    tok = build_tokenizer(512, codec.corpus())
    for tool in ("archive", "extract", "search", "code", "files", "messaging"):
        assert f"={tool}" in tok.tokenize(f"delegate c1 tools={tool} budget=5")
        assert f",{tool}" in tok.tokenize(f"delegate c1 tools=archive,{tool} budget=5")
    assert tok.tokenize("delegate c1")[0] == "delegate"
