"""MACA training: the GRPO objective against a NumPy transcription, the Eq. 12 returns and Eq. 9 advantages,
the Table 3 GraphSpec ablations, a training smoke run with an Orbax checkpoint round trip, learning on the
synthetic pool (head and LM policies, slow) and the real-benchmark launcher path with a scripted backend."""

from __future__ import annotations

import dataclasses
import itertools
import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from oracles import maca_loss

from porch_jax.maca.analysis import Study, evaluate, learning_curve, run_variant
from porch_jax.maca.config import MacaConfig
from porch_jax.maca.encoder import HashingEncoder
from porch_jax.maca.graphspec import BudgetTemperature, GraphSpec, context_text
from porch_jax.maca.lm_policy import HeadScorer, head_policy, lm_policy, tiny_lm
from porch_jax.maca.orchestrator import (
    Constraint,
    OrchestrationTask,
    RolloutConfig,
    State,
    synthetic_tasks,
    synthetic_world,
)
from porch_jax.maca.policy import masked_log_probs, prior_action_probs, structural_mask
from porch_jax.maca.prior import (
    PriorConfig,
    PriorPolicy,
    committed_next,
    edge_probs,
    learn_edge_mlp,
    most_probable_path,
    relevance_scores,
)
from porch_jax.maca.settings import VARIANTS
from porch_jax.maca.synthetic import SyntheticPool, make_tasks
from porch_jax.maca.train import (
    GroupDecisions,
    GRPOConfig,
    graphspecs,
    group_targets,
    make_optimizer,
    restore_params,
    train_grpo,
)
from porch_jax.train.checkpoint import Checkpointer
from porch_jax.train.methods import METHODS, MethodConfig, make_method
from porch_jax.train.views import ActionsView
from porch_jax.typed_config import ConfigError, from_dict, to_dict

REPO = pathlib.Path(__file__).resolve().parents[2]


def _timeless(row):
    """A training history row without its wall time and held-out probe metrics: what must repeat exactly."""
    return {k: v for k, v in row.items() if k != "seconds" and not k.startswith("heldout_")}


def _log_softmax(x, mask):
    x = np.where(mask, x, -np.inf)
    return x - np.logaddexp.reduce(x, axis=-1, keepdims=True)


def test_maca_loss_matches_numpy():
    rng = np.random.default_rng(0)
    d, a, lam = 5, 4, 0.7
    mask = rng.random((d, a)) < 0.7
    mask[:, -1] = True
    logits, ref = rng.normal(size=(2, d, a))
    prior = rng.random((d, a)) * mask
    prior /= prior.sum(-1, keepdims=True)
    actions = np.array([np.flatnonzero(m)[0] for m in mask])
    adv = rng.normal(size=d)
    valid = np.array([1, 1, 1, 1, 0], bool)
    log_pi = _log_softmax(logits, mask)
    with np.errstate(divide="ignore"):
        mix = np.log(0.5 * (np.exp(_log_softmax(ref, mask)) + prior))
    old = log_pi[np.arange(d), actions] + np.array([0.0, 0.5, -0.5, 0.1, 0.0])  # ratios 1, e^-0.5, e^0.5, e^-0.1

    ratio = np.exp(log_pi[np.arange(d), actions] - old)
    surrogate = -np.minimum(ratio * adv, np.clip(ratio, 0.8, 1.2) * adv)
    kl = np.array(
        [sum(np.exp(log_pi[t, k]) * (log_pi[t, k] - mix[t, k]) for k in range(a) if mask[t, k]) for t in range(d)]
    )
    expected = surrogate[valid].mean() + lam * kl[valid].mean()

    loss, metrics = maca_loss(
        jnp.asarray(log_pi),
        jnp.asarray(actions),
        jnp.asarray(old),
        jnp.asarray(adv),
        jnp.asarray(valid),
        jnp.asarray(mix),
        clip_eps=0.2,
        prior_kl_weight=lam,
    )
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    np.testing.assert_allclose(metrics["kl_mix"], kl[valid].mean(), rtol=1e-5)

    def f(x):
        lp = jax.nn.log_softmax(jnp.where(mask, x, -jnp.inf))
        return maca_loss(
            lp,
            jnp.asarray(actions),
            jnp.asarray(old),
            jnp.asarray(adv),
            jnp.asarray(valid),
            jnp.asarray(mix),
            clip_eps=0.2,
            prior_kl_weight=lam,
        )[0]

    grad = np.asarray(jax.grad(f)(jnp.asarray(logits)))
    assert np.isfinite(grad).all() and np.all(grad[~mask] == 0) and np.all(grad[~valid] == 0)


def _targets(old, ref, prior, valid, episode, step, tokens, correct, step_mask, *, lam, actions=None, **cfg):
    """group_targets of one iteration's arrays (without actions: the exact per-state KL)."""
    decisions = GroupDecisions(
        old=old,
        ref=ref,
        prior=prior,
        valid=valid,
        actions=np.zeros(len(valid), np.int32) if actions is None else actions,
        episode=episode,
        step=step,
        tokens=tokens,
        step_mask=step_mask,
        correct=correct,
    )
    grpo = GRPOConfig(token_unit=1000.0, advantage_eps=0.1, kl_sample=actions is not None, **cfg)
    return group_targets(decisions, grpo, lam)


def test_group_targets_pay_accuracy_minus_tokens_and_normalise_within_groups():
    # 2 groups of 2 episodes; decisions (episode, step): e0 two steps, e1 one, e2 one, e3 two.
    episode, step = np.array([0, 0, 1, 2, 3, 3, 0]), np.array([0, 1, 0, 0, 0, 1, 0])
    valid = np.array([1, 1, 1, 1, 1, 1, 0], bool)
    a = 3
    uniform = np.full((7, a), np.log(1 / a), np.float32)
    tokens = np.array([[500, 0], [800, 0], [300, 0], [400, 900]], np.float32)
    step_mask = np.array([[1, 1], [1, 0], [1, 0], [1, 1]], bool)
    correct = np.array([1, 0, 1, 1], np.float32)
    prior = np.full((7, a), 1 / a, np.float32)
    kw = {"group_size": 2, "token_cost_weight": 0.02}
    for lam in (0.0, 0.7):
        out = _targets(uniform, uniform, prior, valid, episode, step, tokens, correct, step_mask, lam=lam, **kw)
        returns = correct - 0.02 * tokens.sum(1) / 1000  # pi = pi_ref = pi_prior: KL 0 whatever lambda is
        np.testing.assert_allclose(out["returns"], returns, rtol=1e-5)
        r = returns.reshape(2, 2)
        adv = ((r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 0.1)).reshape(-1)
        np.testing.assert_allclose(out["advantages"], adv, rtol=1e-4)
        np.testing.assert_allclose(np.asarray(out["decision_advantages"])[valid], adv[episode[valid]], rtol=1e-4)
    peaked = np.log(np.array([[0.98, 0.01, 0.01]] * 7, np.float32))  # now the rollout policy is far from pi_mix
    out = _targets(peaked, uniform, prior, valid, episode, step, tokens, correct, step_mask, lam=0.7, **kw)
    kl = np.sum(0.98 * np.log(0.98 * 3) + 2 * 0.01 * np.log(0.01 * 3))
    np.testing.assert_allclose(
        out["returns"], correct - 0.02 * tokens.sum(1) / 1000 - 0.7 * kl * step_mask.sum(1), rtol=1e-4
    )


def test_sampled_kl_in_the_return_rewards_following_the_prior():
    """Eq. 12 with KL_t = log pi(a_t) - log pi_mix(a_t) at the taken action: a step that takes what pi_mix
    favours pays less than one that takes what it disfavours, whereas the exact per-state KL charges both
    the same (it does not depend on a_t), so in the return it can only teach shorter episodes."""
    a = 3
    policy = np.log(np.array([[0.4, 0.4, 0.2]] * 2, np.float32))
    ref = np.log(np.full((2, a), 1 / a, np.float32))
    prior = np.array([[0.9, 0.05, 0.05]] * 2, np.float32)
    mix = np.log(0.5 * (1 / a + prior))
    episode, step, valid = np.array([0, 1]), np.array([0, 0]), np.array([True, True])
    tokens, step_mask, correct = np.zeros((2, 1), np.float32), np.ones((2, 1), bool), np.ones(2, np.float32)
    kw = {"group_size": 2, "token_cost_weight": 0.0, "lam": 0.7}
    actions = np.array([0, 1])  # episode 0 follows the prior, episode 1 does not
    arrays = (policy, ref, prior, valid, episode, step, tokens, correct, step_mask)
    sampled = _targets(*arrays, actions=actions, **kw)
    np.testing.assert_allclose(sampled["kl"], policy[[0, 1], actions] - mix[[0, 1], actions], rtol=1e-5)
    np.testing.assert_allclose(
        sampled["returns"], 1 - 0.7 * (policy[[0, 1], actions] - mix[[0, 1], actions]), rtol=1e-5
    )
    assert sampled["returns"][0] > sampled["returns"][1]
    exact = _targets(*arrays, **kw)
    np.testing.assert_allclose(exact["returns"][0], exact["returns"][1])
    # the one-sample estimate is unbiased: its expectation under pi is the exact KL
    np.testing.assert_allclose(np.sum(np.exp(policy[0]) * (policy[0] - mix[0])), exact["kl"][0], rtol=1e-5)


def test_maca_grpo_is_a_method_of_the_one_table_and_its_loss_is_maca_loss():
    """The one trainer's "maca_grpo" (train/methods.py METHODS) over a scorer module: its parts' combined loss
    and metrics on an "actions" batch are `maca_loss` of the module's Eq. 11 log-probs."""
    assert "maca_grpo" in METHODS
    method = make_method(MethodConfig(name="maca_grpo", clip_eps=0.2, target_kl_weight=0.7))
    assert [p.name for p in method.parts] == ["pg", "kl_mix"] and not method.frozen
    rng = np.random.default_rng(0)
    d, a = 6, 4
    module = HeadScorer(3, a, 8, rngs=nnx.Rngs(0))
    module.out.kernel[...] = rng.normal(size=(8, a)).astype(np.float32)  # not uniform
    mask = rng.random((d, a)) < 0.6
    mask[:, -1] = True
    inputs = {"features": rng.normal(size=(d, 3)).astype(np.float32)}
    log_pi = np.asarray(masked_log_probs(module(inputs), mask))
    actions = np.array([np.flatnonzero(m)[-1] for m in mask], np.int32)
    old = log_pi[np.arange(d), actions] + rng.normal(scale=0.3, size=d).astype(np.float32)
    adv, valid = rng.normal(size=d).astype(np.float32), np.arange(d) < 5
    with np.errstate(divide="ignore"):  # -inf outside the mask, as log pi_mix there
        mix = np.log(np.where(mask, 1.0 / mask.sum(-1, keepdims=True), 0.0)).astype(np.float32)
    view = ActionsView(inputs, mask, actions, old, adv, valid, mix)
    micro = {"decisions": jax.tree.map(jnp.asarray, view)}
    parts, aux = method.micro_parts(module, None, micro)
    batch = jax.tree.map(lambda x: x[None], micro)
    loss, metrics = maca_loss(jnp.asarray(log_pi), actions, old, adv, valid, mix, clip_eps=0.2, prior_kl_weight=0.7)
    np.testing.assert_allclose(method.loss(parts, method.global_counts(batch)), loss, rtol=1e-6)
    summary = method.summarize(parts, aux)
    for k in ("pg", "kl_mix", "clip_fraction"):
        np.testing.assert_allclose(summary[k], metrics[k], rtol=1e-6)


def test_grpo_learning_rate_decays_over_every_update():
    """The cosine runs over iterations x epochs updates (each iteration makes `epochs` of them), from the
    learning rate to learning_rate * final_lr_ratio; ratio 1 keeps it constant. MACA's AdamW keeps the b2 its
    results were produced with."""
    assert (GRPOConfig().optimizer.b2, GRPOConfig().optimizer.weight_decay) == (0.999, 0.0)
    for ratio in (0.1, 1.0):
        optimizer = dataclasses.replace(GRPOConfig().optimizer, learning_rate=1e-2, final_lr_ratio=ratio)
        cfg = GRPOConfig(optimizer=optimizer, iterations=5, epochs=4)
        tx = make_optimizer(cfg)
        params = {"w": jnp.zeros((2, 2))}
        state, steps = tx.init(params), []
        for _ in range(20):  # a constant gradient: each Adam step moves by the learning rate
            updates, state = tx.update({"w": jnp.full((2, 2), 0.1)}, state, params)
            steps.append(-float(updates["w"][0, 0]))
        low = 1e-2 * ratio
        want = [low + 0.5 * (1e-2 - low) * (1 + np.cos(np.pi * k / 20)) for k in range(20)]
        assert steps == pytest.approx(want, rel=1e-4)


def test_graphspec_ablations():
    rng = np.random.default_rng(0)
    q, p = rng.uniform(0.2, 1.0, (2, 5)), rng.uniform(0, 1, (2, 5, 5))
    full = graphspecs(q, p, "full", gamma=0.4)
    np.testing.assert_allclose(full[0].participation, np.where(q[0] >= 0.4, q[0], 0), rtol=1e-6)
    np.testing.assert_allclose(full[1].edge_prior, p[1] * q[1][None], rtol=1e-6)
    no_z = graphspecs(q, p, "no_relevance", gamma=0.4)
    assert np.all(no_z[0].participation == 1) and np.allclose(no_z[0].edge_prior, p[0])
    no_p = graphspecs(q, p, "no_edges", gamma=0.4)
    np.testing.assert_allclose(no_p[0].edge_prior, (1 - np.eye(5)) * q[0][None], rtol=1e-6)
    assert graphspecs(q, p, "none") is None
    with pytest.raises(ValueError):
        dataclasses.replace(VARIANTS["no_graphspec"], learn=False)


@pytest.fixture(scope="module")
def small_study():
    """The synthetic world, its GraphSpec from a quick prior-learning pass, and hashing-encoder embeddings."""
    spool = SyntheticPool()
    world = synthetic_world(spool)
    train, evals = synthetic_tasks(make_tasks(36, seed=0)), synthetic_tasks(make_tasks(36, seed=100))
    encoder = HashingEncoder()
    agents = encoder.encode([a.profile for a in spool.pool])
    ctx_train = encoder.encode([context_text(t.prompt, t.budget) for t in train])
    ctx_eval = encoder.encode([context_text(t.prompt, t.budget) for t in evals])
    cfg = PriorConfig(
        gamma=0.0,
        rounds=2,
        samples=4,
        walk_steps=5,
        sparsity=0.05,
        credit="executed",
        init_out_degree=1.0,
        per_family=True,
        with_start=True,
        phi_start=True,
        keep_cheapest=True,
        mlp_hidden=32,
        mlp_steps=60,
        mlp_learning_rate=1e-2,
    )
    q_train = relevance_scores(ctx_train, agents, [t.budget for t in train], BudgetTemperature())
    q_eval = relevance_scores(ctx_eval, agents, [t.budget for t in evals], BudgetTemperature())
    mlp, stats = learn_edge_mlp(world, train, ctx_train, agents, q_train, cfg)
    assert stats["buffer"] > 0
    embeddings = {t.task_id: e for t, e in zip(train + evals, np.concatenate([ctx_train, ctx_eval]), strict=False)}
    rollout_cfg = RolloutConfig(max_steps=5, greedy=True, constraint=Constraint(True, 0.0))
    grpo = GRPOConfig(iterations=3, tasks_per_iteration=4, rollout=rollout_cfg)
    p_train, p_eval = (edge_probs(mlp, agents, c, with_start=True) for c in (ctx_train, ctx_eval))
    assert p_train.shape[1:] == (len(agents) + 1,) * 2 and not p_train[:, :, -1].any()  # nothing enters START
    return Study(
        world,
        train,
        evals,
        q_train,
        p_train,
        q_eval,
        p_eval,
        lambda seed: head_policy(embeddings, len(spool.pool), 5, seed=seed),
        grpo,
        0.0,
        rollout_cfg,
    )


def test_prior_learning_without_any_success_leaves_p_prior_uninformative():
    """No walk succeeds (a judge that fails everything): nothing to fit Eq. 6 on, so learn_edge_mlp warns and
    returns no MLP, and every allowed edge gets p = 1 (as w/o P_prior) instead of the run stopping."""
    spool = SyntheticPool()
    world = dataclasses.replace(synthetic_world(spool), judge=lambda task, path, answer, rng: False)
    tasks = synthetic_tasks(make_tasks(6, seed=0))
    encoder = HashingEncoder()
    agents = encoder.encode([a.profile for a in spool.pool])
    ctx = encoder.encode([context_text(t.prompt, t.budget) for t in tasks])
    q = relevance_scores(ctx, agents, [t.budget for t in tasks], BudgetTemperature())
    mlp, stats = learn_edge_mlp(
        world, tasks, ctx, agents, q, PriorConfig(gamma=0.0, rounds=1, samples=2, with_start=True)
    )
    assert mlp is None and stats["buffer"] == 0 and stats["walk_success"] == [0.0] and "fallback" in stats
    p = edge_probs(mlp, agents, ctx, with_start=True)
    n = len(agents)
    expected = np.ones((n + 1, n + 1))
    np.fill_diagonal(expected, 0.0)
    expected[:, n] = 0.0  # nothing enters START
    np.testing.assert_array_equal(p, np.broadcast_to(expected, (len(tasks), n + 1, n + 1)))


def test_training_runs_and_its_checkpoint_restores(small_study, tmp_path):
    study = small_study
    policy = study.make_policy(0)
    before = jax.tree.map(np.asarray, policy.params)
    specs, _ = study.specs(VARIANTS["maca"])
    history = train_grpo(
        policy, study.train_tasks, study.world, specs, VARIANTS["maca"], study.grpo, checkpoint_dir=tmp_path / "ckpt"
    )
    assert len(history) == 3 and all(np.isfinite(list(h.values())).all() for h in history)
    assert any(
        not np.allclose(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(policy.params), strict=False)
    )
    restored = restore_params(tmp_path / "ckpt", study.make_policy(0), make_optimizer(study.grpo))
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(policy.params), strict=False):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for name in ("grpo", "no_policy"):  # the unconstrained space and the prior-only system also run
        evaluation, _ = run_variant(study, VARIANTS[name])
        assert 0.0 <= evaluation.summary["expected_accuracy"] <= 1.0
    # the structure-centric system executes the committed structure: the same paths whatever the seed,
    # opening with the START row's favourite among the retained agents, then the strongest edge above the
    # mask's threshold from the agent called last to a retained agent not yet called, until none is left
    # (or max_steps / the budget ends the episode)
    a, _ = run_variant(study, VARIANTS["no_policy"], seed=0)
    b, _ = run_variant(study, VARIANTS["no_policy"], seed=1)
    assert [e.path for e in a.episodes] == [e.path for e in b.episodes]
    _, specs = study.specs(VARIANTS["no_policy"])
    threshold, max_steps = study.eval_rollout.constraint.edge_threshold, study.eval_rollout.max_steps
    n = len(study.world.pool)
    for e in a.episodes:
        spec = specs[e.task.task_id]
        expected = [int(np.argmax(np.where(spec.retained, spec.start_prior, -1.0)))]
        while len(expected) < max_steps:
            row = spec.edge_prior[expected[-1]]
            ok = spec.retained & (row > threshold)
            ok[expected] = False
            if not ok.any():
                break
            expected.append(int(np.argmax(np.where(ok, row, -1.0))))
        assert e.path == tuple(expected[: len(e.path)])
        if len(e.path) < len(expected):  # cut short only by the budget
            assert e.cost >= e.task.budget
        elif len(e.path) < max_steps:  # the structure ran out: the episode ended with STOP
            assert e.steps[-1].action == n


def test_held_out_learning_curve_probes_without_changing_training(small_study):
    """run_variant(curve_every=k) evaluates the policy on the held-out tasks after every k-th iteration and after
    the last; training, its history and the final evaluation equal a run without probes, and the curve's last
    point is the final evaluation (mean and sd over seeds)."""
    study = dataclasses.replace(small_study, grpo=dataclasses.replace(small_study.grpo, iterations=5))
    plain, plain_history = run_variant(study, VARIANTS["maca"], seed=0)
    finals, histories = [], []
    for seed in (0, 1):
        evaluation, history = run_variant(study, VARIANTS["maca"], seed=seed, curve_every=2)
        finals.append(evaluation.summary["expected_accuracy"])
        histories.append(history)
    assert [h["iteration"] for h in histories[0] if "heldout_expected_accuracy" in h] == [1, 3, 4]
    for a, b in zip(plain_history, histories[0], strict=False):
        assert _timeless(b) == _timeless(a)
    assert finals[0] == plain.summary["expected_accuracy"]
    curve = learning_curve(histories)
    assert [r["iterations"] for r in curve] == [2, 4, 5]
    assert curve[-1]["expected_accuracy"] == pytest.approx(np.mean(finals))
    assert curve[-1]["expected_accuracy_sd"] == pytest.approx(np.std(finals, ddof=1))
    assert {"avg_cost", "avg_calls", "invalid_action_rate"} <= set(curve[0])


def test_without_pi_theta_reference_reading_is_the_untrained_policy_under_the_mask(small_study):
    """no_policy_structure="reference": w/o pi_theta is pi_ref, the policy pi_theta starts from, acting greedily
    inside GraphSpec's mask (the paper's Table 3 w/o pi_theta equals its Table 11 router + mask)."""
    study = dataclasses.replace(small_study, structure="reference")
    evaluation, history = run_variant(study, VARIANTS["no_policy"], seed=1)
    _, specs = study.specs(VARIANTS["no_policy"])
    expected = evaluate("ref", study.make_policy(1), study.eval_tasks, study.world, specs, study.eval_rollout, seed=1)
    assert history == [] and [e.path for e in evaluation.episodes] == [e.path for e in expected.episodes]
    assert all(s.mask[s.action] for e in evaluation.episodes for s in e.steps)  # every action inside H
    with pytest.raises(ValueError, match="reference"):
        dataclasses.replace(small_study, structure="oracle")


def _eval_subset(study, indices):
    """The study with its eval tasks (and their GraphSpec parts) cut to `indices`."""
    return dataclasses.replace(
        study,
        eval_tasks=[study.eval_tasks[i] for i in indices],
        q_eval=study.q_eval[indices],
        p_eval=study.p_eval[indices],
    )


@pytest.fixture(scope="module")
def tiny_chat_folder(tmp_path_factory):
    """A tiny random Qwen3 written as a Hugging Face folder (tokenizer with Qwen's chat template)."""
    from porch_jax.models.tiny import make_tiny_model

    return make_tiny_model(
        tmp_path_factory.mktemp("tiny_router"),
        "qwen3",
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_hidden_layers=1,
    )


def test_without_pi_theta_pretrained_lm_reading_routes_inside_the_mask(small_study, tiny_chat_folder):
    """no_policy_structure="pretrained_lm": w/o pi_theta is a pretrained LM's folder, untrained, scoring the agents
    GraphSpec's mask allows in its chat-template router prompt. It trains nothing, never leaves the mask, and
    repeats exactly; scoring in chunks of rows gives the unchunked scores."""
    from porch_jax.maca.config import LMConfig
    from porch_jax.maca.experiment import router_factory
    from porch_jax.maca.lm_policy import router_policy
    from porch_jax.models import from_pretrained

    pool = small_study.world.pool
    make_router = router_factory(LMConfig(model_path=str(tiny_chat_folder), max_task_words=12), pool)
    study = _eval_subset(small_study, [0, 1, 2])
    study = dataclasses.replace(
        study,
        structure="pretrained_lm",
        make_router=make_router,
        eval_rollout=dataclasses.replace(study.eval_rollout, max_steps=2),
        gamma=0.6,  # a gate: fewer agents listed, shorter prompts
    )
    first, history = run_variant(study, VARIANTS["no_policy"], seed=0)
    again, _ = run_variant(study, VARIANTS["no_policy"], seed=1)
    steps = [s for e in first.episodes for s in e.steps]
    assert history == [] and steps and first.summary["invalid_action_rate"] == 0.0
    assert all(s.mask[s.action] for s in steps)  # every action inside H
    assert all(np.isneginf(s.log_probs[~s.mask]).all() and np.isfinite(s.log_probs[s.mask]).all() for s in steps)
    assert [e.path for e in again.episodes] == [e.path for e in first.episodes]
    for a, b in zip((s for e in again.episodes for s in e.steps), steps, strict=True):
        np.testing.assert_array_equal(a.log_probs, b.log_probs)
    assert again.summary["expected_accuracy"] == first.summary["expected_accuracy"]

    states, masks = [s.state for s in steps], np.stack([s.mask for s in steps])
    router = make_router(0)
    text = router.encode.render(states[0], masks[0])
    assert "<|im_start|>assistant" in text and "Reply with exactly one agent name" in text
    listed = [a for a in pool.names if f"- {a}:" in text]
    assert listed == [a for a, ok in zip(pool.names, masks[0][:-1], strict=True) if ok]
    lm = from_pretrained(str(tiny_chat_folder))
    tokenizer = router.encode.tokenizer
    chunked = router_policy(lm, tokenizer, pool, max_task_words=12, max_rows=2)(states, masks)
    whole = router_policy(lm, tokenizer, pool, max_task_words=12, max_rows=64)(states, masks)
    np.testing.assert_allclose(chunked[masks], whole[masks], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="make_router"):
        dataclasses.replace(small_study, structure="pretrained_lm")


def test_pretrained_lm_reading_config_is_checked_and_old_run_dirs_still_resume(tmp_path):
    """The pretrained_lm reading needs no_policy_lm.model_path and no other reading takes one; a run recorded
    before no_policy_lm existed resumes with it at its default, and is refused with it set."""
    from experiments.maca_synthetic import get_config
    from porch_jax.typed_config import claim_run_dir

    def config(**changes):
        cfg = get_config()
        cfg.run_dir = str(tmp_path / "run")
        cfg.update(changes)
        return from_dict(MacaConfig, cfg)

    with pytest.raises(ConfigError, match="no_policy_lm.model_path: the pretrained_lm reading needs"):
        config(no_policy_structure="pretrained_lm")
    with pytest.raises(ConfigError, match="no_policy_lm.model_path: is read only by"):
        config(no_policy_lm={"model_path": "/some/folder"})
    with pytest.raises(ConfigError, match="no_policy_lm.overrides"):
        config(no_policy_structure="pretrained_lm", no_policy_lm={"model_path": "/f", "overrides": {"hidden_size": 8}})
    assert config(no_policy_structure="pretrained_lm", no_policy_lm={"model_path": "/f"}).no_policy_lm.model_path
    cfg = config()
    (tmp_path / "run").mkdir()
    recorded = to_dict(cfg)
    del recorded["no_policy_lm"]  # as a run recorded before the key existed
    (tmp_path / "run" / "config.json").write_text(json.dumps(recorded))

    def claim(c):  # as the experiment claims its run directory
        claim_run_dir(c.run_dir, c, defaults=MacaConfig(c.run_dir))

    claim(cfg)  # accepted: the key at its default
    routed = config(no_policy_structure="pretrained_lm", no_policy_lm={"model_path": "/f"})
    with pytest.raises(ValueError, match="another config .*no_policy_lm: '<absent>'"):
        claim(routed)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_without_pi_theta_pretrained_lm_on_smollm2(small_study, smollm2_dir):
    """The real SmolLM2-135M-Instruct as w/o pi_theta's router on one synthetic task per family (2 agent calls at
    most, a gate at 0.6 so fewer agents are listed): every action inside H, finite scores, and a router that
    prefers some agents (not uniform)."""
    from transformers import AutoTokenizer

    from porch_jax.maca.lm_policy import router_policy
    from porch_jax.models import from_pretrained

    families = [next(i for i, t in enumerate(small_study.eval_tasks) if t.family == f) for f in ("qa", "math", "code")]
    study = _eval_subset(small_study, families)
    study = dataclasses.replace(study, eval_rollout=dataclasses.replace(study.eval_rollout, max_steps=2), gamma=0.6)
    router = router_policy(
        from_pretrained(smollm2_dir),
        AutoTokenizer.from_pretrained(smollm2_dir),
        study.world.pool,
        max_task_words=48,
        max_rows=4,
    )
    study = dataclasses.replace(study, structure="pretrained_lm", make_router=lambda seed: router)
    evaluation, _ = run_variant(study, VARIANTS["no_policy"])
    names = [*study.world.pool.names, "STOP"]
    for e in evaluation.episodes:
        print(f"SmolLM2 router, {e.task.family}: {' -> '.join(names[s.action] for s in e.steps)}")
    print("SmolLM2 router summary:", evaluation.summary)
    steps = [s for e in evaluation.episodes for s in e.steps]
    assert evaluation.summary["invalid_action_rate"] == 0.0 and all(s.mask[s.action] for s in steps)
    assert all(np.isfinite(s.log_probs[s.mask]).all() for s in steps)
    top = np.mean([np.exp(s.log_probs).max() * s.mask.sum() for s in steps])  # 1: uniform over the allowed set
    assert top > 2.0, top


def test_committed_structure_order():
    """w/o pi_theta's next agent: START's choice, then the strongest edge above the threshold from the agent
    called last to a retained, not yet called agent, then STOP (action N)."""
    z = np.array([0.9, 0.0, 0.8, 0.7])
    p = np.array([[0.0, 0.5, 0.3, 0.2], [0.9, 0.0, 0.9, 0.9], [0.6, 0.9, 0.0, 0.04], [0.9, 0.9, 0.9, 0.0]])
    spec = GraphSpec(relevance=z, participation=z, edge_prior=p, start_prior=np.array([0.1, 0.9, 0.3, 0.2]))
    history = []
    while (a := committed_next(spec, history, edge_threshold=0.05)) != 4:
        history.append(a)
    assert history == [2, 0, 3]  # agent 1 is not retained; 2 -> 3 is below the threshold, 0 -> 3 is not
    assert committed_next(spec, [2], edge_threshold=0.05) == 0
    assert committed_next(dataclasses.replace(spec, start_prior=None), []) == 0  # no START row: z's favourite
    assert committed_next(spec, [3]) == 0  # from 3: the strongest edge to a retained agent not yet called
    assert committed_next(spec, [2, 0], allowed=np.array([1, 1, 1, 0, 1], bool)) == 4  # H removes 3: STOP
    states = [State(OrchestrationTask("t", "x", 2000, "qa"), tuple(h)) for h in ([], [2], [2, 0], [2, 0, 3])]
    log_probs = PriorPolicy({"t": spec}, edge_threshold=0.05)(states, np.ones((4, 5), bool))
    assert [int(np.argmax(r)) for r in log_probs] == [2, 0, 3, 4]
    assert np.all(np.isinf(log_probs).sum(-1) == 4)


def _path_probability(spec, path, max_steps, threshold, stop_floor):
    """prod_t pi_prior(a_t | s_t) of an agent sequence, with the STOP factor unless it used every step."""
    n, prob = len(spec.participation), 1.0
    z, p = jnp.asarray(spec.participation), jnp.asarray(spec.edge_prior)
    for t in range(len(path) + (len(path) < max_steps)):
        prev = path[t - 1] if t else -1
        visited = np.isin(np.arange(n), path[:t])
        mask = structural_mask(z, p, jnp.asarray(prev), edge_threshold=threshold)
        probs = prior_action_probs(
            z,
            p,
            jnp.asarray(prev),
            mask,
            start=jnp.asarray(spec.start_prior),
            visited=jnp.asarray(visited),
            stop_floor=stop_floor,
        )
        prob *= float(probs[path[t] if t < len(path) else n])
    return prob


def test_most_probable_path_equals_brute_force():
    """The exact search of w/o pi_theta's "most_probable" structure against every path enumerated; on this
    prior it differs from the greedy committed structure (which opens with START's favourite, agent 2,
    although 0 -> 3 -> STOP is the more probable path)."""
    rng = np.random.default_rng(0)
    n, max_steps, threshold, stop_floor = 5, 3, 0.05, 0.05
    for trial in range(6):
        z = np.where(rng.random(n) < 0.8, rng.uniform(0.5, 1.0, n), 0.0)
        p = rng.uniform(0, 0.7, (n, n)) * (rng.random((n, n)) < 0.6)
        np.fill_diagonal(p, 0.0)
        spec = GraphSpec(relevance=z, participation=z, edge_prior=p, start_prior=rng.uniform(0.1, 1.0, n) * (z > 0))
        paths = [q for k in range(max_steps + 1) for q in itertools.permutations(range(n), k)]
        probs = {q: _path_probability(spec, q, max_steps, threshold, stop_floor) for q in paths}
        found = most_probable_path(spec, max_steps=max_steps, edge_threshold=threshold, stop_floor=stop_floor)
        assert probs[found] == pytest.approx(max(probs.values()), rel=1e-5), trial
    z = np.array([0.9, 0.0, 0.8, 0.7])
    p = np.array([[0.0, 0.0, 0.0, 0.95], [0.0] * 4, [0.3, 0.0, 0.0, 0.3], [0.0] * 4])
    spec = GraphSpec(relevance=z, participation=z, edge_prior=p, start_prior=np.array([0.4, 0.0, 0.5, 0.1]))
    assert most_probable_path(spec, max_steps=4, edge_threshold=0.05) == (0, 3)
    assert committed_next(spec, [], edge_threshold=0.05) == 2
    states = [State(OrchestrationTask("t", "x", 2000, "qa"), h) for h in ((), (0,), (0, 3))]
    policy = PriorPolicy({"t": spec}, 0.05, "most_probable", max_steps=4)
    assert [int(np.argmax(r)) for r in policy(states, np.ones((3, 5), bool))] == [0, 3, 4]
    with pytest.raises(ValueError):
        PriorPolicy({"t": spec}, structure="viterbi")


@pytest.mark.slow
def test_maca_head_policy_learns_the_pools_structure(small_study):
    """After GRPO in the masked space the greedy policy is far above the untrained one on held-out tasks."""
    study = dataclasses.replace(
        small_study,
        grpo=dataclasses.replace(small_study.grpo, iterations=80, tasks_per_iteration=8, epochs=4),
    )
    maca = dataclasses.replace(VARIANTS["maca"], prior_kl_weight=0.05)
    _, eval_specs = study.specs(maca)
    untrained = evaluate("init", study.make_policy(0), study.eval_tasks, study.world, eval_specs, study.eval_rollout)
    trained, history = run_variant(study, maca)
    assert trained.summary["invalid_action_rate"] == 0.0
    assert trained.summary["expected_accuracy"] > untrained.summary["expected_accuracy"] + 0.3, (
        untrained.summary,
        trained.summary,
    )
    assert np.mean([h["accuracy"] for h in history[-10:]]) > np.mean([h["accuracy"] for h in history[:10]]) + 0.2


@pytest.mark.slow
def test_maca_lm_policy_learns_on_a_reduced_setting(small_study):
    """The tiny Qwen3 policy, scoring agent names, trained with MACA's GRPO on math tasks only."""

    def keep(tasks):
        return [i for i, t in enumerate(tasks) if t.family == "math"][:12]

    tr, ev = keep(small_study.train_tasks), keep(small_study.eval_tasks)
    _, tokenizer = tiny_lm(0)
    size = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "num_hidden_layers": 1,
    }
    study = dataclasses.replace(
        small_study,
        train_tasks=[small_study.train_tasks[i] for i in tr],
        eval_tasks=[small_study.eval_tasks[i] for i in ev],
        q_train=small_study.q_train[tr],
        p_train=small_study.p_train[tr],
        q_eval=small_study.q_eval[ev],
        p_eval=small_study.p_eval[ev],
        make_policy=lambda seed: lm_policy(
            tiny_lm(seed, **size)[0], tokenizer, small_study.world.pool.names, max_task_words=8
        ),
        grpo=dataclasses.replace(small_study.grpo, iterations=15, tasks_per_iteration=4, epochs=2),
    )
    maca = dataclasses.replace(VARIANTS["maca"], prior_kl_weight=0.05)
    _, eval_specs = study.specs(maca)
    untrained = evaluate("init", study.make_policy(0), study.eval_tasks, study.world, eval_specs, study.eval_rollout)
    trained, _ = run_variant(study, maca)
    assert trained.summary["invalid_action_rate"] == 0.0
    assert trained.summary["expected_accuracy"] > max(0.45, untrained.summary["expected_accuracy"] + 0.3), (
        untrained.summary,
        trained.summary,
    )


@pytest.mark.slow
def test_launcher_real_benchmark_path_with_a_scripted_backend(tmp_path):
    """experiments/maca_gsm_hard.py end to end (prior learning, LM-policy GRPO, evaluation, tables) with the
    agents served by a scripted backend in place of vLLM: MathSolver answers right, the others restate."""
    from experiments.maca_gsm_hard import smoke_config
    from porch_jax.backends import ScriptedBackend
    from porch_jax.envs.benchmarks import load_tasks
    from porch_jax.envs.benchmarks.answers import format_number
    from porch_jax.maca import experiment
    from porch_jax.maca.baselines import BASELINES, COT_SUFFIX
    from porch_jax.maca.settings import ADAPTIVE, MULTI_AGENT

    try:
        tasks = load_tasks("gsm_hard", "train")[:3] + load_tasks("gsm_hard", "test")[:3]
    except (FileNotFoundError, OSError) as e:
        pytest.skip(f"GSM-Hard data is not available: {e}")
    targets = {t.prompt: t.data["target"] for t in tasks}

    def agent(request):
        if request.role == "router":  # Table 11's routers: MathSolver if it is among the agents shown, then STOP
            prompt = request.messages[0]["content"]
            return "MathSolver" if "- MathSolver:" in prompt and "[MathSolver]" not in prompt else "STOP"
        if request.role == "critic":
            return "NO ISSUES"
        if request.role == "recruiter":  # AgentVerse: MathSolver alone
            return "MathSolver"
        if request.role == "evaluator":
            return "ACCEPT"
        if request.role == "solver":  # the single-model baselines: right without the CoT cue, wrong with it
            prompt = request.messages[0]["content"]
            if prompt.startswith("Question: "):  # ComplexCoT's few-shot prompt: right
                task = prompt.rsplit("Question: ", 1)[1].removesuffix("\nAnswer: " + COT_SUFFIX.strip())
                return f"The answer is {format_number(targets[task])}."
            task = prompt.removesuffix(COT_SUFFIX)
            return f"The answer is {format_number(targets[task] + (prompt != task))}."
        task = next(t for t in targets if request.messages[1]["content"].startswith(t))
        if "MathSolver" in request.messages[0]["content"]:
            return f"The answer is {format_number(targets[task])}."
        return "Restating: " + task[:40]

    cfg = smoke_config(run_dir=str(tmp_path / "run"), iterations=2, mlp_steps=20)
    cfg.grpo.optimizer.learning_rate = 1e-3
    cfg = from_dict(MacaConfig, cfg)
    results = experiment.run(cfg, backend=ScriptedBackend(agent), log=lambda s: None)
    (row,) = results["systems"]
    assert row["system"] == "maca" and row["invalid_action_rate"] == 0.0 and row["avg_cost"] > 0
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["systems"][0]["accuracy"] == row["accuracy"]
    assert (tmp_path / "run" / "tables.md").exists() and (tmp_path / "run" / "checkpoints" / "maca" / "seed_0").exists()
    # the baselines on the same held-out tasks and backend, scored by the benchmark's checker
    base = {r["system"]: r for r in results["baselines"]}
    assert list(base) == list(BASELINES)
    # MathSolver is in the first step's H (Eq. 11: the gate's retained agents) on `allowed` of the 3 tasks: the
    # masked router is shown it there only; the others call it everywhere, invalidly outside H
    setup = experiment.build_setup(cfg, ScriptedBackend(agent), log=lambda s: None)
    _, specs = setup.study.specs(experiment.variant(cfg, "maca"))
    solver = setup.study.world.pool.index("MathSolver")
    allowed = sum(bool(specs[t.task_id].retained[solver]) for t in setup.study.eval_tasks)
    multi = {k: base.pop(k) for k in MULTI_AGENT}  # multi_agent.py's systems: run, cost counted
    adaptive = {k: base.pop(k) for k in ADAPTIVE}  # adaptive.py's: trained on the 3 training tasks, then run
    for r in adaptive.values():
        assert len(r["training"]) == cfg.grpo.iterations and r["training"][0]["episodes"] == 4  # as many as GRPO
        assert r["training_tokens"] > 0
        assert len(r["paths"]) == 3 and r["avg_cost"] > 0 and r["policy"].startswith("trained here")
    assert all(r["avg_cost"] > 0 for r in multi.values())
    assert (multi["complex_cot"]["accuracy"], multi["complex_cot"]["avg_calls"]) == (1.0, 1)
    assert (multi["agentverse"]["accuracy"], multi["agentverse"]["avg_calls"]) == (1.0, 3)  # recruit, solve, accept
    assert {k: r["accuracy"] for k, r in base.items()} == pytest.approx(
        {
            "vanilla": 1.0,
            "cot": 0.0,
            "self_consistency": 0.0,
            "self_refine": 0.0,
            "router_none": 1.0,
            "router_hint": 1.0,
            "router_mask": allowed / 3,
        }
    )
    assert {k: r["avg_calls"] for k, r in base.items()} == pytest.approx(
        {
            "vanilla": 1,
            "cot": 1,
            "self_consistency": 5,
            "self_refine": 2,  # solve + a critique finding no issue
            "router_none": 3,
            "router_hint": 3,  # route, MathSolver, route (STOP)
            "router_mask": (3 * allowed + (3 - allowed)) / 3,
        }
    )
    assert {m: base[f"router_{m}"]["invalid_action_rate"] for m in ("none", "hint", "mask")} == pytest.approx(
        {"none": (3 - allowed) / 6, "hint": (3 - allowed) / 6, "mask": 0.0}
    )
    assert base["router_hint"]["avg_cost"] > base["router_none"]["avg_cost"]  # the hint is in the router's prompt
    assert "## Baselines" in (tmp_path / "run" / "tables.md").read_text()
    with pytest.raises(ConfigError, match="debate"):
        from_dict(MacaConfig, to_dict(cfg) | {"baselines": {"systems": ("vanilla", "debate")}})
    assert "skipped" in results["lambda_selection"]  # no validation split for a benchmark world
    assert results["config"]["grpo"]["prior_kl_weight"] == cfg.grpo.prior_kl_weight


@pytest.mark.slow
@pytest.mark.parametrize("name", ["humaneval", "mmlu_pro"])
def test_launcher_on_the_code_and_qa_benchmarks_with_a_scripted_backend(name, tmp_path):
    """`--config=experiments/maca_gsm_hard.py:<name>`: the family's pool, its tasks and its scorer (code runs
    in the sandbox). Every model reply is the task's reference completion, except the routers, which stop at
    once: the single-model baselines score 100%, the routers 0%, and prior learning finds successful walks (any
    walk that calls an agent succeeds)."""
    from experiments.maca_gsm_hard import get_config, smoke_config
    from porch_jax.backends import ScriptedBackend
    from porch_jax.envs.benchmarks import BENCHMARKS, load_tasks
    from porch_jax.maca import experiment
    from porch_jax.maca.baselines import COT_SUFFIX
    from porch_jax.maca.settings import ADAPTIVE, MULTI_AGENT

    try:
        tasks = load_tasks(name, "train")[:3] + load_tasks(name, "test")[:3]
    except (FileNotFoundError, OSError, ImportError) as e:
        pytest.skip(f"{name} data is not available: {e}")
    # what the roles are asked for: code as the whole function in one fenced block (the pool's prompts), so it
    # survives a transcript of several agents; QA as "The answer is X."
    reference = {
        t.prompt: f"```python\n{t.data['prompt']}{t.reference}```" if t.family == "code" else t.reference for t in tasks
    }

    def model(request):
        if request.role == "router":
            return "STOP"
        if request.role == "critic":
            return "NO ISSUES"
        if request.role in ("recruiter", "evaluator"):  # AgentVerse: names no expert (the first ones), accepts
            return "ACCEPT"
        prompt = request.messages[-1]["content"].split("\n\nWork so far:")[0].removesuffix(COT_SUFFIX)
        if prompt in reference:
            return reference[prompt]
        # the multi-agent systems' prompts hold the task, after ComplexCoT's exemplars (other tasks) where it has them
        return reference[max((p for p in reference if p in prompt), key=prompt.rfind)]

    cfg = from_dict(MacaConfig, smoke_config(name, run_dir=str(tmp_path / "run")))
    assert cfg.pool_families == (BENCHMARKS[name].family, "auxiliary") and cfg.world.benchmark == name
    results = experiment.run(cfg, backend=ScriptedBackend(model), log=lambda s: None)
    assert results["prior"]["buffer"] > 0 and "fallback" not in results["prior"]
    (maca,) = results["systems"]
    assert maca["invalid_action_rate"] == 0.0 and 0.0 <= maca["accuracy"] <= 1.0
    assert {r["system"]: r["accuracy"] for r in results["baselines"]} == {
        "vanilla": 1.0,
        "cot": 1.0,
        "self_consistency": 1.0,
        "self_refine": 1.0,
        "router_none": 0.0,
        "router_hint": 0.0,
        "router_mask": 0.0,
    } | {system: 1.0 for system in (*MULTI_AGENT, *ADAPTIVE)}  # every agent writes the reference
    with pytest.raises(ConfigError, match="unknown 'gsm8k'"):
        get_config("gsm8k")


def test_synthetic_launcher_selects_lambda_on_a_validation_split(tmp_path):
    """experiments/maca_synthetic.py, shrunk: lambda is chosen for MACA on new training-distribution tasks
    (disjoint from the train and eval tasks) by validation reward, and every KL-keeping system then uses it."""
    from experiments.maca_synthetic import get_config
    from porch_jax.maca import experiment

    cfg = get_config()
    cfg.run_dir = str(tmp_path / "run")
    cfg.encoder = "hashing"
    cfg.world.update({"num_train": 12, "num_eval": 12})
    cfg.prior.update({"rounds": 1, "samples": 2, "mlp_steps": 10})
    cfg.grpo.update({"iterations": 2, "tasks_per_iteration": 2, "group_size": 2})
    cfg.lambda_selection.update({"num_tasks": 6, "seeds": (0,), "grid": (0.05, 0.7)})
    cfg.seeds = (0,)
    cfg.systems = ("maca", "no_z_prior", "grpo", "no_policy")
    cfg.curve_every = 1
    cfg.sweeps = {"gamma": (), "prior_kl_weight": ()}
    cfg.lm_check.enabled = False
    cfg = from_dict(MacaConfig, cfg)
    _, train, evals, _ = experiment.build_world(cfg)
    val = experiment.validation_tasks(cfg)
    assert len(val) == 6 and not {t.task_id for t in val} & {t.task_id for t in train + evals}
    assert {t.family for t in val} == set(cfg.world.families)
    results = experiment.run(cfg, log=lambda s: None)
    sel = results["lambda_selection"]
    rewards = {r["prior_kl_weight"]: r["reward"] for r in sel["rows"]}
    assert set(rewards) == {0.05, 0.7} and sel["chosen"] == max(rewards, key=rewards.get)
    assert results["config"]["grpo"]["prior_kl_weight"] == sel["chosen"]
    assert [r["system"] for r in results["systems"]] == list(cfg.systems)
    # the oracles: one structure per family can match but never beat knowing each task's difficulty
    ceiling = {r["oracle"]: r for r in results["ceilings"]}
    committed = ceiling["best accuracy, one structure per family"]
    assert committed["expected_accuracy"] <= ceiling["best accuracy"]["expected_accuracy"] + 1e-9
    assert set(committed["structures"]) == set(cfg.world.families)
    assert "- best reward, one structure per family: code: " in (tmp_path / "run" / "tables.md").read_text()
    # held-out learning curves: every learning system at each iteration; the prior-only system at its final value
    curves, orders = results["learning_curves"]["curves"], results["learning_curves"]["orders"]
    assert [r["iterations"] for r in curves["maca"]] == [1, 2] and curves["no_policy"] == []
    final = {r["system"]: r["expected_accuracy"] for r in results["systems"]}
    for row in orders:
        assert row["no_policy"] == final["no_policy"]
        assert row["order"].split(" > ") == sorted(cfg.systems, key=lambda n: -row[n])
        measured = [n for n in row["order"].split(" > ") if n in ("maca", "no_policy", "no_z_prior")]
        assert row["paper_order"] == (measured == ["maca", "no_policy", "no_z_prior"])
    assert orders[-1]["maca"] == pytest.approx(final["maca"])
    assert (tmp_path / "run" / "learning_curves.png").stat().st_size > 0
    assert "Held-out expected_accuracy during training" in (tmp_path / "run" / "tables.md").read_text()
    # Fig. 8 on the held-out tasks' relevance: a higher gate keeps fewer agents and never more of the family
    sparsity = results["gate_sparsity"]
    assert [r["gamma"] for r in sparsity] == list(experiment.GATE_GAMMAS)
    assert all(
        a["retained"] >= b["retained"] and a["recall"] >= b["recall"]
        for a, b in zip(sparsity, sparsity[1:], strict=False)
    )
    assert (tmp_path / "run" / "gate_sparsity.png").stat().st_size > 0
    # --gate_only: the same figures from the tasks and the encoder alone, before any agent call
    gate_dir = str(tmp_path / "gate")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.maca",
            "--gate_only",
            "--config=experiments/maca_synthetic.py",
            "--config.encoder=hashing",
            "--config.world.num_eval=12",
            f"--config.run_dir={gate_dir}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = json.loads((tmp_path / "gate" / "gate_sparsity.json").read_text())
    assert json.dumps(written, sort_keys=True) == json.dumps(sparsity, sort_keys=True)  # NaN-safe equality
    assert "| gamma | precision |" in (tmp_path / "gate" / "gate_sparsity.md").read_text()
    assert not (tmp_path / "gate" / "results.json").exists()
    with pytest.raises(ConfigError, match="lambda_selection.task_seed"):
        dataclasses.replace(cfg, lambda_selection=dataclasses.replace(cfg.lambda_selection, task_seed=1000))


def test_interrupted_training_resumes_to_the_same_result(small_study, tmp_path):
    """GRPO killed mid-run (here: its probe raises after iteration 2's checkpoint) and called again resumes from
    the checkpoint and ends exactly as an uninterrupted run; a finished run only restores; a checkpoint of
    another run is refused with what differs."""
    study = dataclasses.replace(small_study, grpo=dataclasses.replace(small_study.grpo, iterations=4))
    specs, _ = study.specs(VARIANTS["maca"])

    def train(**kwargs):
        policy = study.make_policy(0)
        history = train_grpo(policy, study.train_tasks, study.world, specs, VARIANTS["maca"], study.grpo, **kwargs)
        return policy, [_timeless(h) for h in history]

    plain, plain_history = train()

    class Killed(Exception):
        pass

    calls = []

    def probe():
        calls.append(len(calls))
        if len(calls) == 3:
            raise Killed
        return {"probe": 1.0}

    ckpt = tmp_path / "ckpt"
    with pytest.raises(Killed):
        train(checkpoint_dir=ckpt, checkpoint_every=1, probe=probe, probe_every=1)
    assert Checkpointer(ckpt / "checkpoints").steps() == [1, 2]  # iteration 3 died before its save
    for attempt in range(2):  # the resumed run, then a finished one that only restores
        lines = []
        resumed, history = train(checkpoint_dir=ckpt, checkpoint_every=1, progress=lines.append, progress_every_s=0.0)
        assert history == plain_history
        assert len(lines) == (2 if attempt == 0 else 0)  # a line per iteration trained (interval 0)
        assert all(
            line.startswith(f"maca seed 0: iteration {i}/4 return ") and " it/s, ETA 0:00:" in line
            for i, line in zip((3, 4), lines, strict=False)
        )
        for a, b in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(plain.params), strict=False):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert Checkpointer(ckpt / "checkpoints").steps() == [3, 4]
    other = dataclasses.replace(study, grpo=dataclasses.replace(study.grpo, iterations=5))
    with pytest.raises(ValueError, match=r"another config \(iterations: "):
        train_grpo(
            study.make_policy(0),
            study.train_tasks,
            study.world,
            specs,
            VARIANTS["maca"],
            other.grpo,
            checkpoint_dir=ckpt,
        )


def test_train_grpo_runs_the_one_trainer(small_study, monkeypatch):
    """train_grpo is one Trainer run of method maca_grpo with `epochs` steps per iteration (the optimizer's
    schedule counts those updates); it leaves the trained parameters in the policy."""
    from porch_jax.train.trainer import Trainer

    runs, real_run = [], Trainer.run

    def run(self):
        runs.append((self.method.name, self.config.steps, self.config.optimizer.total_steps, self.exports))
        return real_run(self)

    monkeypatch.setattr(Trainer, "run", run)
    grpo = dataclasses.replace(small_study.grpo, iterations=2, epochs=3)
    specs, _ = small_study.specs(VARIANTS["maca"])
    policy = small_study.make_policy(0)
    initial = [np.asarray(x) for x in jax.tree.leaves(policy.params)]
    history = train_grpo(policy, small_study.train_tasks, small_study.world, specs, VARIANTS["maca"], grpo)
    assert runs == [("maca_grpo", 6, 6, False)]
    assert [h["iteration"] for h in history] == [0, 1]
    assert set(history[0]) == {
        "iteration",
        "return",
        "accuracy",
        "cost",
        "steps",
        "kl_mix_rollout",
        "loss",
        "pg",
        "kl_mix",
        "clip_fraction",
        "seconds",
    }
    trained = [np.asarray(x) for x in jax.tree.leaves(policy.params)]
    assert any(not np.array_equal(a, b) for a, b in zip(initial, trained, strict=True))


def test_launcher_resumes_a_crashed_run_and_refuses_another_config(tmp_path, monkeypatch):
    """A run killed during its second system, relaunched with the same config, restores the prior and the finished
    system from RUN_DIR/checkpoints, trains only what was left, and writes what an uninterrupted run writes; the
    same RUN_DIR with another config is refused, naming the difference."""
    from experiments.maca_synthetic import get_config
    from porch_jax.maca import experiment
    from porch_jax.maca import train as maca_train

    def config(run_dir):
        cfg = get_config()
        cfg.run_dir = str(run_dir)
        cfg.encoder = "hashing"
        cfg.world.update({"num_train": 6, "num_eval": 6})
        cfg.prior.update({"rounds": 1, "samples": 2, "mlp_steps": 10})
        cfg.grpo.update({"iterations": 2, "tasks_per_iteration": 2, "group_size": 2})
        cfg.lambda_selection.enabled = False
        cfg.seeds, cfg.systems, cfg.curve_every, cfg.checkpoint_every = (0,), ("maca", "grpo", "no_policy"), 1, 1
        cfg.sweeps = {"gamma": (), "prior_kl_weight": ()}
        cfg.lm_check.enabled = False
        return from_dict(MacaConfig, cfg)

    def comparable(results):
        rows = [{k: v for k, v in r.items() if k != "seconds"} for r in results["systems"]]
        return rows, results["prior"], results["learning_curves"], results["transitions"]

    clean = experiment.run(config(tmp_path / "clean"), log=lambda s: None)
    iterations = []
    real_rollout = maca_train.GroupRollouts.rollout

    def counting(self):
        iterations.append(self.variant.name)
        if len(iterations) == 4:  # maca's 2, then grpo's 2nd: killed after grpo's checkpoint at iteration 1
            raise KeyboardInterrupt
        return real_rollout(self)

    monkeypatch.setattr(maca_train.GroupRollouts, "rollout", counting)
    with pytest.raises(KeyboardInterrupt):
        experiment.run(config(tmp_path / "run"), log=lambda s: None)
    assert iterations == ["maca"] * 2 + ["grpo"] * 2
    iterations.clear()
    logs = []
    resumed = experiment.run(config(tmp_path / "run"), log=logs.append)
    assert iterations == ["grpo"]  # maca restored finished, grpo from its iteration-1 checkpoint
    assert any(line.startswith("prior restored from") for line in logs)
    assert comparable(resumed) == comparable(clean)
    moved = config(tmp_path / "run")  # a restarted server may move
    moved = dataclasses.replace(
        moved,
        backend=dataclasses.replace(
            moved.backend, endpoint=dataclasses.replace(moved.backend.endpoint, urls=("http://elsewhere:8000",))
        ),
    )
    assert comparable(experiment.run(moved, log=lambda s: None)) == comparable(clean)
    changed = config(tmp_path / "run")
    optimizer = dataclasses.replace(changed.grpo.optimizer, learning_rate=1e-2)
    changed = dataclasses.replace(changed, grpo=dataclasses.replace(changed.grpo, optimizer=optimizer))
    with pytest.raises(ValueError, match=r"another config \(grpo.optimizer.learning_rate: 0.003 -> 0.01\)"):
        experiment.run(changed, log=lambda s: None)
    (tmp_path / "run" / "config.json").write_text('{"run_dir": ')  # a torn write
    with pytest.raises(ValueError, match="config.json is not the JSON a run records"):
        experiment.run(config(tmp_path / "run"), log=lambda s: None)


@pytest.mark.slow
def test_lm_policy_trains_on_a_mesh_as_on_one_device(small_study):
    """The LM policy on a (data 2, fsdp 2, tensor 2) mesh of fake CPU devices: its matrices are split over the
    mesh, not replicated, and MACA's GRPO follows the 1-device run (same history, parameters within 1e-4)."""
    from porch_jax.train.mesh import make_mesh

    keep = [i for i, t in enumerate(small_study.train_tasks) if t.family == "math"][:6]
    _, tokenizer = tiny_lm(0)
    size = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
    }
    tasks = [small_study.train_tasks[i] for i in keep]
    grpo = dataclasses.replace(small_study.grpo, iterations=2, tasks_per_iteration=2, group_size=4, epochs=2)
    specs, _ = small_study.specs(VARIANTS["maca"])

    def train(mesh):
        policy = lm_policy(tiny_lm(0, **size)[0], tokenizer, small_study.world.pool.names, max_task_words=8, mesh=mesh)
        history = train_grpo(policy, tasks, small_study.world, specs, VARIANTS["maca"], grpo)
        return policy, [_timeless(h) for h in history]

    one, one_history = train(None)
    split, split_history = train(make_mesh((2, 2, 2)))
    kernel = split.params["lm"]["layers"][0]["mlp"]["gate_proj"][...]
    assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
    assert kernel.addressable_shards[0].data.shape == (kernel.shape[0] // 2, kernel.shape[1] // 2)
    assert [h["accuracy"] for h in split_history] == [h["accuracy"] for h in one_history]
    for a, b in zip(split_history, one_history, strict=False):
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], abs=1e-4) for k in a)
    for a, b in zip(jax.tree.leaves(split.params), jax.tree.leaves(one.params), strict=False):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4)
