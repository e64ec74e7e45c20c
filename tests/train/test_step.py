"""Each method's step against a plain reference: full [B, T, V] logits from the model's own
__call__, targets located from the examples' prompt/target lengths (not the batch's index
arrays), losses written out here. Gradients are read back through SGD with learning rate 1."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tiny_data
from flax import nnx

from porch_jax.attribution.grm import teacher_context
from porch_jax.train import data as D
from porch_jax.train.methods import MethodConfig


def _batch(exs, views, scalars=(), accum=1, t=128, k=32):
    rows = len(exs) // accum
    parts = [D.collate(exs[i * rows : (i + 1) * rows], views, scalars, t, k, pad_id=0) for i in range(accum)]
    return jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs)), *parts)


def _target_logps(model, view_list, t=128):
    """Per example: log p(target_j | prompt, target_<j) from full logits, located by lengths."""
    tokens = np.zeros((len(view_list), t), np.int32)
    mask = np.zeros((len(view_list), t), bool)
    for i, v in enumerate(view_list):
        seq = v.prompt + v.target
        tokens[i, : len(seq)], mask[i, : len(seq)] = seq, True
    logits = model(jnp.asarray(tokens), attention_mask=jnp.asarray(mask))
    logp = jax.nn.log_softmax(logits, axis=-1)
    out = []
    for i, v in enumerate(view_list):
        p, n = len(v.prompt), len(v.target)
        out.append((logp[i, p - 1 : p - 1 + n], jnp.asarray(v.target)))
    return out


def _ce_per_decision(model, views):
    return [-jnp.take_along_axis(lp, tgt[:, None], axis=1)[:, 0] for lp, tgt in _target_logps(model, views)]


def _assert_grads_close(got, want, rtol=2e-4, atol=2e-6):
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, np.asarray(w), rtol=rtol, atol=atol), got, want)


def _ref(model, loss_of_model, has_aux=False):
    """(value, grads) of a reference loss ((value, aux), grads with has_aux), jitted: op by op it takes minutes."""
    graphdef, params = nnx.split(model, nnx.Param)
    fn = jax.value_and_grad(lambda p: loss_of_model(nnx.merge(graphdef, p)), has_aux=has_aux)
    value, grads = jax.jit(fn)(params)
    return value, grads


@pytest.mark.parametrize("aggregation", ["token", "decision"])
def test_sft_step_matches_full_logit_cross_entropy(tok, eps, aggregation):
    exs = D.sft_examples(eps, tok)[:8]
    views = [e.views["policy"] for e in exs]
    model = tiny_data.model()

    def ref(m):
        ce = _ce_per_decision(m, views)
        if aggregation == "token":
            return jnp.sum(jnp.concatenate(ce)) / sum(len(c) for c in ce)
        return jnp.mean(jnp.stack([c.mean() for c in ce]))

    metrics, grads = tiny_data.grads_via_sgd(
        "sft", model, _batch(exs, ("policy",)), MethodConfig(aggregation=aggregation)
    )
    want, want_grads = _ref(model, ref)
    assert metrics["ce"] == pytest.approx(float(want), rel=1e-5)
    assert metrics["ce_count"] == (sum(len(v.target) for v in views) if aggregation == "token" else 8)
    _assert_grads_close(grads, want_grads)


def test_gradient_accumulation_is_exact(tok, eps):
    exs = D.sft_examples(eps, tok)[:8]
    cfg = MethodConfig(aggregation="decision")
    whole, g1 = tiny_data.grads_via_sgd("sft", tiny_data.model(), _batch(exs, ("policy",), accum=1), cfg)
    split, g4 = tiny_data.grads_via_sgd("sft", tiny_data.model(), _batch(exs, ("policy",), accum=4), cfg)
    assert split["ce"] == pytest.approx(whole["ce"], rel=1e-6) and split["ce_count"] == whole["ce_count"] == 8
    _assert_grads_close(g4, g1, rtol=1e-5, atol=1e-7)


def test_step_on_a_sharded_mesh_equals_one_device_and_traces_under_the_mesh(tok, eps, monkeypatch):
    """TrainStep traces under `jax.set_mesh`, so the models' activation constraints (and the native
    kernels' per-shard calls) see the mesh; a (2, 2, 2) mesh then gives the one-device gradients."""
    from porch_jax.models import qwen3

    if jax.device_count() < 8:
        pytest.skip("needs 8 host devices (tests/conftest.py sets them)")
    seen = []
    constrain = qwen3.constrain
    monkeypatch.setattr(
        qwen3, "constrain", lambda x, axes: seen.append(jax.sharding.get_abstract_mesh().shape) or constrain(x, axes)
    )
    exs = D.sft_examples(eps, tok)[:8]
    cfg = MethodConfig(aggregation="decision")
    one, g1 = tiny_data.grads_via_sgd("sft", tiny_data.model(), _batch(exs, ("policy",)), cfg)
    many, g8 = tiny_data.grads_via_sgd("sft", tiny_data.model(), _batch(exs, ("policy",)), cfg, mesh_shape=(2, 2, 2))
    assert dict(seen[-1]) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert many["ce"] == pytest.approx(one["ce"], rel=1e-5) and many["ce_count"] == one["ce_count"]
    _assert_grads_close(g8, g1, rtol=1e-4, atol=1e-6)


def test_opod_step_is_rwr_plus_lambda_reverse_kl_to_the_frozen_hinted_teacher(tok, eps):
    exs = D.opod_examples(eps, tok, tiny_data.hints(eps), teacher_context=teacher_context)[:8]
    assert any("rwr" not in e.views for e in exs) and any("teacher" not in e.views for e in exs)
    student, teacher = tiny_data.model(seed=0), tiny_data.model(seed=1)
    lam = 0.7
    rwr_views = [e.views["rwr"] for e in exs if "rwr" in e.views]
    opd = [e for e in exs if "teacher" in e.views]

    def parts(m):
        rwr = jnp.mean(jnp.stack([c.mean() for c in _ce_per_decision(m, rwr_views)]))
        s_lp = _target_logps(m, [e.views["student"] for e in opd])
        t_lp = _target_logps(teacher, [e.views["teacher"] for e in opd])
        kls = []
        for (ls, _), (lt, _) in zip(s_lp, t_lp, strict=False):
            ls_full = ls  # already log-probs over the vocabulary at each target position
            kl = jnp.sum(jnp.exp(ls_full) * (ls_full - jax.lax.stop_gradient(lt)), axis=-1)
            kls.append(kl.mean())
        return rwr, jnp.mean(jnp.stack(kls))

    cfg = MethodConfig(aggregation="decision", opd_weight=lam)
    teacher_before = jax.tree.map(np.asarray, nnx.state(teacher, nnx.Param))
    metrics, grads = tiny_data.grads_via_sgd(
        "opod", student, _batch(exs, ("rwr", "student", "teacher")), cfg, frozen_model=teacher
    )

    def ref(m):
        rwr, kl = parts(m)
        return rwr + lam * kl, (rwr, kl)

    (loss, (rwr, kl)), want_grads = _ref(student, ref, has_aux=True)
    assert metrics["rwr"] == pytest.approx(float(rwr), rel=1e-5)
    assert metrics["opd"] == pytest.approx(float(kl), rel=1e-4) and metrics["kl"] == metrics["opd"] > 0
    assert metrics["loss"] == pytest.approx(float(loss), rel=1e-5)
    assert metrics["rwr_count"] == len(rwr_views) and metrics["opd_count"] == len(opd)
    _assert_grads_close(grads, want_grads)
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, nnx.state(teacher, nnx.Param)), teacher_before)


@pytest.mark.parametrize("method", ["opod", "grpo"])
def test_layer_remat_gives_the_same_step_with_a_frozen_model(tok, eps, method):
    """OPD's teacher and GRPO's KL reference are frozen models merged inside the student's gradient trace; with layer
    remat on, the step runs and equals the step without it."""
    if method == "opod":
        exs = D.opod_examples(eps, tok, tiny_data.hints(eps), teacher_context=teacher_context)[:8]
        batch, cfg = _batch(exs, ("rwr", "student", "teacher")), MethodConfig(opd_weight=0.5)
    else:
        exs = [
            dataclasses.replace(e, scalars={"advantage": 1.0 - i % 2})
            for i, e in enumerate(D.sft_examples(eps, tok)[:8])
        ]
        batch, cfg = _batch(exs, ("policy",), ("advantage",)), MethodConfig(kl_coef=0.1)
    runs = [
        tiny_data.grads_via_sgd(method, tiny_data.model(0, remat=remat), batch, cfg, frozen_model=tiny_data.model(1))
        for remat in (False, True)
    ]
    (plain, g_plain), (remat, g_remat) = runs
    assert remat["loss"] == pytest.approx(plain["loss"], rel=1e-6)
    _assert_grads_close(g_remat, g_plain)


def test_grpo_step_matches_clipped_objective_on_full_logits(tok):
    ctx = [{"role": "user", "content": "choose the next agent"}]
    rng = np.random.default_rng(0)
    groups = [
        {
            "key": f"g{g}",
            "context": ctx + [{"role": "user", "content": f"round {g}"}],
            "samples": [
                {
                    "token_ids": rng.integers(10, 500, n).tolist(),
                    "logprobs": (-rng.uniform(3, 9, n)).tolist(),
                    "reward": float(r),
                }
                for n, r in zip((5, 9, 3, 7), (1, 0, 0, 1), strict=False)
            ],
        }
        for g in range(2)
    ]
    exs = D.grpo_examples(groups, tok)
    model = tiny_data.model()
    cfg = MethodConfig(clip_eps=0.2)

    def ref(m):
        total, count = 0.0, 0
        for (lp, tgt), ex in zip(_target_logps(m, [e.views["policy"] for e in exs], t=64), exs, strict=False):
            new = jnp.take_along_axis(lp, tgt[:, None], axis=1)[:, 0]
            ratio = jnp.exp(new - jnp.asarray(ex.views["policy"].logprobs))
            adv = ex.scalars["advantage"]
            total += jnp.sum(-jnp.minimum(ratio * adv, jnp.clip(ratio, 0.8, 1.2) * adv))
            count += len(tgt)
        return total / count

    metrics, grads = tiny_data.grads_via_sgd("grpo", model, _batch(exs, ("policy",), ("advantage",), t=64, k=16), cfg)
    want, want_grads = _ref(model, ref)
    assert metrics["pg"] == pytest.approx(float(want), rel=1e-5, abs=1e-7)
    assert metrics["clip_fraction"] > 0
    _assert_grads_close(grads, want_grads)


def test_on_policy_sampling_resamples_opd_targets_and_the_logprob_gap_is_small(tok, eps):
    from porch_jax.train.config import SamplingConfig
    from porch_jax.train.sources import ActionSampler, on_policy_targets

    exs = [
        e
        for e in D.opod_examples(eps, tok, tiny_data.hints(eps), teacher_context=teacher_context)
        if "teacher" in e.views
    ][:4]
    model = tiny_data.model()
    host = D.HostBatch([exs], (128, 32))
    sampler = ActionSampler(tok, SamplingConfig(max_new_tokens=8, temperature=1.0, seed=0), max_len=512)
    new = on_policy_targets(host, sampler, model, step=1)
    for old, ex in zip(exs, new.rows[0], strict=False):
        s = ex.views["student"]
        assert s.target == ex.views["teacher"].target != old.views["student"].target
        assert len(s.logprobs) == len(s.target) <= 8 and s.prompt == old.views["student"].prompt
    batch = _batch(new.rows[0], ("rwr", "student", "teacher"))
    metrics, _ = tiny_data.grads_via_sgd("opod", model, batch, MethodConfig(), frozen_model=model)
    # Same weights in the sampler and the trainer: only numerics separate their log-probs.
    assert metrics["sampled_tokens"] > 0 and metrics["logprob_gap"] < 1e-3


def test_bf16_compute_keeps_fp32_master_params(tok, eps):
    from porch_jax.models import ModelConfig, init_model

    exs = D.sft_examples(eps, tok)[:8]
    config = ModelConfig.from_hf(tiny_data.TINY_HF | {"vocab_size": len(tok)})
    f32, _ = tiny_data.grads_via_sgd("sft", init_model(config, seed=0), _batch(exs, ("policy",)), MethodConfig())
    bf16_model = init_model(config, seed=0, dtype=jnp.bfloat16, param_dtype=jnp.float32)
    bf16, grads = tiny_data.grads_via_sgd("sft", bf16_model, _batch(exs, ("policy",)), MethodConfig())
    assert {x.dtype for x in jax.tree.leaves(grads)} == {np.dtype("float32")}
    assert bf16["ce"] == pytest.approx(f32["ce"], rel=2e-2)


REMAT = "Involuntary full rematerialization"


@pytest.mark.slow
@pytest.mark.timeout(300, method="thread")  # a collective deadlock hangs in C++
@pytest.mark.parametrize("model_kind", ["qwen3", "qwen3.5"])
def test_sharded_steps_need_no_full_rematerialization(tok, eps, capfd, model_kind):
    """On a (data 2, fsdp 2, tensor 2) mesh, compiling the SFT, OPOD and GRPO steps must not make the
    partitioner replicate a whole activation to reshard it: XLA logs each such fallback as an involuntary
    full rematerialization (the embedding lookup in an fsdp-split table and the row-major transposes of
    the CPU backward pass did, 13 of them for SFT). The persistent compilation cache is off so every
    program is compiled here, where its log is read."""
    if jax.device_count() < 8:
        pytest.skip("needs 8 host devices (tests/conftest.py sets them)")

    def model(seed=0):
        return tiny_data.model(seed=seed) if model_kind == "qwen3" else tiny_data.qwen3_5_model(seed=seed)

    opod = D.opod_examples(eps, tok, tiny_data.hints(eps), teacher_context=teacher_context)[:8]
    groups = [
        {
            "key": "g",
            "context": [{"role": "user", "content": "choose the next agent"}],
            "samples": [
                {"token_ids": [11 + i, 12, 13], "logprobs": [-4.0, -5.0, -6.0], "reward": float(i % 2)}
                for i in range(8)
            ],
        }
    ]
    runs = [
        ("sft", _batch(D.sft_examples(eps, tok)[:8], ("policy",)), MethodConfig(), None),
        ("opod", _batch(opod, ("rwr", "student", "teacher")), MethodConfig(opd_weight=0.5), model(1)),
        ("grpo", _batch(D.grpo_examples(groups, tok), ("policy",), ("advantage",), t=64, k=16), MethodConfig(), None),
    ]
    cache = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        capfd.readouterr()
        for method, batch, cfg, frozen in runs:
            metrics, _ = tiny_data.grads_via_sgd(method, model(), batch, cfg, frozen_model=frozen, mesh_shape=(2, 2, 2))
            assert np.isfinite(metrics["loss"]), method
            log = capfd.readouterr().err
            assert REMAT not in log, f"{method}: {log.count(REMAT)} full rematerializations\n{log[:2000]}"
    finally:
        jax.config.update("jax_enable_compilation_cache", cache)
