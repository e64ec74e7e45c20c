"""The multi-agent comparison systems on scripted models: each one's defining mechanism (ComplexCoT's most complex
exemplars, DyLAN's early stop and importance ranking, MacNet's edges, AgentVerse's evaluation loop, AgentPrune's
pruned channels), and that every system's token cost is the sum over its calls."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from recorder import POOL, Recorder, check_cost

from porch_jax.envs.benchmarks.answers import extract_number
from porch_jax.envs.benchmarks.base import BenchmarkTask
from porch_jax.maca.graphspec import GraphSpec
from porch_jax.maca.multi_agent import (
    CommEdge,
    Exemplar,
    agentprune,
    agentverse,
    channels,
    complex_cot,
    dylan,
    exemplar,
    macnet,
    most_complex,
    parse_ratings,
    run_system,
    team,
    topology,
)
from porch_jax.maca.settings import BASELINES, MULTI_AGENT

TASK = "Tom has 3 apples and buys 4 more. How many apples? End with 'The answer is <number>.'"
MATH = team(POOL, "math", 3)  # WordProblemParser, MathSolver, ArithmeticChecker


def test_complex_cot_prompts_with_the_most_complex_exemplars():
    pool = [Exemplar(f"Q{n}", "\n".join(f"step {i}" for i in range(n)), n) for n in (1, 5, 3, 2, 6)]
    assert [e.question for e in most_complex(pool, 2)] == ["Q6", "Q5"]
    rec = Recorder(lambda call, _: "The answer is 7.")
    result = asyncio.run(complex_cot(rec.backend, TASK, pool, k=2))
    prompt = rec.calls[0].prompt
    assert "Question: Q6" in prompt and "Question: Q5" in prompt
    assert all(f"Question: Q{n}\n" not in prompt for n in (1, 2, 3))
    assert prompt.index("Q6") < prompt.index("Q5") < prompt.index(TASK) and prompt.endswith("step by step.")
    check_cost(result, rec)


def test_exemplar_steps_count_the_worked_solution():
    def task(**data):
        return BenchmarkTask("b", "1", "math", "Q?", "The answer is 1.", data)

    assert exemplar(task(code="a = 1\n\nb = a + 1\nresult = b")).steps == 3
    assert exemplar(task(equation="( ( 3.0 + 4.0 ) * 2.0 )")).steps == 2
    assert exemplar(task(equation="( 10.0 - -2.0 )")).steps == 1
    assert exemplar(task()).steps == 1
    code = BenchmarkTask(
        "humaneval", "1", "code", "def f(x):\n", "    y = x\n    return y\n", {"prompt": "def f(x):\n"}
    )
    assert exemplar(code) == Exemplar("def f(x):\n", "```python\ndef f(x):\n    y = x\n    return y\n```", 2)


def test_complex_cot_draws_exemplars_from_the_tasks_benchmark_only():
    def task(benchmark, task_id, lines):
        code = "\n".join(f"x{i} = {i}" for i in range(lines))
        return BenchmarkTask(benchmark, task_id, "math", f"{benchmark} {task_id}?", "The answer is 1.", {"code": code})

    target = task("gsm_hard", "0", 9)
    train = [task("gsm_hard", "1", 2), task("svamp_like", "2", 20), target, task("gsm_hard", "3", 4)]
    rec = Recorder(lambda call, _: "The answer is 7.")
    asyncio.run(run_system("complex_cot", rec.backend, target, POOL, None, exemplars=train))
    prompt = rec.calls[0].prompt
    assert "gsm_hard 1?" in prompt and "gsm_hard 3?" in prompt and "svamp_like" not in prompt
    assert prompt.count("gsm_hard 0?") == 1  # the task itself, asked once, never an exemplar


def test_dylan_stops_early_when_the_agents_agree():
    rec = Recorder(lambda call, _: "The answer is 7.")
    run = asyncio.run(dylan(rec.backend, TASK, MATH, extract_number, rounds=3))
    assert run.rounds == 1 and run.result.calls == 3 and extract_number(run.result.answer) == 7
    check_cost(run.result, rec)


def test_dylan_runs_every_round_without_consensus():
    rec = Recorder(lambda call, n: f"The answer is {MATH.index(next(a for a in MATH if a.name == call.agent)) + n}.")
    run = asyncio.run(dylan(rec.backend, TASK, MATH, extract_number, rounds=3))
    assert run.rounds == 3 and run.result.calls == 9
    assert all("Answers of the previous round" in c.prompt for c in rec.calls[3:])
    check_cost(run.result, rec)


def test_dylan_ranks_the_agent_its_peers_rated_highest_first():
    first = {"WordProblemParser": 9, "MathSolver": 8, "ArithmeticChecker": 7}  # 7 is right: ArithmeticChecker's

    def model(call, n):
        if n == 0:
            return f"The answer is {first[call.agent]}."
        assert "[ArithmeticChecker]\nThe answer is 7." in call.prompt
        return "3 + 4 = 7. The answer is 7.\nRatings: 1, 2, 5"

    rec = Recorder(model)
    run = asyncio.run(dylan(rec.backend, TASK, MATH, extract_number, rounds=3))
    assert run.rounds == 2 and run.ranking()[0] == "ArithmeticChecker" and run.ranking()[-1] == "WordProblemParser"
    assert run.result.answer == "3 + 4 = 7. The answer is 7."  # the ratings are not part of the answer
    assert sum(run.importance) == pytest.approx(1.0)
    check_cost(run.result, rec)


def test_parse_ratings_falls_back_to_uniform():
    assert parse_ratings("blah\nRatings: 1 5 3", 3).tolist() == [1, 5, 3]
    assert parse_ratings("no ratings here", 3).tolist() == [1, 1, 1]
    assert parse_ratings("Ratings: 4 4", 3).tolist() == [1, 1, 1]


def test_topologies_are_dags_with_one_sink():
    assert topology("chain", 4) == ((0, 1), (1, 2), (2, 3))
    assert topology("tree", 4) == ((0, 2), (1, 3), (2, 3))
    assert len(topology("mesh", 4)) == 6
    for kind in ("chain", "tree", "mesh"):
        edges = topology(kind, 5)
        assert all(i < j for i, j in edges) and {i for i, _ in edges} == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="topology"):
        topology("ring", 3)


@pytest.mark.parametrize("kind, sink_sees", [("chain", {"MathSolver"}), ("mesh", {"WordProblemParser", "MathSolver"})])
def test_macnet_sink_sees_its_predecessors_only(kind, sink_sees):
    rec = Recorder(lambda call, _: f"Draft by {call.agent}. The answer is 7.")
    run = asyncio.run(macnet(rec.backend, TASK, MATH, kind=kind))
    sink = rec.calls[-1]
    assert sink.agent == "ArithmeticChecker" and run.result.answer == sink.reply
    assert {a.name for a in MATH if f"Draft by {a.name}." in sink.prompt} == sink_sees
    assert run.inputs[-1] == tuple(MATH.index(a) for a in MATH if a.name in sink_sees)
    assert "Draft by" not in rec.calls[0].prompt  # the source solves alone
    check_cost(run.result, rec)


def _agentverse_model(verdicts):
    script = iter(verdicts)

    def model(call, _):
        if call.role == "recruiter":
            return "I recruit StepChecker to lead, then MathSolver and GeneralCritic."
        if call.role == "evaluator":
            return next(script)
        return "NO ISSUES" if "Review it" in call.prompt else "The answer is 7."

    return model


def test_agentverse_loops_until_the_evaluator_accepts():
    rec = Recorder(_agentverse_model(["Wrong units.", "Still wrong.", "ACCEPT", "never read"]))
    math_agents = [a for a in POOL if a.family == "math"]
    run = asyncio.run(agentverse(rec.backend, TASK, math_agents, rounds=5))
    assert run.accepted and run.rounds == 3
    assert run.experts[0] == ("StepChecker", "MathSolver", "GeneralCritic")
    assert [c.role for c in rec.calls].count("evaluator") == 3
    assert "Still wrong." in [c for c in rec.calls if c.role == "recruiter"][-1].prompt  # feedback reaches recruiting
    assert rec.calls[1].agent == "StepChecker"  # the first recruited expert leads
    check_cost(run.result, rec)


def test_agentverse_stops_at_the_round_limit():
    rec = Recorder(_agentverse_model(["No."] * 5))
    run = asyncio.run(agentverse(rec.backend, TASK, [a for a in POOL if a.family == "math"], rounds=2))
    assert not run.accepted and run.rounds == 2 and extract_number(run.result.answer) == 7


def test_agentprune_pruned_channels_carry_no_messages():
    weights = np.array([[0.9, 0.1, 0.8], [0.2, 0.7, 0.05], [0.6, 0.3, 0.95]])
    rec = Recorder(lambda call, n: f"Note {n} by {call.agent}. The answer is 7.")
    run = asyncio.run(agentprune(rec.backend, TASK, MATH, extract_number, weights, rounds=2, ratio=0.5))
    assert len(run.kept) == len(run.pruned) == len(channels(3)) // 2
    assert max(weights[e.sender, e.receiver] for e in run.pruned) <= min(
        weights[e.sender, e.receiver] for e in run.kept
    )
    assert CommEdge("spatial", 1, 2) in run.pruned and CommEdge("temporal", 0, 0) in run.kept
    delivered = {m.edge for m in run.messages}
    assert delivered <= set(run.kept) and not delivered & set(run.pruned)
    for t in range(2):
        for j, agent in enumerate(MATH):
            prompt = rec.calls[3 * t + j].prompt
            for e in (*run.kept, *run.pruned):
                if e.receiver != j or (e.kind == "temporal" and t == 0):
                    continue
                note = f"Note {t if e.kind == 'spatial' else t - 1} by {MATH[e.sender].name}."
                assert (note in prompt) == (e in run.kept), (t, agent.name, e)
    check_cost(run.result, rec)


def test_every_multi_agent_system_runs_by_name_and_costs_the_sum_of_its_calls():
    assert set(MULTI_AGENT) <= set(BASELINES)
    task = BenchmarkTask("svamp", "1", "math", TASK, "The answer is 7.", {"target": 7.0, "equation": "( 3.0 + 4.0 )"})
    spec = GraphSpec(
        relevance=np.ones(len(POOL)), participation=np.ones(len(POOL)), edge_prior=np.full((len(POOL),) * 2, 0.5)
    )
    for name in MULTI_AGENT:
        rec = Recorder(_agentverse_model(["ACCEPT"]))
        result = asyncio.run(run_system(name, rec.backend, task, POOL, spec, exemplars=[task]))
        assert extract_number(result.answer) == 7, name
        check_cost(result, rec)
    rec = Recorder(lambda call, _: "The answer is 7.")
    assert asyncio.run(run_system("vanilla", rec.backend, task, POOL, spec)).calls == 1


def test_agentprune_by_name_prunes_by_the_graphspec_edge_prior():
    at = [POOL.index(a.name) for a in MATH]
    prior = np.full((len(POOL),) * 2, 0.5)
    prior[np.ix_(at, at)] = 0.9
    prior[at[0], at[2]] = 0.0  # WordProblemParser -> ArithmeticChecker: the weakest channel
    spec = GraphSpec(relevance=np.ones(len(POOL)), participation=np.ones(len(POOL)), edge_prior=prior)
    task = BenchmarkTask("svamp", "1", "math", TASK, "The answer is 7.", {"target": 7.0})
    rec = Recorder(lambda call, n: f"Note {n} by {call.agent}. The answer is 7.")
    asyncio.run(run_system("agentprune", rec.backend, task, POOL, spec))
    checker = [c.prompt for c in rec.calls if c.agent == "ArithmeticChecker"]
    assert len(checker) == 2 and not any("by WordProblemParser" in p for p in checker)
    assert any("by MathSolver" in p for p in checker)  # a kept channel does deliver
