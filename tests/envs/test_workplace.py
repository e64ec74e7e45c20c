"""The workplace suite: seeded tasks, apps, notifications and the scorer."""

from __future__ import annotations

import pytest

from porch_jax.envs import Environment
from porch_jax.envs.workplace import (
    TOOLS,
    TaskMixture,
    WorkplaceEnv,
    make_probe,
    make_task,
    make_tasks,
    nominal_steps,
    parse_clause,
    parse_facts,
    parse_subgoal,
    work,
)
from porch_jax.envs.workplace.clauses import Call, Done, ToolObs, step


def solve(env: WorkplaceEnv, clauses: list[str], agent_id: int = 0, facts: dict[str, str] | None = None) -> dict:
    """Run the clause programs to completion with every tool, as an oracle sub-agent would."""
    facts, obs = dict(facts or {}), []
    for text in clauses:
        clause = parse_clause(text)
        for _ in range(20):
            s = step(clause, facts, obs)
            if isinstance(s, Done):
                facts[s.key] = s.value
                break
            assert isinstance(s, Call), s
            obs.append(ToolObs(s.name, s.args, env.call_tool(agent_id, s.name, s.args)))
        else:
            raise AssertionError(f"clause did not finish: {text}")
    return facts


def test_tasks_are_seeded_and_render_compactly():
    a, b = make_task(7), make_task(7)
    assert a.text == b.text and a.notices == b.notices and a.total_budget == b.total_budget
    assert make_task(8).text != a.text or make_task(8).notices != a.notices
    for task in make_tasks(60):
        assert parse_subgoal(task.text) is not None, task.text
        assert len(task.text) < 200  # compact: a tiny model's context must hold it with the feedback
        assert task.total_budget >= nominal_steps(task.clauses) + 2
        assert task.max_agents == len(task.clauses) + 2


def test_mixture_controls_templates_and_notifications():
    only_cab = TaskMixture(templates={"cab": 1.0}, p_change=1.0, p_distract=0.0)
    tasks = make_tasks(20, only_cab)
    assert {t.template for t in tasks} == {"cab"}
    assert all(any(n.relevant for n in t.notices) and not any(not n.relevant for n in t.notices) for t in tasks)
    assert {"goal_change"} <= set(tasks[0].features)


@pytest.mark.parametrize("seed", range(40))
def test_oracle_solves_every_task(seed):
    task = make_task(seed, TaskMixture(p_change=0.0, p_distract=0.0))
    env = WorkplaceEnv()
    env.reset(task)
    facts = solve(env, list(task.clauses))
    answer = facts.get(task.answer_key or "", "done")
    score = env.score(answer)
    assert score.success, (task.text, score)


def test_scorer_rejects_wrong_and_extra_writes():
    task = make_task(0, TaskMixture(templates={"cab": 1.0}, p_change=0.0, p_distract=0.0))
    env = WorkplaceEnv()
    env.reset(task)
    facts = solve(env, list(task.clauses))
    place, time = facts[f"venue of {parse_clause(task.clauses[1]).args['event']}"].split(" at ")
    env.call_tool(0, "cab", {"op": "book", "to": place, "at": time, "seats": 6})  # a second booking
    score = env.score("done")
    assert not score.success and 0 < score.score < 1 and "booking" in score.reason


def test_tools_validate_arguments_and_sessions():
    task = make_task(3)
    env = WorkplaceEnv()
    env.reset(task)
    assert env.call_tool(0, "cab", {"op": "fly"}).startswith("error: op must be")
    assert env.call_tool(0, "files", {"op": "read", "name": "notes.txt", "page": 1}).startswith("error")
    env.call_tool(0, "files", {"op": "open", "name": "notes.txt"})
    assert env.call_tool(1, "files", {"op": "read", "name": "notes.txt", "page": 1}) == "error: open the file first"
    assert env.call_tool(0, "code", {"expr": "__import__('os')"}).startswith("error")
    assert env.call_tool(0, "code", {"expr": "7 - 10"}) == "= -3"
    assert env.call_tool(0, "nope", {}).startswith("error: unknown tool")
    schemas = env.tool_schemas(TOOLS)
    assert [s["function"]["name"] for s in schemas] == list(TOOLS)
    assert schemas[4]["function"]["parameters"]["properties"]["op"]["enum"] == ["quote", "book", "status", "cancel"]
    assert isinstance(env, Environment)


def test_notifications_arrive_relative_to_their_anchor_and_change_the_goal():
    mix = TaskMixture(templates={"cab": 1.0}, p_change=1.0, p_distract=0.0)
    task = next(t for t in make_tasks(50, mix) if "seats" in dict(t.notices[0].change))
    notice = task.notices[0]
    env = WorkplaceEnv()
    env.reset(task)
    assert env.poll_notifications(100) == []  # the clock starts at the first cab call
    env.poll_notifications(10)
    env.call_tool(0, "cab", {"op": "status", "ref": "R1"})
    assert env.poll_notifications(10 + int(notice.offset) - 1 if notice.offset >= 1 else 9) == []
    assert env.poll_notifications(11 + int(notice.offset)) == [notice.text]
    assert env.poll_notifications(99) == []  # delivered once
    d = env.deliveries()[0]
    assert d.relevant and d.arrival == pytest.approx(10 + notice.offset)
    solve(env, list(task.clauses))  # books the original seat count: now wrong
    assert not env.score("done").success


def test_probe_lasts_exactly_its_horizon():
    task = make_probe(0, 12, arrival=3.5)
    assert nominal_steps(task.clauses) == 12 and task.notices[0].offset == 3.5 and task.notices[0].anchor is None
    assert work(parse_clause(task.clauses[0])) == 11


def test_facts_and_grammar():
    assert parse_facts(["venue of X: Room 4 at 10:00\ncab booking: R2", "junk"]) == {
        "venue of X": "Room 4 at 10:00",
        "cab booking": "R2",
    }
    assert parse_subgoal("cancel cab R2; book cab to Demo day for 3")[0].kind == "cancel"
    assert parse_subgoal("do something nice") is None
    assert parse_clause("book cab to Demo day").args == {"event": "Demo day"}  # mis-scoped: no seats
