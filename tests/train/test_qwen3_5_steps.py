"""The training core's SFT and OPOD steps on a tiny Qwen3.5 (hybrid Gated DeltaNet + gated attention).

The step code is model-agnostic (hidden_states + lm_head_kernel); these tests check that a
Qwen3.5 goes through it: SFT lowers the loss on a fixed batch, and an OPOD step (RWR + λ ·
reverse KL to a frozen hinted teacher) has finite loss and gradients, trains only the student,
and equals the RWR step at λ = 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tiny_data
from flax import nnx

from porch_jax.models.qwen3_5 import Qwen3_5ForCausalLM
from porch_jax.rows.records import decision_rows, opd_rows
from porch_jax.train import mesh as mesh_lib
from porch_jax.train import step as S
from porch_jax.train.methods import MethodConfig
from porch_jax.train.packing import SeqRow, scored_batch, seq_batch

T, K = 128, 32


def _model(seed: int = 0) -> Qwen3_5ForCausalLM:
    model = tiny_data.qwen3_5_model(seed)
    assert isinstance(model, Qwen3_5ForCausalLM)
    return model


def _batch(host):
    """Host arrays [B, ...] as the step's batch of one micro-batch [1, B, ...]."""
    return jax.tree.map(lambda x: jnp.asarray(x[None]), host)


def _sft(tok, eps):
    return _batch({"policy": seq_batch(decision_rows(eps, tok)[:8], T, K)})


def _opod(tok, eps, n=8):
    """OPOD's views of the first n decisions with an RWR row (a successful episode's) or an OPD row (a hint), one
    row each: a decision without a view's row has a row without targets there; OPD's action is the recorded one.
    Also the RWR rows."""
    every = {r.key: r for r in decision_rows(eps, tok)}
    rwr = {r.key: r for r in decision_rows([ep for ep in eps if ep.outcome.success], tok)}
    opd = {r.key: r for r in opd_rows(eps, tok, tiny_data.hints(eps))}
    keys = [k for k in every if k in rwr or k in opd][:n]
    assert any(k not in rwr for k in keys) and any(k not in opd for k in keys)
    actions = [every[k].tokens[every[k].spans[0].start :] if k in opd else () for k in keys]
    host = {
        "rwr": seq_batch([rwr.get(k, SeqRow((0,), ())) for k in keys], T, K),
        "student": scored_batch([opd[k].student if k in opd else (0,) for k in keys], actions, T, K),
        "teacher": scored_batch([opd[k].teacher if k in opd else (0,) for k in keys], actions, T, K),
    }
    return _batch(host), [rwr[k] for k in keys if k in rwr]


def _setup(method, model, cfg, tx):
    mesh = mesh_lib.make_mesh((1, 1, 1))
    graphdef, state, shardings = S.init_train_state(model, tx, mesh)
    return (
        S.TrainStep(
            tiny_data.method_of(method, cfg), graphdef, tx, lambda s: 1.0, mesh=mesh, state_shardings=shardings
        ),
        state,
        shardings,
    )


def _params(state):
    return jax.tree.map(np.asarray, state["params"])


def test_sft_steps_lower_the_loss_on_a_fixed_batch(tok, eps):
    step, state, _ = _setup("sft", _model(), MethodConfig(), optax.adamw(3e-3))
    batch = _sft(tok, eps)
    losses = []
    for _ in range(6):
        state, metrics = step(state, batch)
        losses.append(float(metrics["ce"]))
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.05, losses
    assert step.num_traces == 1


def test_opod_step_trains_only_the_student_and_equals_rwr_at_lambda_zero(tok, eps):
    batch, rwr_rows = _opod(tok, eps)
    teacher = _model(seed=1)
    teacher_before = jax.tree.map(np.asarray, nnx.state(teacher, nnx.Param))
    sgd = optax.sgd(1.0)  # grads = params_before - params_after

    def opod(lam):
        step, state, shardings = _setup("opod", _model(), MethodConfig(opd_weight=lam), sgd)
        frozen = jax.device_put(nnx.state(teacher, nnx.Param), shardings["params"], may_alias=False)
        before = _params(state)
        state, metrics = step(state, batch, frozen)
        grads = jax.tree.map(lambda b, a: b - np.asarray(a), before, state["params"])
        return {k: float(v) for k, v in metrics.items()}, grads, frozen

    m, grads, frozen = opod(0.7)
    assert all(np.isfinite(v) for v in m.values()), m
    assert m["opd"] > 0 and m["loss"] == pytest.approx(m["rwr"] + 0.7 * m["opd"], rel=1e-5)
    leaves = jax.tree.leaves(grads)
    assert all(np.all(np.isfinite(g)) for g in leaves) and sum(float(np.abs(g).sum()) for g in leaves) > 0
    # Gradient reaches the DeltaNet and the attention layer alike.
    layers = grads["layers"]
    assert np.abs(layers[0]["linear_attn"]["in_proj_qkv"][...]).max() > 0
    assert np.abs(layers[1]["self_attn"]["q_proj"][...]).max() > 0
    # The teacher is frozen: neither the model nor the parameters the step read changed.
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, nnx.state(teacher, nnx.Param)), teacher_before)
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, frozen), teacher_before)

    # λ = 0: the OPOD step is exactly the RWR step on the rwr view.
    m0, grads0, _ = opod(0.0)
    rwr_batch = _batch({"policy": seq_batch(rwr_rows, T, K)})
    rwr_step, state, _ = _setup("rwr", _model(), MethodConfig(), sgd)
    before = _params(state)
    state, mr = rwr_step(state, rwr_batch)
    grads_rwr = jax.tree.map(lambda b, a: b - np.asarray(a), before, state["params"])
    assert m0["loss"] == pytest.approx(float(mr["rwr"]), rel=1e-5) and m0["rwr"] == pytest.approx(
        float(mr["rwr"]), rel=1e-5
    )
    assert m0["rwr_count"] == float(mr["rwr_count"]) == len(rwr_rows)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7), grads0, grads_rwr)


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")  # a collective deadlock hangs in C++
def test_sharded_sft_step_equals_one_device(tok, eps):
    """A (data 2, fsdp 2, tensor 2) mesh of fake CPU devices gives the one-device loss and gradients. The
    native kernels fan out over XLA's thread pool while other devices wait in a collective: before their
    fan-out stopped waiting for helpers that had not started, this step never finished."""
    if jax.device_count() < 8:
        pytest.skip("needs 8 host devices (tests/conftest.py sets them)")
    batch = _sft(tok, eps)
    (one, g1), (many, g8) = (
        tiny_data.grads_via_sgd("sft", _model(), batch, MethodConfig(), mesh_shape=shape)
        for shape in ((1, 1, 1), (2, 2, 2))
    )
    assert many["loss"] == pytest.approx(one["loss"], rel=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), g8, g1)
