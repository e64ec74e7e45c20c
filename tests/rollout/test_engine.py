"""The interleaved engine: delegation, revision with history, stop, budgets, baselines, ablations, records."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from scripted_roles import CLEAN_EXPERT, NO_SLIPS, Spy

from porch_jax.backends import BackendError, ChatRequest, ScriptedBackend
from porch_jax.envs.workplace import (
    ExpertConfig,
    ScriptedExpert,
    ScriptedSubagent,
    SubagentConfig,
    TaskMixture,
    WorkplaceEnv,
    make_task,
    make_tasks,
)
from porch_jax.protocol import Delegate, Finish, Harness, Revise, ToolCall, render_action
from porch_jax.rollout import ABLATIONS, Budgets, Engine, EngineConfig, system_config
from porch_jax.trajectories import encode_record


def run(engine: Engine, task):
    return asyncio.run(engine.run(task))


def engine(system="proactive", expert=CLEAN_EXPERT, sub=NO_SLIPS, **kw) -> Engine:
    return Engine(
        WorkplaceEnv,
        ScriptedBackend(ScriptedExpert(expert)),
        ScriptedBackend(ScriptedSubagent(sub)),
        system_config(system, EngineConfig(**kw)),
        system_name=system,
    )


def quiet(template: str, seed: int = 0):
    return make_task(seed, TaskMixture(templates={template: 1.0}, p_change=0.0, p_distract=0.0))


def test_clean_expert_solves_and_records_every_decision():
    task = quiet("cab_text")
    rec = run(engine(), task)
    assert rec.outcome.success and rec.outcome.reason == "ok"
    assert [d.action["name"] for d in rec.decisions] == ["delegate"] * 4 + ["finish"]
    d = rec.decisions[1]
    assert d.context[0]["role"] == "system" and d.context[1]["content"].startswith("Task: 1) find venue")
    assert len(d.context) == 4  # system, task, then the first decision and its feedback
    assert d.context[2]["content"] == rec.decisions[0].action_text
    assert d.context[3]["content"] == rec.decisions[0].feedback
    assert [s.kind for s in d.segment] == ["tool"] * 4 + ["comm"] and d.agent_id == 1
    assert rec.meta["decision_clock"] == [0, 3, 8, 11, 15] and rec.meta["steps"] == 15
    assert set(rec.cost) == {"orchestrator", "subagent"} and rec.cost["subagent"].calls == 15
    encode_record(rec)  # the store accepts it


def test_revision_resumes_the_same_worker_with_its_history():
    sub = Spy(ScriptedSubagent(NO_SLIPS))
    eng = Engine(
        WorkplaceEnv,
        ScriptedBackend(ScriptedExpert(ExpertConfig(0, 0, 0, 0, blind_spots=("archive",)))),
        sub,
        EngineConfig(),
    )
    rec = run(eng, quiet("history"))
    assert rec.outcome.success
    first = rec.decisions[0]
    assert "archive" not in first.action["arguments"]["tools"] and "request: tools add: archive" in first.feedback
    assert rec.decisions[1].action == {
        "name": "revise",
        "arguments": {"agent_id": 0, "tools": ["archive", "extract", "search"], "budget": 6},
    }
    resumed = [r for r in sub.requests if r.state.agent_id == 0 and r.state.harness.version == 1][0]
    texts = [m["content"] for m in resumed.messages]
    assert any("no 20" in t and "figure on the current page" in t for t in texts)  # its own earlier outputs
    assert any(t.startswith("Harness revised v0->v1.") for t in texts)  # the update record
    assert rec.decisions[1].segment[0].harness_version == 1 and rec.decisions[1].agent_id == 0


def test_stop_request_and_stop_end_the_worker():
    def orchestrator(req: ChatRequest) -> str:
        turns = req.state.turns
        if not turns:
            return render_action(Delegate(Harness("find venue of Nowhere party", (), ("contacts",), 5)))
        if req.state.live:
            return '<tool_call>{"name": "stop", "arguments": {"agent_id": 0, "reason": "give up"}}</tool_call>'
        return render_action(Finish("done"))

    eng = Engine(WorkplaceEnv, ScriptedBackend(orchestrator), ScriptedBackend(ScriptedSubagent(NO_SLIPS)))
    rec = run(eng, quiet("cab"))
    events = [d.meta["event"] for d in rec.decisions]
    assert events == ["revise", "stopped", "finish"]
    assert "[agent 0 stopped]" in rec.decisions[1].feedback


def test_parse_failures_are_observations_and_counted():
    expert = ScriptedExpert(CLEAN_EXPERT)
    calls = {"n": 0}

    def flaky(req: ChatRequest) -> str:
        calls["n"] += 1
        return "I will delegate now." if calls["n"] == 1 else expert(req)

    def sloppy_sub(req: ChatRequest) -> str:
        return "<tool_call>{oops" if req.state.steps_used == 0 else ScriptedSubagent(NO_SLIPS)(req)

    eng = Engine(WorkplaceEnv, ScriptedBackend(flaky), ScriptedBackend(sloppy_sub))
    rec = run(eng, quiet("cab"))
    assert rec.decisions[0].action is None and rec.decisions[0].parse_error.startswith("Error (no_tool_call)")
    assert rec.decisions[1].context[-1]["content"] == rec.decisions[0].feedback  # the model sees the error
    assert rec.meta["invalid"]["orchestrator"] == 1 and rec.meta["invalid"]["subagent"] >= 1
    assert rec.meta["invalid_kinds"]["orchestrator"] == {"NoToolCall": 1}
    assert rec.meta["invalid_kinds"]["subagent"].get("UnclosedToolCall", 0) >= 1
    assert rec.decisions[1].segment[0].kind == "error"
    assert rec.outcome.success


def test_backend_exceptions_never_escape():
    class Broken:
        async def chat(self, request):
            raise BackendError("down", retryable=False)

    rec = run(Engine(WorkplaceEnv, Broken(), Broken(), EngineConfig(max_decisions=3)), quiet("cab"))
    assert not rec.outcome.success and rec.outcome.reason.startswith("decision_limit")
    assert rec.meta["backend_errors"]["orchestrator"] == 3
    assert rec.meta["backend_error_kinds"]["orchestrator"] == {"other": 3}
    # a failed call is a backend error, not an unparseable reply: the invalid count stays the sum of its kinds
    assert rec.meta["invalid"]["orchestrator"] == 0 and rec.meta["invalid_kinds"]["orchestrator"] == {}


@pytest.mark.parametrize("kind", ["connection", "timeout", "server", "rate_limit"])
def test_a_backend_that_cannot_answer_ends_the_episode_as_retryable(kind):
    calls = 0

    class Down:
        def __init__(self, policy):
            self.inner = ScriptedBackend(policy)

        async def chat(self, request):
            nonlocal calls
            calls += 1
            if calls > 2:  # the pool goes down mid-episode, after a delegation and one sub-agent step
                raise BackendError("no server answered", kind=kind)
            return await self.inner.chat(request)

    orchestrator, subagent = Down(ScriptedExpert(CLEAN_EXPERT)), Down(ScriptedSubagent(NO_SLIPS))
    rec = run(Engine(WorkplaceEnv, orchestrator, subagent, EngineConfig(max_decisions=6)), quiet("cab"))
    assert rec.outcome.retryable and not rec.outcome.success and rec.meta["ended"] == "backend_unavailable"
    assert rec.outcome.reason.startswith("backend_unavailable: ") and "no server answered" in rec.outcome.reason
    assert calls == 3 and rec.decisions == []  # no further call after the outage; a placeholder, not a trajectory
    assert sum(rec.meta["backend_error_kinds"][role].get(kind, 0) for role in ("orchestrator", "subagent")) == 1


class ShortContext:
    """A test backend that plays a server with a short context (vLLM's 400 text) in front of the scripted expert:
    a request with more than `limit` messages fails as over-long."""

    def __init__(self, limit: int):
        self.inner, self.limit, self.sizes = ScriptedBackend(ScriptedExpert(CLEAN_EXPERT)), limit, []

    async def chat(self, request: ChatRequest):
        self.sizes.append(len(request.messages))
        if len(request.messages) > self.limit:
            raise BackendError(
                "HTTP 400: This model's maximum context length is 512 tokens. However, you requested 700 tokens"
            )
        return await self.inner.chat(request)


@pytest.mark.parametrize("rule", ["observe", "drop_oldest"])
def test_an_over_long_context_is_counted_and_compacted_by_the_configured_rule(rule):
    short = ShortContext(limit=4)
    config = system_config("proactive", EngineConfig(max_decisions=12, context_overflow=rule))
    rec = run(Engine(WorkplaceEnv, short, ScriptedBackend(ScriptedSubagent(NO_SLIPS)), config), quiet("cab"))
    kinds = rec.meta["backend_error_kinds"]["orchestrator"]
    assert kinds.get("context_length", 0) == rec.meta["backend_errors"]["orchestrator"] > 0
    if rule == "observe":  # every call past the limit fails: no finish, the decision limit ends the episode
        assert rec.meta["context_compactions"] == 0 and rec.meta["ended"] == "decision_limit"
    else:  # each overflow drops the oldest turn, keeping the instructions and the task
        assert rec.meta["context_compactions"] == kinds["context_length"]
        assert all(d.context[:2] == rec.decisions[0].context[:2] for d in rec.decisions)
        assert max(len(d.context) for d in rec.decisions) <= 4 and rec.meta["ended"] == "finish"


def test_few_shot_puts_a_worked_exchange_the_parser_reads_in_each_system_message():
    import re

    from porch_jax.protocol import extract_call

    orch, sub = Spy(ScriptedExpert(CLEAN_EXPERT)), Spy(ScriptedSubagent(NO_SLIPS))
    config = system_config("proactive", EngineConfig(few_shot=True))
    rec = run(Engine(WorkplaceEnv, orch, sub, config), quiet("cab"))
    assert rec.outcome.success
    orch_system = orch.requests[0].messages[0]["content"]
    sub_system = sub.requests[0].messages[0]["content"]
    examples = orch_system.split("Example.")[1] + sub_system.split("Example.")[1]
    calls = [extract_call(m) for m in re.findall(r"<tool_call>.*?</tool_call>", examples, re.S)]
    assert [c["name"] for c in calls] == ["delegate", "finish", sub.requests[0].tools[0]["function"]["name"], "submit"]
    zero = Spy(ScriptedExpert(CLEAN_EXPERT))
    run(Engine(WorkplaceEnv, zero, ScriptedBackend(ScriptedSubagent(NO_SLIPS))), quiet("cab"))
    assert "Example." not in zero.requests[0].messages[0]["content"]


def test_backend_error_kinds_come_from_the_failure():
    from porch_jax.backends.base import error_kind

    assert BackendError("The decoder prompt (length 900) is longer than the maximum model length of 512").kind == (
        "context_length"
    )
    assert BackendError("down").kind == "other" and BackendError("x", kind="rate_limit").kind == "rate_limit"
    assert (error_kind(TimeoutError()), error_kind(ConnectionResetError())) == ("timeout", "connection")
    with pytest.raises(ValueError, match="not one of"):
        BackendError("x", kind="cosmic_ray")


def test_sub_agent_budget_ends_with_a_structured_report():
    def busy(req: ChatRequest) -> str:
        return render_action(ToolCall("calendar", {"op": "search", "q": "zzz"}))

    eng = Engine(WorkplaceEnv, ScriptedBackend(ScriptedExpert(CLEAN_EXPERT)), ScriptedBackend(busy))
    rec = run(eng, quiet("cab"))
    first = rec.decisions[0]
    assert first.meta["event"] == "budget_exhausted"
    assert "budget exhausted after 4 steps" in first.feedback and "> no match for 'zzz'" in first.feedback
    assert rec.outcome.reason.startswith(("total_budget_exhausted", "failed"))  # ended, recorded, scored
    assert rec.meta["steps"] <= rec.meta["total_budget"]


def test_total_budget_and_agent_cap_are_enforced():
    task = quiet("cab")
    rec = run(engine(budgets=Budgets(total_steps=5, max_agents=1)), task)
    assert rec.meta["steps"] <= 5 and rec.meta["agents"] <= 1
    assert not rec.outcome.success


def test_lifecycle_has_no_mid_run_communication():
    sub = Spy(ScriptedSubagent(NO_SLIPS))
    expert = ExpertConfig(0, 0, 0, 0, blind_spots=("archive",))
    rec = run(
        Engine(WorkplaceEnv, ScriptedBackend(ScriptedExpert(expert)), sub, system_config("lifecycle")), quiet("history")
    )
    assert {r.state.comm for r in sub.requests} == {("submit",)}
    assert all(d.meta["event"] in ("submit", "budget_exhausted", "finish") for d in rec.decisions)
    assert "delegate" in rec.decisions[1].action["name"]  # the blocked worker returned; a new one starts
    assert "revise(agent_id, note?)" in rec.decisions[0].context[0]["content"]  # no field is revisable


def test_react_is_one_agent_with_every_tool_and_the_whole_budget():
    sub = Spy(ScriptedSubagent(NO_SLIPS))
    task = quiet("mail_text")
    rec = run(Engine(WorkplaceEnv, ScriptedBackend(ScriptedExpert()), sub, system_config("react")), task)
    assert rec.outcome.success and rec.decisions == [] and rec.meta["agents"] == 1
    h = sub.requests[0].state.harness
    assert len(h.tools) == 10 and h.budget == task.total_budget and sub.requests[0].state.solo
    assert rec.meta["segment"][-1]["tool"] == "submit"


def test_message_ablations_hide_fields_from_text_and_view():
    task = quiet("history")
    for name, field in (("no_status", "status:"), ("no_request", "request:"), ("no_evidence", "evidence:")):
        orch = Spy(ScriptedExpert(ExpertConfig(0, 0, 0, 0, blind_spots=("archive",))))
        eng = Engine(WorkplaceEnv, orch, ScriptedBackend(ScriptedSubagent(NO_SLIPS)), system_config(name))
        rec = run(eng, task)
        assert field not in rec.decisions[0].feedback
        msg = orch.requests[1].state.turns[0].feedback.message
        shown = {"status:": msg.status, "request:": msg.request, "evidence:": msg.evidence or None}
        assert shown[field] is None and sum(v is not None for v in shown.values()) == 2


def test_revision_ablations_reject_the_disabled_field():
    def reviser(req: ChatRequest) -> str:
        if not req.state.turns:
            return render_action(Delegate(Harness("compute change in exports of Malta since 2015", (), ("code",), 4)))
        if req.state.live:
            return render_action(Revise(0, context=("exports of Malta: 1",)))
        return render_action(Finish("x"))

    rec = run(
        Engine(
            WorkplaceEnv,
            ScriptedBackend(reviser),
            ScriptedBackend(ScriptedSubagent(NO_SLIPS)),
            system_config("no_context"),
        ),
        quiet("history"),
    )
    assert rec.decisions[1].parse_error is not None and "context" in rec.decisions[1].parse_error
    assert "context?" not in rec.decisions[0].context[0]["content"]


@pytest.mark.parametrize("name", ABLATIONS)
def test_ablations_run_and_record(name):
    for task in make_tasks(3):
        rec = run(engine(name, expert=ExpertConfig(), sub=SubagentConfig()), task)
        assert rec.system == name and rec.outcome.reason
        encode_record(rec)


def test_runs_are_deterministic():
    task = make_task(11)
    a, b = (
        run(engine(expert=ExpertConfig(), sub=SubagentConfig()), task),
        run(engine(expert=ExpertConfig(), sub=SubagentConfig()), task),
    )
    assert dataclasses.asdict(a)["decisions"] == dataclasses.asdict(b)["decisions"]


def test_a_context_window_keeps_every_orchestrator_prompt_within_its_tokens(tmp_path):
    """ContextWindow (backends/window.py) measures the rendered prompt with the policy's tokenizer and refuses one
    over the window as a context_length error, so drop_oldest keeps the scripted expert's contexts within it."""
    from transformers import AutoTokenizer

    from porch_jax.backends.window import ContextWindow
    from porch_jax.models.tiny import make_tiny_model
    from porch_jax.protocol.render import prompt_ids

    tok = AutoTokenizer.from_pretrained(str(make_tiny_model(tmp_path / "m")))
    full = run(
        Engine(
            WorkplaceEnv, ScriptedBackend(ScriptedExpert(CLEAN_EXPERT)), ScriptedBackend(ScriptedSubagent(NO_SLIPS))
        ),
        quiet("cab"),
    )
    longest = max(len(prompt_ids(tok, d.context)) for d in full.decisions)
    window = longest - 20
    expert = ContextWindow(ScriptedBackend(ScriptedExpert(CLEAN_EXPERT)), tok, window)
    config = system_config("proactive", EngineConfig(context_overflow="drop_oldest"))
    rec = run(Engine(WorkplaceEnv, expert, ScriptedBackend(ScriptedSubagent(NO_SLIPS)), config), quiet("cab"))
    assert expert.refused == rec.meta["context_compactions"] > 0
    assert max(len(prompt_ids(tok, d.context)) for d in rec.decisions) <= window < longest
    assert all(d.context[:2] == rec.decisions[0].context[:2] for d in rec.decisions)  # instructions and task kept
