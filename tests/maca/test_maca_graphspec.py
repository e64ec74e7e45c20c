"""Eq. 4, 5, 6 and 7 against independent NumPy transcriptions of the paper's formulas."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from porch_jax.maca.edges import (
    EdgeMLP,
    EdgePolicy,
    SuccessBuffer,
    edge_policy_loss,
    edge_probabilities,
    path_labels,
    prior_learning_round,
    sample_edges,
    with_start_node,
)
from porch_jax.maca.graphspec import (
    BudgetTemperature,
    build_graphspec,
    edge_prior,
    gate,
    relevance,
)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


@pytest.mark.parametrize("standardize", [True, False])
@pytest.mark.parametrize("budget", [500, 2000, 8000])
def test_relevance_and_gate_match_eq4(standardize, budget):
    rng = np.random.default_rng(0)
    agents, task = rng.normal(size=(22, 16)), rng.normal(size=16)
    beta = 0.25 * (budget / 2000.0) ** 0.5
    cos = np.array([a @ task / (np.linalg.norm(a) * np.linalg.norm(task)) for a in agents])
    s = (cos - cos.mean()) / cos.std() if standardize else cos
    q_np = _sigmoid(s / beta)
    z_np = np.where(q_np >= 0.4, q_np, 0.0)

    temperature = BudgetTemperature()(budget)
    q = relevance(
        jnp.asarray(task, jnp.float32), jnp.asarray(agents, jnp.float32), temperature, standardize=standardize
    )
    np.testing.assert_allclose(temperature, beta, rtol=1e-12)
    np.testing.assert_allclose(q, q_np, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gate(q, 0.4), z_np, rtol=1e-4, atol=1e-5)
    assert 0 < (z_np > 0).sum() < 22  # the gate both keeps and drops agents here


def test_larger_budget_keeps_more_agents():
    rng = np.random.default_rng(1)
    agents, task = jnp.asarray(rng.normal(size=(22, 16))), jnp.asarray(rng.normal(size=16))
    kept = [int((gate(relevance(task, agents, BudgetTemperature()(b))) > 0).sum()) for b in (250, 2000, 32000)]
    assert kept[0] <= kept[1] <= kept[2] and kept[0] < kept[2]


def test_edge_prior_matches_eq7():
    rng = np.random.default_rng(2)
    p, q = rng.uniform(size=(6, 6)), rng.uniform(size=6)
    expected = np.array([[p[i, j] * q[j] for j in range(6)] for i in range(6)])
    np.testing.assert_allclose(edge_prior(jnp.asarray(p), jnp.asarray(q)), expected, rtol=1e-6)


def test_build_graphspec_combines_eq4_and_eq7():
    rng = np.random.default_rng(3)
    agents, context, p = rng.normal(size=(8, 16)), rng.normal(size=16), rng.uniform(size=(8, 8))
    spec = build_graphspec(context, agents, 2000, p)
    q = np.asarray(relevance(jnp.asarray(context), jnp.asarray(agents), BudgetTemperature()(2000)))
    np.testing.assert_allclose(spec.relevance, q, rtol=1e-6)
    np.testing.assert_allclose(spec.edge_prior, p * q[None, :], rtol=1e-5)
    np.testing.assert_array_equal(spec.retained, q >= 0.4)


def _eq5_numpy(logits, graphs, utility, lam):
    n = logits.shape[0]
    total = 0.0
    for graph, u in zip(graphs, utility, strict=False):
        total += -u * sum(np.log(_sigmoid(logits[i, j])) for i in range(n) for j in range(n) if i != j and graph[i, j])
    r_s = sum(_sigmoid(logits[i, j]) for i in range(n) for j in range(n) if i != j) / n
    return total / len(graphs) + lam * r_s


def test_edge_policy_loss_and_gradient_match_eq5():
    rng = np.random.default_rng(4)
    n, k, lam = 5, 6, 0.3
    logits = rng.normal(size=(n, n))
    graphs = rng.uniform(size=(k, n, n)) < 0.5
    utility = np.array([1, 0, 1, 1, 0, 1], np.float64)
    loss = edge_policy_loss(jnp.asarray(logits), jnp.asarray(graphs), jnp.asarray(utility), sparsity_weight=lam)
    np.testing.assert_allclose(loss, _eq5_numpy(logits, graphs, utility, lam), rtol=1e-5)

    # dL/dl_ij = -(1/K) sum_k U_k [e_ij in G_k] (1 - sigma) + (lambda / N) sigma (1 - sigma), off the diagonal
    sig = _sigmoid(logits)
    present = (graphs * utility[:, None, None]).mean(0)
    grad_np = (-present * (1 - sig) + lam / n * sig * (1 - sig)) * (1 - np.eye(n))
    grad = jax.grad(edge_policy_loss)(
        jnp.asarray(logits), jnp.asarray(graphs), jnp.asarray(utility), sparsity_weight=lam
    )
    np.testing.assert_allclose(grad, grad_np, rtol=1e-4, atol=1e-6)


def test_edge_policy_update_favours_edges_of_successful_graphs():
    policy = EdgePolicy.create(3, learning_rate=0.1, sparsity_weight=0.1)
    good = np.zeros((2, 3, 3), bool)
    good[:, 0, 1] = True
    bad = np.zeros((2, 3, 3), bool)
    bad[:, 1, 2] = True
    for _ in range(20):
        policy.update(np.concatenate([good, bad]), np.array([1, 1, 0, 0], np.float32))
    probs = policy.probs
    assert probs[0, 1] > 0.8 and probs[1, 2] < 0.5 and probs[2, 0] < 0.5


def test_sample_edges_is_bernoulli_without_self_loops():
    logits = jnp.array([[0.0, 2.0, -2.0], [0.0, 0.0, 0.0], [1.0, -1.0, 0.0]])
    graphs = np.asarray(sample_edges(jax.random.key(0), logits, 4000))
    assert not graphs[:, np.arange(3), np.arange(3)].any()
    off = ~np.eye(3, dtype=bool)
    np.testing.assert_allclose(graphs.mean(0)[off], _sigmoid(np.asarray(logits))[off], atol=0.03)


def test_edge_mlp_equals_an_mlp_on_the_concatenation():
    d, h, n = 8, 16, 5
    mlp = EdgeMLP(d, h, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(5)
    agents, task = rng.normal(size=(n, d)).astype(np.float32), rng.normal(size=d).astype(np.float32)
    w1 = np.concatenate(
        [np.asarray(mlp.src.kernel[...]), np.asarray(mlp.dst.kernel[...]), np.asarray(mlp.task.kernel[...])]
    )
    b1 = np.asarray(mlp.src.bias[...])

    def numpy_mlp(x):
        x = np.maximum(x @ w1 + b1, 0)
        x = np.maximum(x @ np.asarray(mlp.hidden.kernel[...]) + np.asarray(mlp.hidden.bias[...]), 0)
        return (x @ np.asarray(mlp.out.kernel[...]) + np.asarray(mlp.out.bias[...]))[0]

    expected = np.array(
        [[_sigmoid(numpy_mlp(np.concatenate([agents[i], agents[j], task]))) for j in range(n)] for i in range(n)]
    )
    np.testing.assert_allclose(edge_probabilities(mlp, agents, task), expected, rtol=1e-4, atol=1e-6)


def test_path_labels_and_buffer_keep_only_successes():
    targets, mask = path_labels([2, 0, 3], 4)
    assert targets[2, 0] == targets[0, 3] == 1 and targets.sum() == 2
    np.testing.assert_array_equal(mask.sum(1), [3, 0, 3, 3])  # visited rows, diagonal excluded
    buffer = SuccessBuffer(capacity=2)
    buffer.add(np.ones(3), [0, 1], success=False)
    buffer.add(np.ones(3), [], success=True)
    assert len(buffer) == 0
    for path in ([0, 1], [1, 2], [2, 0]):
        buffer.add(np.ones(3), path, success=True)
    _, targets, _ = buffer.arrays(3)
    assert len(buffer) == 2 and targets.shape == (2, 3, 3) and targets[-1, 2, 0] == 1


def test_start_node_labels_the_first_agent_and_nothing_enters_it():
    targets, mask = path_labels([2, 0, 3], 4, with_start=True)
    assert targets.shape == (5, 5) and targets[4, 2] == 1 and targets[2, 0] == targets[0, 3] == 1 and targets.sum() == 3
    np.testing.assert_array_equal(mask[:, 4], 0)  # START is never a target
    np.testing.assert_array_equal(mask[4, :4], 1)  # its row is labelled over every agent
    np.testing.assert_array_equal(mask.sum(1), [3, 0, 3, 3, 4])
    np.testing.assert_array_equal(with_start_node(np.ones((4, 3)))[-1], 0)
    spec = build_graphspec(np.ones(3), np.eye(4, 3) + 0.1, 2000.0, np.full((5, 5), 0.5))
    np.testing.assert_allclose(spec.start_prior, 0.5 * spec.relevance)  # Eq. 7 modulates the START row too
    assert spec.edge_prior.shape == (4, 4)


@pytest.mark.parametrize("credit", ["sampled", "executed"])
def test_prior_learning_round_credits_the_sampled_or_the_executed_edges(credit):
    """The walk 0 -> 1 always succeeds: with executed credit only edge (0, 1) is pushed up, with the paper's
    literal reading every edge of the sampled graph is (and the sparsity term is the only counterweight)."""
    n = 4
    policy = EdgePolicy.create(n, sparsity_weight=0.0, learning_rate=0.1)
    buffer = SuccessBuffer()
    allowed = np.ones((1, n), bool)
    prior_learning_round(
        policy,
        jax.random.key(0),
        np.ones((1, 3)),
        allowed,
        lambda m, graph: ([0, 1], True, 10),
        buffer,
        samples=8,
        credit=credit,
    )
    moved = policy.probs > 0.5 + 1e-3
    off = ~np.eye(n, dtype=bool)
    if credit == "executed":
        assert moved[0, 1] and moved.sum() == 1
    else:
        assert moved[off].sum() > 1
    assert len(buffer) == 8
    with pytest.raises(ValueError):
        prior_learning_round(
            policy, jax.random.key(0), np.ones((1, 3)), allowed, lambda m, g: ([0], True, 5), buffer, credit="all"
        )


def test_prior_learning_round_keeps_only_the_cheapest_successes():
    """keep_cheapest: of a task's K walks only the successful ones of least cost enter the buffer (ties kept)."""
    runs = [([0, 1, 2], True, 30), ([1, 2], True, 20), ([2, 0], True, 20), ([0], False, 5)]
    policy = EdgePolicy.create(3, sparsity_weight=0.0)
    for cheapest, expected in ((True, {(1, 2), (2, 0)}), (False, {(0, 1, 2), (1, 2), (2, 0)})):
        outcomes = iter(runs)
        buffer = SuccessBuffer()
        prior_learning_round(
            policy,
            jax.random.key(0),
            np.ones((1, 3)),
            np.ones((1, 3), bool),
            lambda m, g, outcomes=outcomes: next(outcomes),
            buffer,
            samples=4,
            keep_cheapest=cheapest,
        )
        assert {path for _, path in buffer._items} == expected


def test_gate_sparsity_counts_the_retained_family_agents():
    """Fig. 8's precision / recall against a hand count on a two-family pool with an auxiliary agent (in every
    task's domain for precision, in no family for recall)."""
    from porch_jax.maca.analysis import gate_sparsity
    from porch_jax.maca.orchestrator import OrchestrationTask
    from porch_jax.maca.pools import Agent, AgentPool

    pool = AgentPool(
        tuple(
            Agent(name, family, "d", "p")
            for name, family in (("M1", "math"), ("M2", "math"), ("C1", "code"), ("A1", "auxiliary"))
        )
    )
    tasks = [OrchestrationTask("m", "x", 100, "math"), OrchestrationTask("c", "y", 100, "code")]
    q = np.array(
        [
            [0.9, 0.5, 0.7, 0.2],  # math task: M1, M2 family; C1 off-domain
            [0.1, 0.6, 0.3, 0.8],
        ]
    )  # code task: C1 family
    low, mid, high = gate_sparsity(q, tasks, pool, (0.25, 0.55, 0.95))
    # gamma 0.25: math keeps M1 M2 C1 (precision 2/3, recall 1); code keeps M2 C1 A1 (2/3, recall 1)
    assert low == pytest.approx({"gamma": 0.25, "precision": 2 / 3, "recall": 1.0, "full_recall": 1.0, "retained": 3.0})
    # gamma 0.55: math keeps M1 C1 (1/2, recall 1/2); code keeps M2 A1 (1/2, recall 0)
    assert mid == pytest.approx({"gamma": 0.55, "precision": 0.5, "recall": 0.25, "full_recall": 0.0, "retained": 2.0})
    assert np.isnan(high["precision"]) and high["retained"] == 0.0 and high["recall"] == 0.0
    with pytest.raises(ValueError, match="expected"):
        gate_sparsity(q[:, :3], tasks, pool, (0.5,))
