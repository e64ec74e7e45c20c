"""The adaptive baselines on scripted models, each mechanism shown where it can fail: MaAS's controller learns the
cheap right operator per kind of query and exits early when that is free and right, and a sampled architecture is
what runs; Puppeteer's REINFORCE learns the right agent per kind of query, its per-step cost makes it stop sooner,
and its trajectory is the agents it chose.

The scripted world: two kinds of math task (alpha: apples, beta: trains) whose answer is 7. MaAS's team (WordProblemParser, MathSolver,
ArithmeticChecker): on alpha tasks only the first agent is right, so CoT (the first agent alone) is right and a vote
of the team wrong; on beta tasks the other two are right, so the vote is right and CoT wrong. Puppeteer: MathSolver
is right on alpha tasks, AlgebraSimplifier on beta tasks, every other agent wrong."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from recorder import POOL, Recorder, check_cost

from porch_jax.envs.benchmarks.answers import extract_number
from porch_jax.envs.benchmarks.base import BenchmarkTask
from porch_jax.maca.adaptive import (
    EARLY_EXIT,
    OPERATORS,
    Learned,
    MaasController,
    PuppeteerPolicy,
    architecture_score,
    maas,
    maas_controller,
    operator_probs,
    puppeteer,
    puppeteer_policy,
    run_architecture,
    sample_architecture,
    softmax,
    state_features,
    train_maas,
    train_puppeteer,
)
from porch_jax.maca.encoder import HashingEncoder
from porch_jax.maca.multi_agent import adaptive_query, run_system, train_adaptive
from porch_jax.maca.settings import ADAPTIVE, BASELINES, AdaptiveTraining, MaasConfig

ENCODER = HashingEncoder(64)
COT, ENSEMBLE = OPERATORS.index("cot"), OPERATORS.index("ensemble")


TOPICS = {
    "alpha": "Tom picks apples in the orchard and packs them into baskets",
    "beta": "A train crosses rivers and bridges between distant cities",
}


def task(kind: str, i: int) -> BenchmarkTask:
    prompt = f"Problem {i}. {TOPICS[kind]}."
    return BenchmarkTask("scripted", f"{kind}-{i}", "math", prompt, "The answer is 7.", {"target": 7.0})


TRAIN = [task(kind, i) for i in range(4) for kind in ("alpha", "beta")]
HELD_OUT = [task(kind, i) for i in range(10, 13) for kind in ("alpha", "beta")]


def check(t: BenchmarkTask, answer: str) -> bool:
    return extract_number(answer) == 7


def kind_of(call) -> str:
    return "alpha" if TOPICS["alpha"] in call.prompt else "beta"


def team_model(call, _):
    """MaAS's world: the first team agent right on alpha tasks, the other two on beta tasks; critics find no
    issue."""
    if call.role == "critic":
        return "NO ISSUES"
    right = (call.agent == "WordProblemParser") == (kind_of(call) == "alpha")
    return f"The answer is {7 if right else 5}."


def solver_model(call, _):
    """Puppeteer's world: MathSolver right on alpha tasks, AlgebraSimplifier on beta tasks."""
    right = {"alpha": "MathSolver", "beta": "AlgebraSimplifier"}[kind_of(call)]
    return f"The answer is {7 if call.agent == right else 5}."


def queries(name, tasks):
    return [adaptive_query(name, t, POOL) for t in tasks]


def embedding(t: BenchmarkTask) -> np.ndarray:
    return ENCODER.encode([t.prompt])[0]


# ---------------------------------------------------------------- MaAS

MAAS = MaasConfig(iterations=40, tasks_per_iteration=4, samples=8, learning_rate=2.0, token_cost_weight=1.0)


@pytest.fixture(scope="module")
def trained_maas() -> MaasController:
    rec = Recorder(team_model)
    controller, history = asyncio.run(train_maas(rec.backend, queries("maas", TRAIN), check, ENCODER, MAAS))
    assert len(history) == MAAS.iterations and history[-1]["reward"] > history[0]["reward"]
    return controller


def greedy(controller: MaasController, t: BenchmarkTask) -> tuple[str, ...]:
    return tuple(OPERATORS[op] for op in sample_architecture(controller, embedding(t), None, greedy=True))


def test_maas_learns_the_cheap_right_operator_for_each_kind_of_query(trained_maas):
    start = maas_controller(ENCODER.dim, MAAS.layers)
    for t in HELD_OUT:  # new tasks of the two kinds: the controller conditions on the query, not its id
        right = COT if t.task_id.startswith("alpha") else ENSEMBLE
        before = operator_probs(start, embedding(t), 0)[right]
        after = operator_probs(trained_maas, embedding(t), 0)[right]
        assert before == pytest.approx(0.25) and after > 0.5, (t.task_id, after)


def test_maas_architecture_differs_across_queries_as_the_controller_learns(trained_maas):
    start = maas_controller(ENCODER.dim, MAAS.layers)
    assert len({greedy(start, t) for t in HELD_OUT}) == 1  # the uniform supernet: one architecture for all
    assert {greedy(trained_maas, t) for t in HELD_OUT if t.task_id.startswith("alpha")} == {("cot", "early_exit")}
    assert {greedy(trained_maas, t) for t in HELD_OUT if t.task_id.startswith("beta")} == {("ensemble", "early_exit")}


def test_maas_exits_early_when_that_is_free_and_right(trained_maas):
    """After CoT on an alpha task the answer is right: any further operator only costs, or (the team's vote)
    makes it wrong, so the controller learns to exit at the second layer."""
    start = maas_controller(ENCODER.dim, MAAS.layers)
    for t in (t for t in HELD_OUT if t.task_id.startswith("alpha")):
        before = operator_probs(start, embedding(t), 1, COT)[EARLY_EXIT]
        after = operator_probs(trained_maas, embedding(t), 1, COT)[EARLY_EXIT]
        assert before == pytest.approx(0.2) and after > 0.5
    assert operator_probs(start, embedding(HELD_OUT[0]), 0)[EARLY_EXIT] == 0.0  # never before an answer exists


def expected_calls(architecture: tuple[int, ...], team: tuple[str, ...]) -> list[tuple[str, str]]:
    """(role, agent) of every call an architecture makes in the critic-finds-an-issue world."""
    calls: list[tuple[str, str]] = []
    for layer, op in enumerate(architecture):
        name = OPERATORS[op]
        if name == "early_exit":
            break
        if name == "cot":
            calls.append(("agent", team[0]))
        elif name == "ensemble":
            calls += [("agent", a) for a in team]
        elif name == "self_refine":
            calls += [("agent", team[0])] * (layer == 0) + [("critic", team[0]), ("solver", team[0])]
        else:  # debate: two rounds of the team
            calls += [("agent", a) for a in team] * 2
    return calls


def test_maas_runs_the_architecture_it_sampled():
    rng = np.random.default_rng(0)
    controller = MaasController(rng.normal(scale=2.0, size=maas_controller(ENCODER.dim, 3).weights.shape))
    query = adaptive_query("maas", TRAIN[0], POOL)
    team = tuple(a.name for a in query.agents)
    seen = set()
    for seed in range(12):
        rec = Recorder(lambda call, n: "The sum is off." if call.role == "critic" else f"Draft {n}. The answer is 7.")
        run = asyncio.run(maas(rec.backend, query, controller, ENCODER, rng=np.random.default_rng(seed), greedy=False))
        architecture = tuple(OPERATORS.index(op) for op in run.result.path)
        assert run.result.path == tuple(OPERATORS[op] for op in architecture) and len(architecture) <= 3
        assert [(c.role, c.agent) for c in rec.calls] == expected_calls(architecture, team)
        check_cost(run.result, rec)
        seen.add(architecture)
    assert len(seen) > 3  # the draws cover several architectures, each executed as drawn


def test_maas_score_is_the_gradient_of_the_architectures_log_probability():
    """REINFORCE's term, checked by finite differences of log Q(architecture | query) = sum of its layers' log
    probabilities."""
    rng = np.random.default_rng(3)
    controller = MaasController(rng.normal(size=maas_controller(8, 3).weights.shape))
    x = rng.normal(size=8)
    architecture = (ENSEMBLE, COT, EARLY_EXIT)

    def log_q(weights):
        c = MaasController(weights)
        return sum(
            np.log(operator_probs(c, x, layer, architecture[layer - 1] if layer else -1)[op])
            for layer, op in enumerate(architecture)
        )

    grad = architecture_score(controller, x, architecture)
    for index in [tuple(rng.integers(0, n) for n in grad.shape) for _ in range(20)] + [(0, 8, EARLY_EXIT)]:
        bumped = controller.weights.copy()
        bumped[index] += 1e-6
        assert grad[index] == pytest.approx((log_q(bumped) - log_q(controller.weights)) / 1e-6, abs=1e-4)
    assert not grad[0, :, EARLY_EXIT].any()  # exit is not offered at the first layer


def test_maas_layers_read_the_previous_answer():
    rec = Recorder(lambda call, n: f"Layer note {len(rec.calls)}. The answer is 7.")
    query = adaptive_query("maas", TRAIN[0], POOL)
    result = asyncio.run(run_architecture(rec.backend, query, (COT, COT, EARLY_EXIT)))
    assert "Layer note" not in rec.calls[0].prompt and "Layer note 0." in rec.calls[1].prompt
    assert result.answer == rec.calls[1].reply and result.path == ("cot", "cot", "early_exit")


# ---------------------------------------------------------------- Puppeteer

PUPPETEER = AdaptiveTraining(
    iterations=60, tasks_per_iteration=4, samples=8, learning_rate=2.0, token_cost_weight=0.0, step_cost=0.2
)
MAX_STEPS = 3


def train(config: AdaptiveTraining) -> PuppeteerPolicy:
    rec = Recorder(solver_model)
    policy, history = asyncio.run(
        train_puppeteer(
            rec.backend, queries("puppeteer", TRAIN), POOL, check, ENCODER, config, max_steps=MAX_STEPS, seed=1
        )
    )
    assert len(history) == config.iterations
    return policy


@pytest.fixture(scope="module")
def trained_puppeteer() -> PuppeteerPolicy:
    return train(PUPPETEER)


def test_puppeteer_learns_the_right_agent_for_each_kind_of_query(trained_puppeteer):
    n = len(POOL)
    for t in HELD_OUT:  # new tasks of the two kinds
        query = adaptive_query("puppeteer", t, POOL)
        allowed = np.zeros(n + 1, bool)
        allowed[[POOL.index(a.name) for a in query.agents]] = True
        assert allowed.sum() == 10  # the math and auxiliary agents: chance is 1 in 10
        right = "MathSolver" if t.task_id.startswith("alpha") else "AlgebraSimplifier"
        x = state_features(embedding(t), np.zeros(ENCODER.dim), -1, 0, n, MAX_STEPS)
        assert softmax(x @ trained_puppeteer.weights, allowed)[POOL.index(right)] > 0.5
        rec = Recorder(solver_model)
        run = asyncio.run(puppeteer(rec.backend, query, POOL, trained_puppeteer, ENCODER, max_steps=MAX_STEPS))
        assert run.result.path == (right,) and check(t, run.result.answer), (t.task_id, run.result.path)


def mean_calls(policy: PuppeteerPolicy, episodes: int = 64) -> float:
    rec = Recorder(solver_model)
    runs = [
        asyncio.run(
            puppeteer(
                rec.backend,
                adaptive_query("puppeteer", TRAIN[k % len(TRAIN)], POOL),
                POOL,
                policy,
                ENCODER,
                max_steps=MAX_STEPS,
                rng=np.random.default_rng(k),
                greedy=False,
            )
        )
        for k in range(episodes)
    ]
    return float(np.mean([r.result.calls for r in runs]))


def test_puppeteer_per_step_cost_makes_it_stop_sooner(trained_puppeteer):
    free = train(AdaptiveTraining(**{**PUPPETEER.__dict__, "step_cost": 0.0}))
    assert mean_calls(trained_puppeteer) < mean_calls(free) - 0.2
    assert mean_calls(trained_puppeteer) < 1.3  # with the cost: one agent, then TERMINATE


def test_puppeteer_trajectory_is_the_agents_it_chose():
    """A hand-set policy that chains START -> StepChecker -> MathSolver -> TERMINATE: the calls are those agents,
    in that order, each reading the work before it; the answer is the last agent's reply."""
    n = len(POOL)
    policy = puppeteer_policy(ENCODER.dim, n)
    onehot = 2 * ENCODER.dim  # where the previous agent's one-hot starts in the state features
    chain = [(-1, POOL.index("StepChecker")), (POOL.index("StepChecker"), POOL.index("MathSolver"))]
    for prev, nxt in (*chain, (POOL.index("MathSolver"), n)):
        policy.weights[onehot + prev + 1, nxt] = 20.0
    rec = Recorder(lambda call, _: f"{call.agent} says the answer is 7.")
    run = asyncio.run(
        puppeteer(rec.backend, adaptive_query("puppeteer", TRAIN[0], POOL), POOL, policy, ENCODER, max_steps=4)
    )
    assert run.result.path == ("StepChecker", "MathSolver") == tuple(c.agent for c in rec.calls)
    assert "[StepChecker]\nStepChecker says" in rec.calls[1].prompt and run.result.answer == rec.calls[1].reply
    assert run.result.decisions == 3  # two agents, then TERMINATE
    check_cost(run.result, rec)
    other = [a for a in POOL if a.family not in ("math", "auxiliary")][0]
    policy.weights[onehot, POOL.index(other.name)] = 50.0  # an agent of another family is never picked
    rec = Recorder(lambda call, _: "The answer is 7.")
    run = asyncio.run(
        puppeteer(rec.backend, adaptive_query("puppeteer", TRAIN[0], POOL), POOL, policy, ENCODER, max_steps=4)
    )
    assert run.result.path[0] == "StepChecker"


# ---------------------------------------------------------------- by name


def test_adaptive_systems_train_and_run_by_name():
    assert set(ADAPTIVE) <= set(BASELINES)
    small = {"iterations": 2, "tasks_per_iteration": 2, "samples": 2}
    rec, lines = Recorder(team_model), []
    learned, history = asyncio.run(
        train_adaptive(
            ADAPTIVE,
            rec.backend,
            TRAIN,
            POOL,
            check,
            ENCODER,
            maas_config=MaasConfig(**small),
            puppeteer_config=AdaptiveTraining(**small),
            max_steps=2,
            log=lines.append,
        )
    )
    assert learned.maas is not None and learned.puppeteer is not None and set(history) == set(ADAPTIVE)
    for name in ADAPTIVE:  # a line at most every 30 s and at the last iteration, with its figures, rate and ETA
        mine = [line for line in lines if line.startswith(f"{name} training: iteration")]
        assert mine and mine[-1].startswith(f"{name} training: iteration 2/2: reward "), lines
        assert "iterations/s, ETA 0:00:00" in mine[-1], lines
    for name in ADAPTIVE:
        rec = Recorder(team_model)
        result = asyncio.run(run_system(name, rec.backend, HELD_OUT[0], POOL, None, learned=learned, max_steps=2))
        assert result.calls >= 1 and result.path, name
        check_cost(result, rec)
        with pytest.raises(ValueError, match="learned"):
            asyncio.run(run_system(name, rec.backend, HELD_OUT[0], POOL, None, learned=Learned(ENCODER)))


def test_the_config_refuses_training_without_a_baseline():
    from porch_jax.maca.config import MacaConfig
    from porch_jax.typed_config import ConfigError, from_dict

    with pytest.raises(ConfigError, match="puppeteer.samples"):
        from_dict(MacaConfig, {"run_dir": "unused", "baselines": {"puppeteer": {"samples": 1}}})
    with pytest.raises(ConfigError, match="maas.layers"):
        from_dict(MacaConfig, {"run_dir": "unused", "baselines": {"maas": {"layers": 0}}})
