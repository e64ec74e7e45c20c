"""The orchestration rollout and the policies: the LM scorer against a plain forward pass, the Eq. 11
constraint (no invalid action, ever), episode ends (STOP, budget, max steps), per-step token accounting
through the Backend, the real-benchmark path with a scripted backend, the exact best-achievable search
and the transition analyses."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from porch_jax.backends import ScriptedBackend
from porch_jax.envs.benchmarks.base import BenchmarkTask
from porch_jax.envs.benchmarks.math_tasks import GSM_HARD
from porch_jax.maca.analysis import (
    best_achievable,
    committed_optimum,
    masked_optimum,
    reward_optimal,
    top2_mass,
    transition_matrix,
)
from porch_jax.maca.graphspec import GraphSpec
from porch_jax.maca.lm_policy import head_policy, lm_policy, tiny_lm
from porch_jax.maca.orchestrator import (
    STOP,
    Constraint,
    Episode,
    RolloutConfig,
    State,
    Step,
    action_masks,
    benchmark_tasks,
    benchmark_world,
    render_state,
    rollout,
    synthetic_tasks,
    synthetic_world,
)
from porch_jax.maca.pools import load_pool
from porch_jax.maca.synthetic import SyntheticPool, make_tasks

LM_SIZE = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "num_hidden_layers": 1,
}


@pytest.fixture(scope="module")
def spool():
    return SyntheticPool()


@pytest.fixture(scope="module")
def tiny():
    return tiny_lm(0, **LM_SIZE)


class Scripted:
    """A policy that plays fixed action sequences (by task), as log-probs with all mass on the action."""

    def __init__(self, plans):
        self.plans = plans

    def __call__(self, states, masks):
        out = np.full(masks.shape, -np.inf, np.float32)
        for r, s in enumerate(states):
            plan = self.plans[s.task.task_id]
            out[r, plan[len(s.history)] if len(s.history) < len(plan) else -1] = 0.0
        return out


def _spec(n, retained, edges):
    z = np.zeros(n)
    z[retained] = 0.9
    p = np.zeros((n, n))
    for i, j in edges:
        p[i, j] = 0.5
    return GraphSpec(relevance=np.where(z > 0, 0.9, 0.1), participation=z, edge_prior=p)


def test_lm_scores_are_summed_name_logprobs_normalised_over_the_allowed_set(spool, tiny):
    lm, tokenizer = tiny
    names = spool.pool.names
    policy = lm_policy(lm, tokenizer, names, max_task_words=12, uniform_offset=False)
    task = synthetic_tasks(make_tasks(1, seed=0))[0]
    states = [State(task), State(task, (3, 7), 600)]
    masks = np.ones((2, len(names) + 1), bool)
    masks[1, 4:15] = False
    got = policy(states, masks)

    def summed(state):  # plain forward passes over prompt + name (right-padded: causal, so harmless), no cache
        prompt = tokenizer.encode(render_state(state, names, max_task_words=12), add_special_tokens=False)
        seqs = [prompt + tokenizer.encode(" " + a, add_special_tokens=False) for a in (*names, STOP)]
        ids = np.zeros((len(seqs), max(map(len, seqs))), np.int32)
        for r, seq in enumerate(seqs):
            ids[r, : len(seq)] = seq
        logp = np.asarray(jax.jit(lambda x: jax.nn.log_softmax(lm(x), axis=-1))(jnp.asarray(ids)))
        return np.array(
            [sum(logp[r, k - 1, seq[k]] for k in range(len(prompt), len(seq))) for r, seq in enumerate(seqs)]
        )

    for r, state in enumerate(states):
        raw = np.where(masks[r], summed(state), -np.inf)
        expected = raw - np.logaddexp.reduce(raw[masks[r]])
        np.testing.assert_allclose(got[r][masks[r]], expected[masks[r]], rtol=1e-4, atol=1e-4)
        assert np.all(np.isneginf(got[r][~masks[r]]))
    # The per-action offset len * log V starts a from-scratch LM near uniform over the allowed set.
    flat = lm_policy(lm, tokenizer, names, max_task_words=12)(states[:1], masks[:1])[0]
    assert np.exp(flat).max() < 5.0 / len(flat)


def test_lm_policy_never_takes_an_action_outside_the_mask(spool, tiny):
    lm, tokenizer = tiny
    n = len(spool.pool)
    tasks = synthetic_tasks(make_tasks(6, seed=1))
    pool = spool.pool
    chain = [pool.index(a) for a in ("WordProblemParser", "MathSolver", "StepChecker", "AnalyzeAgent", "CodeWriting")]
    spec = _spec(n, chain, itertools.pairwise(chain))
    policy = lm_policy(lm, tokenizer, pool.names, max_task_words=12)
    config = RolloutConfig(max_steps=4, constraint=Constraint(True, 0.1))
    episodes = asyncio.run(
        rollout(tasks, policy, synthetic_world(spool), [spec] * len(tasks), config, np.random.default_rng(0))
    )
    steps = [s for e in episodes for s in e.steps]
    assert all(s.mask[s.action] for s in steps)
    for e in episodes:  # H: the first agent among the retained, then only along the chain's edges
        assert all(a in chain for a in e.path) and all(
            chain.index(b) == chain.index(a) + 1 for a, b in itertools.pairwise(e.path)
        )


def test_episode_ends_and_token_accounting(spool):
    pool = spool.pool
    world = synthetic_world(spool)
    tasks = synthetic_tasks(make_tasks(3, families=["math"], hard_fraction=0.0, seed=2))
    parser, solver, checker = (pool.index(a) for a in ("WordProblemParser", "MathSolver", "StepChecker"))
    n = len(pool)
    plans = {
        tasks[0].task_id: [parser, solver, n],  # STOP after two calls
        tasks[1].task_id: [solver] * 10,  # runs until the budget is spent
        tasks[2].task_id: [parser, solver, checker, checker, checker],
    }  # cut at max_steps
    episodes = asyncio.run(
        rollout(tasks, Scripted(plans), world, None, RolloutConfig(max_steps=4), np.random.default_rng(0))
    )
    stop, budget, capped = episodes
    assert stop.path == (parser, solver) and stop.steps[-1].action == n and stop.steps[-1].tokens == 0
    assert budget.cost >= tasks[1].budget and budget.steps[-2].state.spent < tasks[1].budget
    assert len(capped.path) == 4 and capped.steps[-1].action == checker
    for e in episodes:  # every call costs what the synthetic pool charges for that prefix
        expected = spool.run(e.task.source, e.path, np.random.default_rng(0)).step_tokens
        assert tuple(s.tokens for s in e.steps if s.action != n) == expected
        assert e.cost == sum(expected)
        assert e.steps[0].state.remaining == e.task.budget


def test_masks_follow_eq11_and_the_unconstrained_space_is_everything(spool):
    n = len(spool.pool)
    spec = _spec(n, [0, 1, 2], [(0, 1), (1, 2)])
    task = synthetic_tasks(make_tasks(1, seed=0))[0]
    states = [State(task), State(task, (0,), 10), State(task, (2,), 20)]
    masks = action_masks(states, [spec] * 3, Constraint(True, 0.1), n)
    assert masks[0, :3].all() and masks[0, 3:n].sum() == 0
    assert masks[1].nonzero()[0].tolist() == [1, n] and masks[2].nonzero()[0].tolist() == [n]
    assert action_masks(states, [spec] * 3, Constraint(False, 0.1), n).all()
    # conditional rule: agent 2's row has no edge at all (normalising keeps it empty); agent 0's single edge
    # is its whole row, so the mask is the same here
    conditional = action_masks(states, [spec] * 3, Constraint(True, 0.1, conditional=True), n)
    np.testing.assert_array_equal(conditional, masks)
    weak = dataclasses.replace(spec, edge_prior=spec.edge_prior * 0.01)  # every edge below 0.1, same ratios
    assert action_masks(states, [weak] * 3, Constraint(True, 0.1), n)[1].nonzero()[0].tolist() == [n]
    assert action_masks(states, [weak] * 3, Constraint(True, 0.1, conditional=True), n)[1].nonzero()[0].tolist() == [
        1,
        n,
    ]


def test_benchmark_world_runs_the_pools_prompts_through_the_backend():
    """The real-model path unchanged: agents are chat calls on any Backend (here scripted), the transcript
    is the answer, the benchmark's scorer judges it and usage is the backend's token counts."""
    pool = load_pool(("math", "auxiliary"))
    task = BenchmarkTask(
        "gsm_hard",
        "7",
        "math",
        "Tom has 3 apples and buys 4 more. How many apples?",
        "The answer is 7.",
        {"target": 7.0},
    )
    seen = []

    def agent(request):
        seen.append(request)
        return (
            "The answer is 7."
            if request.messages[0]["content"] == pool.agents[pool.index("MathSolver")].prompt
            else "Let me restate the problem."
        )

    world = benchmark_world(GSM_HARD, pool, ScriptedBackend(agent))
    tasks = benchmark_tasks([task, task], budget=10_000)
    parser, solver = pool.index("WordProblemParser"), pool.index("MathSolver")
    plans = {tasks[0].task_id: [parser, solver, len(pool)]}
    episodes = asyncio.run(rollout(tasks[:1], Scripted(plans), world, None, RolloutConfig(), np.random.default_rng(0)))
    e = episodes[0]
    assert e.correct and e.path == (parser, solver)
    assert [r.role for r in seen] == ["agent", "agent"]
    assert "Work so far:\n[WordProblemParser]\nLet me restate the problem." in seen[1].messages[1]["content"]
    words = [sum(len(m["content"].split()) for m in r.messages) for r in seen]
    assert [s.prompt_tokens for s in e.steps[:2]] == words and e.steps[1].completion_tokens == 4
    wrong = {tasks[0].task_id: [parser, len(pool)]}
    assert not asyncio.run(rollout(tasks[:1], Scripted(wrong), world, None, RolloutConfig(), np.random.default_rng(0)))[
        0
    ].correct


def test_best_achievable_matches_brute_force(spool):
    tasks = synthetic_tasks(make_tasks(6, seed=3, budget=1200))
    best = best_achievable(spool, tasks, max_steps=3)
    rng = np.random.default_rng(0)
    for task, b in zip(tasks, best, strict=False):
        top = 0.0
        for k in (1, 2, 3):
            for path in itertools.product(range(len(spool.pool)), repeat=k):
                spent = np.cumsum((0, *spool.run(task.source, path, rng).step_tokens))[:-1]
                if (spent < task.budget).all():
                    top = max(top, spool.success_probability(task.source, path))
        assert b == pytest.approx(top)


def test_oracle_ceilings_match_brute_force(spool):
    """reward_optimal and masked_optimum against every path enumerated (the same budget rule as best_achievable)."""
    tasks = synthetic_tasks(make_tasks(4, seed=5, budget=900))
    n, beta = len(spool.pool), 0.05
    rng = np.random.default_rng(0)
    family = [i for i in range(n) if spool.pool.agents[i].family in ("math", "auxiliary")]
    spec = _spec(n, family, [(i, j) for i in family for j in family if i != j and (i + j) % 3])  # a sparse H
    acc, tokens = reward_optimal(spool, tasks, 3, token_cost_weight=beta)
    cap, _ = masked_optimum(spool, tasks, {t.task_id: spec for t in tasks}, 3, Constraint(True, 0.1))
    m_acc, m_tokens = masked_optimum(
        spool, tasks, {t.task_id: spec for t in tasks}, 3, Constraint(True, 0.1), token_cost_weight=beta
    )
    for k, task in enumerate(tasks):
        best, best_h, cap_h = (-np.inf, 0, 0), (-np.inf, 0, 0), 0.0
        for length in (1, 2, 3):
            for path in itertools.product(range(n), repeat=length):
                out = spool.run(task.source, path, rng)
                if sum(out.step_tokens[:-1]) >= task.budget:
                    continue
                score = (out.probability - beta * out.cost / 1000, out.probability, out.cost)
                best = max(best, score, key=lambda x: x[0])
                allowed = all(spec.participation[a] > 0 for a in path) and all(
                    spec.edge_prior[a, b] > 0.1 for a, b in itertools.pairwise(path)
                )
                if allowed:
                    best_h = max(best_h, score, key=lambda x: x[0])
                    cap_h = max(cap_h, out.probability)
        assert (acc[k], tokens[k]) == (pytest.approx(best[1]), pytest.approx(best[2]))
        assert (m_acc[k], m_tokens[k]) == (pytest.approx(best_h[1]), pytest.approx(best_h[2]))
        assert cap[k] == pytest.approx(cap_h)


def test_committed_optimum_matches_brute_force(spool):
    """One sequence per family, each task running the prefix the rollout would (calls start while tokens remain):
    the best mean score over every sequence enumerated, bystanders and repeats included."""
    tasks = synthetic_tasks(make_tasks(7, seed=5, budget=700))  # a budget small enough to cut sequences short
    n, beta, steps = len(spool.pool), 0.05, 3
    rng = np.random.default_rng(0)

    def executed(task, path):
        out = spool.run(task.source, path, rng)
        k = int(np.sum(np.cumsum((0, *out.step_tokens))[:-1] < task.budget))
        return spool.success_probability(task.source, path[:k]), sum(out.step_tokens[:k])

    for weight in (0.0, beta):
        acc, tokens, paths = committed_optimum(spool, tasks, steps, token_cost_weight=weight)
        assert sorted(paths) == ["code", "math", "qa"]
        for family, path in paths.items():
            members = [m for m, t in enumerate(tasks) if t.source.family == family]
            runs = [executed(tasks[m], path) for m in members]
            assert [(acc[m], tokens[m]) for m in members] == [pytest.approx(r) for r in runs]
            top = max(
                np.mean([p - weight * c / 1000 for p, c in (executed(tasks[m], seq) for m in members)])
                for length in range(1, steps + 1)
                for seq in itertools.product(range(n), repeat=length)
            )
            assert np.mean(acc[members] - weight * tokens[members] / 1000) == pytest.approx(top)
    assert (acc <= best_achievable(spool, tasks, steps) + 1e-9).all()


def test_transition_matrix_and_top2_mass():
    task = synthetic_tasks(make_tasks(1, seed=0))[0]
    n = 3

    def episode(path, stop, probs):
        steps, history = [], ()
        for a in (*path, n) if stop else path:
            steps.append(Step(State(task, history), np.ones(n + 1, bool), np.log(np.asarray(probs)), a))
            history += (a,) if a != n else ()
        return Episode(task, tuple(steps), "", True)

    probs = [0.5, 0.3, 0.1, 0.1]
    episodes = [episode((0, 1), True, probs), episode((0, 2), False, probs)]
    m = transition_matrix(episodes, n)
    np.testing.assert_allclose(m[0], [1.0, 0.0, 0.0, 0.0])  # START -> agent 0 twice
    np.testing.assert_allclose(m[1], [0.0, 0.5, 0.5, 0.0])  # agent 0 -> 1 once, -> 2 once
    np.testing.assert_allclose(m[2], [0.0, 0.0, 0.0, 1.0])  # agent 1 -> STOP
    assert m[3].sum() == 0  # agent 2 ended by the budget: no transition out
    assert top2_mass(episodes) == pytest.approx(0.8)


def test_head_policy_starts_uniform_over_the_allowed_set(spool):
    task = synthetic_tasks(make_tasks(1, seed=0))[0]
    n = len(spool.pool)
    policy = head_policy({task.task_id: np.ones(16, np.float32)}, n, 6)
    masks = np.zeros((1, n + 1), bool)
    masks[0, [1, 5, n]] = True
    np.testing.assert_allclose(np.exp(policy([State(task)], masks)[0][[1, 5, n]]), 1 / 3, rtol=1e-6)


def test_an_agent_prompt_over_the_context_length_is_answered_empty_and_other_failures_propagate():
    from porch_jax.backends import BackendError, ChatRequest
    from porch_jax.maca.orchestrator import answer

    class Refusing:
        def __init__(self, message, kind=None):
            self.error = BackendError(message, kind=kind)

        async def chat(self, request):
            raise self.error

    request = ChatRequest(messages=[{"role": "user", "content": "x"}], role="agent")
    over = asyncio.run(answer(Refusing("This model's maximum context length is 4096 tokens"), request))
    assert (over.text, over.finish_reason, over.prompt_tokens, over.completion_tokens) == ("", "context_length", 0, 0)
    with pytest.raises(BackendError, match="server down"):
        asyncio.run(answer(Refusing("server down", kind="server"), request))
