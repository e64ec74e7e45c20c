"""A tiny random Llama and Qwen2 through the training core's step code as it is (read-only use of
porch_jax.train): SFT lowers the loss on a fixed batch, and an OPOD step (RWR + reverse KL to a frozen
teacher) has finite loss and gradients reaching every layer. The step code only calls `hidden_states`
and `lm_head_kernel`, which the Llama family shares with Qwen3."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_data  # noqa: E402

from porch_jax.models import LlamaForCausalLM, ModelConfig, Qwen2ForCausalLM, init_model  # noqa: E402
from porch_jax.rows.records import decision_rows, opd_rows  # noqa: E402
from porch_jax.train import mesh as mesh_lib  # noqa: E402
from porch_jax.train import step as S  # noqa: E402
from porch_jax.train.methods import MethodConfig  # noqa: E402
from porch_jax.train.packing import SeqRow, scored_batch, seq_batch  # noqa: E402

tok, eps = tiny_data.tok, tiny_data.eps  # the training tests' fixtures
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
T, K = 128, 32
CLASSES = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM}


def _model(model_type: str, seed: int = 0):
    hf = {k: v for k, v in tiny_data.TINY_HF.items() if k != "model_type"}
    config = ModelConfig.from_hf(hf | {"model_type": model_type, "vocab_size": len(tiny_data.tokenizer())})
    model = init_model(config, seed=seed)
    assert type(model) is CLASSES[model_type]
    return model


def _batch(host):
    """Host arrays [B, ...] as the step's batch of one micro-batch [1, B, ...]."""
    return jax.tree.map(lambda x: jnp.asarray(x[None]), host)


def _opod_batch(tok, eps, n=8):
    """OPOD's views of the first n decisions with an RWR row (a successful episode's) or an OPD row (a hint), one
    row each: a decision without a view's row has a row without targets there; OPD's action is the recorded one."""
    every = {r.key: r for r in decision_rows(eps, tok)}
    rwr = {r.key: r for r in decision_rows([ep for ep in eps if ep.outcome.success], tok)}
    opd = {r.key: r for r in opd_rows(eps, tok, tiny_data.hints(eps))}
    keys = [k for k in every if k in rwr or k in opd][:n]
    actions = [every[k].tokens[every[k].spans[0].start :] if k in opd else () for k in keys]
    return _batch(
        {
            "rwr": seq_batch([rwr.get(k, SeqRow((0,), ())) for k in keys], T, K),
            "student": scored_batch([opd[k].student if k in opd else (0,) for k in keys], actions, T, K),
            "teacher": scored_batch([opd[k].teacher if k in opd else (0,) for k in keys], actions, T, K),
        }
    )


def _setup(method, model, cfg, tx):
    mesh = mesh_lib.make_mesh((1, 1, 1))
    graphdef, state, shardings = S.init_train_state(model, tx, mesh)
    step = S.TrainStep(
        tiny_data.method_of(method, cfg), graphdef, tx, lambda s: 1.0, mesh=mesh, state_shardings=shardings
    )
    return step, state, shardings


@pytest.mark.parametrize("model_type", list(CLASSES))
def test_sft_steps_lower_the_loss(model_type, tok, eps):
    step, state, _ = _setup("sft", _model(model_type), MethodConfig(), optax.adamw(3e-3))
    batch = _batch({"policy": seq_batch(decision_rows(eps, tok)[:8], T, K)})
    losses = []
    for _ in range(5):
        state, metrics = step(state, batch)
        losses.append(float(metrics["ce"]))
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.05, losses


@pytest.mark.parametrize("model_type", list(CLASSES))
def test_opod_step_has_finite_loss_and_gradients_in_every_layer(model_type, tok, eps):
    step, state, shardings = _setup("opod", _model(model_type), MethodConfig(opd_weight=0.7), optax.sgd(1.0))
    frozen = jax.device_put(nnx.state(_model(model_type, seed=1), nnx.Param), shardings["params"], may_alias=False)
    before = jax.tree.map(np.asarray, state["params"])
    state, metrics = step(state, _opod_batch(tok, eps), frozen)
    m = {k: float(v) for k, v in metrics.items()}
    assert all(np.isfinite(v) for v in m.values()), m
    assert m["opd"] > 0 and m["loss"] == pytest.approx(m["rwr"] + 0.7 * m["opd"], rel=1e-5)
    grads = jax.tree.map(lambda b, a: b - np.asarray(a), before, state["params"])
    for i in range(2):
        for name in ("q_proj", "o_proj", *(("q_bias",) if model_type == "qwen2" else ())):
            g = np.asarray(grads["layers"][i]["self_attn"][name])
            assert np.all(np.isfinite(g)) and np.abs(g).sum() > 0, (i, name)
