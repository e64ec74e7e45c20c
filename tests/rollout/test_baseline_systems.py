"""The paper's multi-agent baselines as engine systems, each shown by its defining mechanism on scripted backends:
Orchestra-o1 runs a delegation's sub-agents concurrently and joins them; Skill-MAS never changes its plan after the
first call; MAS² rewrites its agent structure between rounds; Mini-SWE is one agent whose only tool is bash."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from scripted_roles import CLEAN_EXPERT, NO_SLIPS, Spy

from porch_jax.backends import ChatRequest, ScriptedBackend
from porch_jax.envs.base import Environment, Score
from porch_jax.envs.workplace import (
    ExpertConfig,
    ScriptedExpert,
    ScriptedSubagent,
    TaskMixture,
    WorkplaceEnv,
    make_task,
)
from porch_jax.protocol import (
    BadArguments,
    DelegateAll,
    Finish,
    Harness,
    Plan,
    Submit,
    ToolCall,
    UnknownAction,
    orchestrator_tool_schemas,
    parse_orchestrator_action,
    render_action,
)
from porch_jax.rollout import BASELINES, Engine, system_config
from porch_jax.rollout.compare import ComparisonConfig, summarize, workplace_engine
from porch_jax.typed_config import ConfigError


def quiet(template: str, seed: int = 0):
    return make_task(seed, TaskMixture(templates={template: 1.0}, p_change=0.0, p_distract=0.0))


def run(system: str, orchestrator, subagent, task):
    engine = Engine(WorkplaceEnv, orchestrator, subagent, system_config(system), system_name=system)
    return asyncio.run(engine.run(task))


def names(record) -> list[str | None]:
    return [d.action["name"] if d.action else None for d in record.decisions]


# ---- the protocol's joined delegations -------------------------------------------------------------------------


def test_delegate_all_and_plan_round_trip_only_where_the_system_allows_them():
    harnesses = (
        Harness("find venue of X", (), ("calendar",), 2),
        Harness("find phone of Y", ("a: b",), ("contacts",), 3),
    )
    for action, name in ((DelegateAll(harnesses), "delegate_all"), (Plan(harnesses), "plan")):
        text = render_action(action)
        assert parse_orchestrator_action(text, actions=(name, "finish")) == action
        assert type(parse_orchestrator_action(text, actions=(name,))) is type(action)
        with pytest.raises(UnknownAction):  # POrchestra's own action set has no joined delegation
            parse_orchestrator_action(text)
        with pytest.raises(BadArguments):
            parse_orchestrator_action(
                f'<tool_call>{{"name": "{name}", "arguments": {{"subtasks": []}}}}</tool_call>', actions=(name,)
            )
        schemas = orchestrator_tool_schemas(["calendar"], actions=(name, "finish"))
        assert [s["function"]["name"] for s in schemas] == [name, "finish"]


# ---- Orchestra-o1 -------------------------------------------------------------------------------------------------


def test_orchestra_o1_runs_its_subagents_concurrently_and_joins_them():
    sub = Spy(ScriptedSubagent(NO_SLIPS))
    rec = run("orchestra_o1", ScriptedBackend(ScriptedExpert(CLEAN_EXPERT)), sub, quiet("mail_text"))
    assert rec.outcome.success and names(rec) == ["delegate_all", "delegate_all", "finish"]
    first = rec.decisions[0]
    assert len(first.action["arguments"]["subtasks"]) == 2  # the two independent clauses, at once
    assert first.meta["event"] == "joined" and "[agent 0" in first.feedback and "[agent 1" in first.feedback
    # Every sub-agent started before any finished: their step windows overlap on the global clock.
    order = [r.state.agent_id for r in sub.requests if r.state.agent_id in (0, 1)]
    ends = [i for i, s in enumerate(first.segment) if s.kind == "comm"]
    starts = [next(i for i, s in enumerate(first.segment) if s.agent_id == a) for a in (0, 1)]
    assert max(starts) < min(ends)
    assert order[:2] == [0, 1]  # agent 1 stepped before agent 0's second step


def test_orchestra_o1_allows_only_joined_delegation_and_finish():
    def single(req: ChatRequest) -> str:  # a plain delegate is not in Orchestra-o1's action set
        if not req.state.turns:
            return '<tool_call>{"name": "delegate", "arguments": {"subgoal": "x", "context": [], "tools": [], "budget": 1}}</tool_call>'
        return render_action(Finish("x"))

    orch = Spy(single)
    rec = run("orchestra_o1", orch, ScriptedBackend(ScriptedSubagent(NO_SLIPS)), quiet("cab"))
    assert rec.decisions[0].parse_error and "unknown action 'delegate'" in rec.decisions[0].parse_error
    assert orch.requests[0].state.actions == ("delegate_all", "finish")
    assert "delegate_all(subtasks" in rec.decisions[0].context[0]["content"]


# ---- Skill-MAS / AutoAgents -------------------------------------------------------------------------------------


def test_skill_mas_never_changes_its_plan_after_the_first_call():
    expert = ExpertConfig(0, 0, 0, 0, blind_spots=("archive",))  # the first plan fails a clause
    orch = Spy(ScriptedExpert(expert))
    rec = run("skill_mas", orch, ScriptedBackend(ScriptedSubagent(NO_SLIPS)), quiet("history"))
    assert names(rec) == ["plan", "finish"]
    planned = rec.decisions[0].action["arguments"]["subtasks"]
    assert rec.meta["agents"] == len(planned) == 3  # every agent came from the one plan
    assert [r.state.actions for r in orch.requests] == [("plan",), ("finish",)]
    assert not rec.outcome.success  # no re-orchestration: the failed clause stays failed


def test_skill_mas_refuses_a_second_plan_and_hands_results_along_the_plan():
    plan = Plan(
        (
            Harness("find phone of Mia Kaya", (), ("contacts",), 3),
            Harness("text Mia Kaya the wifi code", (), ("messaging",), 3),
        )
    )

    def replanner(req: ChatRequest) -> str:  # tries to re-plan after execution
        return render_action(plan if len(req.state.turns) < 2 else Finish("done"))

    sub = Spy(ScriptedSubagent(NO_SLIPS))
    rec = run("skill_mas", ScriptedBackend(replanner), sub, quiet("mail_text"))
    assert names(rec) == ["plan", None, "finish"] and "unknown action 'plan'" in rec.decisions[1].parse_error
    assert rec.meta["agents"] == 2
    second = next(r.state.harness for r in sub.requests if r.state.agent_id == 1)
    assert any(line.startswith("phone of Mia Kaya: ") for line in second.context)  # the first agent's result


# ---- MAS² -----------------------------------------------------------------------------------------------------------


def test_mas2_rectifies_its_agent_structure_between_rounds():
    expert = ExpertConfig(0, 0, 0, 0, blind_spots=("archive",))
    orch = ScriptedBackend(ScriptedExpert(expert))
    rec = run("mas2", orch, ScriptedBackend(ScriptedSubagent(NO_SLIPS)), quiet("history"))
    assert names(rec)[:2] == ["plan", "plan"] and names(rec)[-1] == "finish"
    first, second = (tuple(map(str, d.action["arguments"]["subtasks"])) for d in rec.decisions[:2])
    assert first != second and len(second) < len(first)  # a new structure: only the failed part, re-harnessed
    assert "archive" in rec.decisions[1].action["arguments"]["subtasks"][0]["tools"]  # the lesson of round one
    assert rec.outcome.success


# ---- every baseline on the comparison ---------------------------------------------------------------------------


def test_the_scripted_expert_plays_every_baseline_for_a_comparison_row():
    tasks = [quiet(t, s) for t in ("cab_text", "mail_text", "history") for s in range(2)]
    for system in (s for s in BASELINES if s != "mini_swe"):
        engine = workplace_engine(system)
        records = [asyncio.run(engine.run(t)) for t in tasks]
        row = summarize(system, records)
        assert row.n == len(tasks) and row.invalid_rate == 0.0 and row.success > 0, system
        assert all(r.system == system and r.meta["ended"] == "finish" for r in records)


def test_joined_feedback_parts_follow_the_subtasks():
    action = DelegateAll((Harness("find venue of Budget review", (), ("calendar",), 2),) * 2)
    rec = run(
        "orchestra_o1",
        ScriptedBackend(lambda r: render_action(action if not r.state.turns else Finish("x"))),
        ScriptedBackend(ScriptedSubagent(NO_SLIPS)),
        quiet("cab"),
    )
    assert rec.meta["agents"] == 2 and {s.agent_id for s in rec.decisions[0].segment} == {0, 1}


# ---- Mini-SWE -------------------------------------------------------------------------------------------------------


@dataclass
class _Task:
    text: str = "fix add() in calc.py"
    task_id: str = "calc-1"


class _Shell(Environment):
    """A repository stand-in with a shell and an editor: Mini-SWE may use only the shell."""

    name = "shell"

    def reset(self, task: Any) -> None:
        self.commands: list[str] = []

    def tool_names(self) -> tuple[str, ...]:
        return ("bash", "edit")

    def tool_schemas(self, names):
        return [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in names]

    def call_tool(self, agent_id: int, name: str, args: dict[str, Any]) -> str:
        self.commands.append(args.get("command", ""))
        return "ok"

    def poll_notifications(self, step: int) -> list[str]:
        return []

    def score(self, answer: str | None) -> Score:
        fixed = "sed -i s/a - b/a + b/ calc.py" in self.commands
        return Score(fixed, float(fixed), "resolved" if fixed else "unresolved")


def test_mini_swe_is_one_agent_with_bash_as_its_only_tool():
    script = [
        ToolCall("edit", {"path": "calc.py", "old": "a - b", "new": "a + b"}),  # not Mini-SWE's: refused
        ToolCall("bash", {"command": "sed -i s/a - b/a + b/ calc.py"}),
        Submit("fixed"),
    ]
    sub = Spy(lambda req: render_action(script[len(req.state.memory)]))
    engine = Engine(_Shell, ScriptedBackend(lambda r: ""), sub, system_config("mini_swe"), system_name="mini_swe")
    rec = asyncio.run(engine.run(_Task()))
    h = sub.requests[0].state.harness
    assert h.tools == ("bash",) and h.budget == 300 and sub.requests[0].state.solo and rec.decisions == []
    assert rec.meta["invalid_kinds"]["subagent"] == {"ToolNotAllowed": 1} and rec.outcome.success
    with pytest.raises(ConfigError, match="mini_swe"):  # the workplace suite has no shell
        ComparisonConfig(run_dir="-", systems=("mini_swe",))
