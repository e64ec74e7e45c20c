"""GAIA2 on ARE: tool schemas, the scripted oracle policies, and ARE's GAIA2 runner + judge offline.

The slow tests run ARE in its own venv (scripts/install_are.sh) on this project's GAIA2-format
scenarios (tests/fixtures/gaia2: a timed email, a task change mid-run, a conditional second turn)
and on the five tutorial scenarios ARE ships.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from fake_openai import FakeOpenAIServer, Step, reply_with

from porch_jax.backends.spec import EndpointSpec
from porch_jax.envs.are.client import INSTALL_HINT, are_python, run_gaia2
from porch_jax.envs.are.scripted import NOW_TOOL, WAIT_TOOL, PlanStep, ScriptedOracle, split_turn_text, turn_text
from porch_jax.envs.are.tools import json_type, subagent_tools, tool_schema
from porch_jax.envs.base import Feedback, MemoryItem, OrchestratorView, SubagentView, Turn
from porch_jax.protocol import (
    COMM_ACTIONS,
    SUBMIT,
    Delegate,
    DelegateAll,
    Finish,
    Harness,
    Message,
    Plan,
    RequestTarget,
    ReviseRequest,
    Submit,
    ToolCall,
    parse_orchestrator_action,
    parse_subagent_action,
)
from porch_jax.rollout import BASELINE_ACTIONS
from porch_jax.trajectories import TrajectoryStore

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gaia2"
TUTORIALS = (
    "scenario_tutorial",
    "scenario_apps_tutorial",
    "scenario_events_tutorial",
    "scenario_validation_tutorial",
    "scenario_find_image_file",
)
OURS = ("porch_task_change", "porch_timed_forward", "porch_two_turns")
needs_are = pytest.mark.skipif(are_python() is None, reason=f"ARE venv missing: `{INSTALL_HINT}`")


def _arg(name, arg_type, default=False):
    return SimpleNamespace(name=name, arg_type=arg_type, description=f"the {name}", has_default=default)


def test_are_argument_types_map_to_json_schema():
    assert json_type("str") == {"type": "string"}
    assert json_type("int | None") == {"type": "integer"}
    assert json_type("list[str] | None") == {"type": "array", "items": {"type": "string"}}
    assert json_type("Optional[float]") == {"type": "number"}
    assert json_type("dict[str, Any]") == {"type": "object"}


def test_app_tools_become_function_schemas_and_the_user_interface_is_not_a_subagent_tool():
    send = SimpleNamespace(
        _public_name="Mail__send",
        _public_description="Send.",
        app_name="Mail",
        args=[_arg("to", "list[str]"), _arg("cc", "list[str] | None", default=True)],
    )
    aui = SimpleNamespace(
        _public_name="AgentUserInterface__send_message_to_user",
        app_name="AgentUserInterface",
        _public_description="",
        args=[],
    )
    schema = tool_schema(send)["function"]
    assert schema["name"] == "Mail__send" and schema["parameters"]["required"] == ["to"]
    assert schema["parameters"]["properties"]["cc"] == {
        "type": "array",
        "items": {"type": "string"},
        "description": "the cc",
    }
    assert list(subagent_tools([send, aui])) == ["Mail__send"]


def test_turn_text_round_trips_the_new_message():
    assert split_turn_text(turn_text([], ["hi"])) == ("", "hi")
    earlier, new = split_turn_text(turn_text([("q1", "a1")], ["q2", "q3"]))
    assert new == "q2\nq3" and "User: q1" in earlier and "Assistant: a1" in earlier


# ---- the scripted oracle policies ---------------------------------------------------------------
TASK, CHANGE = "When John replies, add the sync.", "Also invite Greg."
PLAN = [
    PlanStep("add", "Cal__add", {"who": ["John", "Greg"]}, 100.0, (TASK, CHANGE), 0),
    PlanStep("answer", "AgentUserInterface__send_message_to_user", {"content": "added"}, 100.0, (TASK, CHANGE), 0),
]
TOOLS = ("Cal__add", NOW_TOOL, WAIT_TOOL)


def _act(comm, memory, solo=False, subgoal=TASK):
    oracle = ScriptedOracle(PLAN, TOOLS)
    view = SubagentView(0, Harness(subgoal, (), oracle.tools, 30), len(memory), tuple(memory), comm, solo, 0)
    return parse_subagent_action(oracle.subagent(SimpleNamespace(state=view)), oracle.tools, comm)


def test_scripted_subagent_waits_for_the_plan_step_time():
    assert _act(COMM_ACTIONS, []) == ToolCall(NOW_TOOL, {})
    now = MemoryItem("call", "{'current_timestamp': 40.0}", NOW_TOOL, {})
    assert _act(COMM_ACTIONS, [now]) == ToolCall(WAIT_TOOL, {"timeout": 60})


def test_a_user_change_makes_a_proactive_subagent_ask_and_a_lifecycle_one_skip():
    heard = [
        MemoryItem("call", "{'current_timestamp': 40.0}", NOW_TOOL, {}),
        MemoryItem("notification", f"User: {CHANGE}"),
    ]
    action = _act(COMM_ACTIONS, heard)
    assert isinstance(action, ReviseRequest)
    assert action.message.request.target == RequestTarget.TASK and action.message.request.detail == CHANGE
    assert _act((SUBMIT,), heard) == Submit("", Message("nothing left that my task covers"))
    late = heard + [MemoryItem("call", "{'current_timestamp': 120.0}", NOW_TOOL, {})]
    assert _act(COMM_ACTIONS, late, solo=True) == ToolCall("Cal__add", {"who": ["John", "Greg"]})
    revised = late[:1] + late[2:]
    assert _act(COMM_ACTIONS, revised, subgoal=f"{TASK}\n{CHANGE}") == ToolCall("Cal__add", {"who": ["John", "Greg"]})


@pytest.mark.parametrize(("system", "kind"), [("orchestra_o1", DelegateAll), ("skill_mas", Plan), ("mas2", Plan)])
def test_the_oracle_orchestrates_each_baseline_with_its_own_first_action(system, kind):
    oracle = ScriptedOracle(PLAN, TOOLS)
    before, after = BASELINE_ACTIONS[system]
    view = OrchestratorView(SimpleNamespace(text=TASK), (), (), 0, 10, 300, 30, (), (SUBMIT,), 0, before)
    first = parse_orchestrator_action(oracle.orchestrator(SimpleNamespace(state=view)), actions=before)
    assert type(first) is kind and [h.subgoal for h in first.harnesses] == [TASK]  # the turn, one subtask
    assert first.harnesses[0].tools == oracle.tools
    part = Feedback("submit", agent_id=0, result="added")
    joined = Feedback("joined", text="agent 0 submitted: added", parts=(part,))
    view = dataclasses.replace(view, turns=(Turn(first, joined),), agents_used=1, actions=after)
    assert parse_orchestrator_action(oracle.orchestrator(SimpleNamespace(state=view)), actions=after) == Finish("added")
    proactive = dataclasses.replace(view, turns=(), actions=("delegate", "revise", "stop", "finish"))
    assert type(parse_orchestrator_action(oracle.orchestrator(SimpleNamespace(state=proactive)))) is Delegate


# ---- ARE's GAIA2 runner and judge ---------------------------------------------------------------
@pytest.mark.slow
@needs_are
def test_oracle_runs_score_100_percent(tmp_path):
    summary = run_gaia2(tmp_path, dataset=FIXTURES / "scenarios", scenarios=TUTORIALS, oracle=True)
    assert set(summary["scenarios"]) == set(OURS) | set(TUTORIALS)
    assert summary["success_rate"] == 1.0, summary


@pytest.mark.slow
@needs_are
def test_gaia2_judge_scores_our_agent_through_the_engine(tmp_path):
    store = tmp_path / "episodes.jsonl"
    summary = run_gaia2(
        tmp_path / "run", dataset=FIXTURES / "scenarios", checks=FIXTURES / "checks", scenarios=TUTORIALS, store=store
    )
    assert summary["success_rate"] == 1.0, summary
    assert summary["scenarios"]["porch_two_turns"]["turns"] == 2  # the second turn came after the judge's check
    records = {r.episode_id: r for r in TrajectoryStore(store).read()}
    assert len(records) == len(OURS) + len(TUTORIALS) + 1 and all(r.outcome.success for r in records.values())
    change = records["proactive/porch_task_change#1/turn0"]
    assert [d.action["name"] for d in change.decisions] == ["delegate", "revise", "finish"]
    heard = [s.text for s in change.decisions[0].segment if s.kind == "notification"]
    assert heard == ["User: Change of plan: also invite Greg Barty to the sync with John."]
    timed = records["proactive/porch_timed_forward#1/turn0"]
    tools = [s.tool for s in timed.decisions[0].segment if s.kind == "tool"]
    assert tools.index(WAIT_TOOL) < tools.index("MessagingAppV2__send_message")  # acted after the email came


@pytest.mark.slow
@needs_are
def test_gaia2_judge_fails_an_agent_that_misses_the_task_change(tmp_path):
    summary = run_gaia2(tmp_path, dataset=FIXTURES / "scenarios", checks=FIXTURES / "checks", system="lifecycle")
    verdicts = summary["scenarios"]
    assert not verdicts["porch_task_change"]["success"]
    assert "CalendarApp__add_calendar_event" in verdicts["porch_task_change"]["rationale"]
    assert verdicts["porch_timed_forward"]["success"] and verdicts["porch_two_turns"]["success"]


@pytest.mark.slow
@needs_are
def test_orchestra_o1_plays_gaia2_on_are_and_misses_the_task_change_as_lifecycle_does(tmp_path):
    store = tmp_path / "episodes.jsonl"
    summary = run_gaia2(
        tmp_path / "run", dataset=FIXTURES / "scenarios", checks=FIXTURES / "checks", system="orchestra_o1", store=store
    )
    verdicts = summary["scenarios"]
    assert not verdicts["porch_task_change"]["success"]  # its sub-agent only submits: the change is never heard
    assert verdicts["porch_timed_forward"]["success"] and verdicts["porch_two_turns"]["success"]
    records = {r.episode_id: r for r in TrajectoryStore(store).read()}
    timed = records["orchestra_o1/porch_timed_forward#1/turn0"]
    assert [d.action["name"] for d in timed.decisions] == ["delegate_all", "finish"]


def _call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@pytest.mark.slow
@pytest.mark.timeout(180)
@needs_are
def test_llm_policy_runs_each_role_on_its_own_endpoint_with_its_key(tmp_path, monkeypatch):
    """Policy "llm" through ARE's runner: the orchestrator and the sub-agents call two different
    endpoints (local test servers playing an OpenAI-compatible provider), each with the key from the
    variable it names; the keys never reach the child's command line or the records."""
    monkeypatch.setenv("PORCH_TEST_ORCH_KEY", "orch-secret-1")
    monkeypatch.setenv("PORCH_TEST_EXEC_KEY", "exec-secret-2")
    delegate = _call("delegate", subgoal="Reply to the user.", context=[], tools=[], budget=2)
    orchestrator = FakeOpenAIServer(
        [Step(reply=reply_with(delegate))], default=Step(reply=reply_with(_call("finish", answer="done")))
    )
    executor = FakeOpenAIServer(default=Step(reply=reply_with(_call(SUBMIT, result="nothing to do", status="done"))))
    store = tmp_path / "episodes.jsonl"
    try:
        summary = run_gaia2(
            tmp_path / "run",
            scenarios=TUTORIALS[:1],
            policy="llm",
            store=store,
            orchestrator=EndpointSpec(
                "orch-model", (orchestrator.url,), "openai_compatible", "PORCH_TEST_ORCH_KEY", backoff_s=0.01
            ),
            executor=EndpointSpec(
                "exec-model", (executor.url,), "openai_compatible", "PORCH_TEST_EXEC_KEY", backoff_s=0.01
            ),
        )
    finally:
        orchestrator.close()
        executor.close()
    assert set(summary["scenarios"]) == {TUTORIALS[0]}
    assert len(orchestrator.requests) >= 2 and len(executor.requests) >= 1
    assert {h["Authorization"] for h, _ in orchestrator.requests} == {"Bearer orch-secret-1"}
    assert {h["Authorization"] for h, _ in executor.requests} == {"Bearer exec-secret-2"}
    assert {b["model"] for _, b in orchestrator.requests} == {"orch-model"}
    assert {b["model"] for _, b in executor.requests} == {"exec-model"}
    records = list(TrajectoryStore(store).read())
    assert records and [d.action["name"] for d in records[0].decisions][:2] == ["delegate", "finish"]
    text = store.read_text()
    assert "orch-secret-1" not in text and "exec-secret-2" not in text
