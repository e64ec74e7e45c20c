"""Baselines through the Backend interface with scripted models: call counts, token cost, voting,
refinement, and the routers' invalid-action accounting with and without the GraphSpec mask."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from porch_jax.backends import ScriptedBackend
from porch_jax.envs.benchmarks.answers import extract_number
from porch_jax.envs.benchmarks.base import BenchmarkTask
from porch_jax.maca.baselines import (
    cot,
    invalid_action_rate,
    llm_router,
    parse_router_choice,
    run_baseline,
    self_consistency,
    self_refine,
    vanilla,
    vote_key,
)
from porch_jax.maca.graphspec import GraphSpec
from porch_jax.maca.pools import load_pool

TASK = "Tom has 3 apples and buys 4 more. How many apples? End with 'The answer is <number>.'"


def _words(text: str) -> int:
    return len(text.split())


def test_vanilla_and_cot_make_one_call_and_count_its_tokens():
    seen = []
    backend = ScriptedBackend(lambda r: seen.append(r.messages[-1]["content"]) or "The answer is 7.")
    result = asyncio.run(vanilla(backend, TASK))
    assert result.calls == 1 and result.answer == "The answer is 7."
    assert (result.prompt_tokens, result.completion_tokens) == (_words(TASK), 4)
    assert result.to_answer().cost == result.cost
    asyncio.run(cot(backend, TASK))
    assert seen[-1].endswith("Let's think step by step.")


def test_self_consistency_takes_the_majority_of_five():
    replies = iter(["The answer is 8.", "The answer is 7.", "The answer is 7.", "no idea", "The answer is 7."])
    seeds = []
    backend = ScriptedBackend(lambda r: seeds.append(r.sampling.seed) or next(replies))
    result = asyncio.run(self_consistency(backend, TASK, extract_number))
    assert result.calls == 5 and result.answer == "The answer is 7." and len(set(seeds)) == 5


def test_self_refine_stops_when_the_critic_finds_no_issue():
    def model(request):
        text = request.messages[-1]["content"]
        if "Critique this solution" in text:
            return "NO ISSUES" if "is 7" in text else "3 + 4 is not 8."
        return "The answer is 7." if "Feedback" in text else "The answer is 8."

    result = asyncio.run(self_refine(ScriptedBackend(model), TASK, rounds=3))
    assert result.answer == "The answer is 7." and result.calls == 4  # solve, critique, refine, critique


def test_parse_router_choice():
    names = ("MathSolver", "StepChecker")
    assert parse_router_choice("MathSolver", names) == "MathSolver"
    assert parse_router_choice("I would call stepchecker next.", names) == "StepChecker"
    assert parse_router_choice("STOP", names) == "STOP"
    assert parse_router_choice("MathSolver or StepChecker", names) is None
    assert parse_router_choice("CodeWriting", names) is None


@pytest.fixture
def pool_and_spec():
    pool = load_pool()
    families = np.array([a.family for a in pool])
    z = np.where(families == "math", 0.8, 0.0)
    p_prior = np.full((len(pool), len(pool)), 0.5)
    return pool, GraphSpec(relevance=np.where(z > 0, 0.8, 0.2), participation=z, edge_prior=p_prior)


def _router_model(choices):
    script = iter(choices)

    def model(request):
        if request.role == "router":
            return next(script)
        return "The answer is 7." if "MathSolver" in request.messages[0]["content"] else "Looks fine."

    return model


@pytest.mark.parametrize(
    "mode, invalid, path",
    [
        ("none", 2, ("MathSolver", "CodeWriting")),  # CodeWriting is outside H but runs: nothing constrains it
        ("hint", 2, ("MathSolver", "CodeWriting")),
        ("mask", 2, ("MathSolver",)),  # the hard mask rejects it
    ],
)
def test_router_counts_invalid_actions(pool_and_spec, mode, invalid, path):
    pool, spec = pool_and_spec
    prompts = []
    model = _router_model(["MathSolver", "gibberish", "CodeWriting", "STOP"])
    backend = ScriptedBackend(lambda r: prompts.append(r.messages[-1]["content"]) or model(r))
    result = asyncio.run(llm_router(backend, TASK, pool, spec, mode=mode, max_steps=6))
    assert result.path == path and result.decisions == 4 and result.invalid_decisions == invalid
    assert extract_number(result.answer) == 7
    assert result.calls == 4 + len(path)
    router_prompt = prompts[0]
    assert ("CodeWriting:" in router_prompt) == (mode != "mask")
    assert ("GraphSpec" in router_prompt) == (mode == "hint")
    assert invalid_action_rate([result, result]) == pytest.approx(invalid / 4)


def test_self_consistency_votes_on_each_familys_answer():
    def task(family, **data):
        return BenchmarkTask("b", "1", family, "prompt", "", data)

    math = vote_key(task("math", target=7.0))
    assert math("so 3 + 4 = 7. The answer is 7.") == math("The answer is 7.0") == 7.0 and math("no idea") is None
    qa = vote_key(task("qa", n_options=4))
    assert qa("The answer is (B).") == qa("Answer: B") == "B" and qa("The answer is E.") is None
    code = vote_key(task("code", entry_point="f"))
    assert code("```python\ndef f(x):\n    return x\n```") == code("Here:\n```python\ndef f(x):\n    return x\n\n```")
    assert code("   ") is None
    with pytest.raises(ValueError, match="family"):
        vote_key(task("chess"))
    with pytest.raises(ValueError, match="unknown baseline"):
        asyncio.run(run_baseline("debate", ScriptedBackend(lambda r: ""), task("math", target=1.0), load_pool(), None))
