"""Each method's step against a plain reference: full [B, T, V] logits from the model's own
__call__, targets located from the rows' prompt/target lengths (not the batch's index
arrays), losses written out here. Gradients are read back through SGD with learning rate 1."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tiny_data
from flax import nnx

from porch_jax.rows.records import decision_rows, opd_rows, recorded_groups
from porch_jax.train import losses
from porch_jax.train.methods import MethodConfig
from porch_jax.train.packing import SeqRow, scored_batch, seq_batch
from porch_jax.train.views import GroupView

T, K = 128, 32
PAD = SeqRow((0,), ())  # a row without targets: no loss, no count (PackedSource pads with it)


def _stack(host, accum=1):
    """Host arrays [B, ...] as the step's batch [accum, B / accum, ...]: `accum` micro-batches along a leading
    axis."""
    return jax.tree.map(lambda x: jnp.asarray(x.reshape(accum, x.shape[0] // accum, *x.shape[1:])), host)


def _prompt_target(row):
    """A one-span row's prompt and target tokens."""
    (span,) = row.spans
    return row.tokens[: span.start], row.tokens[span.start : span.start + span.length]


def _sft(tok, eps, n=8):
    return decision_rows(eps, tok)[:n]


def _policy(rows, accum=1):
    return _stack({"policy": seq_batch(rows, T, K)}, accum)


def _opod(tok, eps, n=8):
    """The first n decisions with an RWR row (a successful episode's) or an OPD row (a hint): per decision its RWR
    row or None, its OPD row or None, and its recorded action (the OPD rows' action here)."""
    every = {r.key: r for r in decision_rows(eps, tok)}
    rwr = {r.key: r for r in decision_rows([ep for ep in eps if ep.outcome.success], tok)}
    opd = {r.key: r for r in opd_rows(eps, tok, tiny_data.hints(eps))}
    keys = [k for k in every if k in rwr or k in opd][:n]
    return [(rwr.get(k), opd.get(k), _prompt_target(every[k])[1]) for k in keys]


def _opod_batch(decisions):
    """OPOD's views of `decisions`, one row each; a decision without a view's row gets a row without targets there."""
    prompts = [(o.student, o.teacher) if o else ((0,), (0,)) for _, o, _ in decisions]
    actions = [a if o else () for _, o, a in decisions]
    return _stack(
        {
            "rwr": seq_batch([r or PAD for r, _, _ in decisions], T, K),
            "student": scored_batch([s for s, _ in prompts], actions, T, K),
            "teacher": scored_batch([t for _, t in prompts], actions, T, K),
        }
    )


def _target_logps(model, pairs, t=T):
    """Per (prompt, target): log p(. | prompt, target_<j) at each target position j from full logits, located by
    lengths, and the target."""
    tokens = np.zeros((len(pairs), t), np.int32)
    mask = np.zeros((len(pairs), t), bool)
    for i, (prompt, target) in enumerate(pairs):
        seq = tuple(prompt) + tuple(target)
        tokens[i, : len(seq)], mask[i, : len(seq)] = seq, True
    logits = model(jnp.asarray(tokens), attention_mask=jnp.asarray(mask))
    logp = jax.nn.log_softmax(logits, axis=-1)
    out = []
    for i, (prompt, target) in enumerate(pairs):
        p, n = len(prompt), len(target)
        out.append((logp[i, p - 1 : p - 1 + n], jnp.asarray(target)))
    return out


def _ce_per_decision(model, pairs):
    return [-jnp.take_along_axis(lp, tgt[:, None], axis=1)[:, 0] for lp, tgt in _target_logps(model, pairs)]


def _assert_grads_close(got, want, rtol=2e-4, atol=2e-6):
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, np.asarray(w), rtol=rtol, atol=atol), got, want)


def _ref(model, loss_of_model, has_aux=False):
    """(value, grads) of a reference loss ((value, aux), grads with has_aux), jitted: op by op it takes minutes."""
    graphdef, params = nnx.split(model, nnx.Param)
    fn = jax.value_and_grad(lambda p: loss_of_model(nnx.merge(graphdef, p)), has_aux=has_aux)
    value, grads = jax.jit(fn)(params)
    return value, grads


@pytest.mark.parametrize("weights", [None, (1.0, 0.5, 0.0, 2.0)], ids=["unweighted", "weighted"])
def test_sft_step_matches_full_logit_cross_entropy(tok, eps, weights):
    """The loss is the weighted mean over decisions of each decision's mean cross-entropy, counted over the
    decisions of non-zero weight (RWR's rewards: a zero leaves a decision out)."""
    w = [1.0 if weights is None else weights[i % len(weights)] for i in range(8)]
    rows = [
        dataclasses.replace(r, spans=tuple(dataclasses.replace(s, weight=wi) for s in r.spans))
        for r, wi in zip(_sft(tok, eps), w, strict=True)
    ]
    pairs = [_prompt_target(r) for r in rows]
    model = tiny_data.model()

    def ref(m):
        ce = _ce_per_decision(m, pairs)
        return sum(wi * c.mean() for wi, c in zip(w, ce, strict=True)) / sum(wi != 0 for wi in w)

    metrics, grads = tiny_data.grads_via_sgd("sft", model, _policy(rows), MethodConfig())
    want, want_grads = _ref(model, ref)
    assert metrics["ce"] == pytest.approx(float(want), rel=1e-5)
    assert metrics["ce_count"] == sum(wi != 0 for wi in w)
    _assert_grads_close(grads, want_grads)


def test_gradient_accumulation_is_exact(tok, eps):
    rows, cfg = _sft(tok, eps), MethodConfig()
    whole, g1 = tiny_data.grads_via_sgd("sft", tiny_data.model(), _policy(rows, accum=1), cfg)
    split, g4 = tiny_data.grads_via_sgd("sft", tiny_data.model(), _policy(rows, accum=4), cfg)
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
    batch, cfg = _policy(_sft(tok, eps)), MethodConfig()
    one, g1 = tiny_data.grads_via_sgd("sft", tiny_data.model(), batch, cfg)
    many, g8 = tiny_data.grads_via_sgd("sft", tiny_data.model(), batch, cfg, mesh_shape=(2, 2, 2))
    assert dict(seen[-1]) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert many["ce"] == pytest.approx(one["ce"], rel=1e-5) and many["ce_count"] == one["ce_count"]
    _assert_grads_close(g8, g1, rtol=1e-4, atol=1e-6)


def test_opod_step_is_rwr_plus_lambda_reverse_kl_to_the_frozen_hinted_teacher(tok, eps):
    decisions = _opod(tok, eps)
    assert any(r is None for r, _, _ in decisions) and any(o is None for _, o, _ in decisions)
    student, teacher = tiny_data.model(seed=0), tiny_data.model(seed=1)
    lam = 0.7
    rwr_pairs = [_prompt_target(r) for r, _, _ in decisions if r is not None]
    opd = [(o, a) for _, o, a in decisions if o is not None]

    def parts(m):
        rwr = jnp.mean(jnp.stack([c.mean() for c in _ce_per_decision(m, rwr_pairs)]))
        s_lp = _target_logps(m, [(o.student, a) for o, a in opd])
        t_lp = _target_logps(teacher, [(o.teacher, a) for o, a in opd])
        kls = []
        for (ls, _), (lt, _) in zip(s_lp, t_lp, strict=True):
            # ls, lt: log-probs over the vocabulary at each action position
            kl = jnp.sum(jnp.exp(ls) * (ls - jax.lax.stop_gradient(lt)), axis=-1)
            kls.append(kl.mean())
        return rwr, jnp.mean(jnp.stack(kls))

    cfg = MethodConfig(opd_weight=lam)
    teacher_before = jax.tree.map(np.asarray, nnx.state(teacher, nnx.Param))
    metrics, grads = tiny_data.grads_via_sgd("opod", student, _opod_batch(decisions), cfg, frozen_model=teacher)

    def ref(m):
        rwr, kl = parts(m)
        return rwr + lam * kl, (rwr, kl)

    (loss, (rwr, kl)), want_grads = _ref(student, ref, has_aux=True)
    assert metrics["rwr"] == pytest.approx(float(rwr), rel=1e-5)
    assert metrics["opd"] == pytest.approx(float(kl), rel=1e-4) and metrics["kl"] == metrics["opd"] > 0
    assert metrics["loss"] == pytest.approx(float(loss), rel=1e-5)
    assert metrics["rwr_count"] == len(rwr_pairs) and metrics["opd_count"] == len(opd)
    _assert_grads_close(grads, want_grads)
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, nnx.state(teacher, nnx.Param)), teacher_before)


def _grpo_on_decisions(tok, eps):
    """GRPO rows on recorded decisions, advantages alternating 1 and 0, no sampler log-probabilities (on-policy)."""
    pairs = [_prompt_target(r) for r in _sft(tok, eps)]
    policy = scored_batch([p for p, _ in pairs], [a for _, a in pairs], T, K)
    advantages = np.asarray([1.0 - i % 2 for i in range(len(pairs))], np.float32)
    return _stack({"policy": GroupView(**vars(policy), advantage=advantages)})


@pytest.mark.parametrize("method", ["opod", "grpo"])
def test_layer_remat_gives_the_same_step_with_a_frozen_model(tok, eps, method):
    """OPD's teacher and GRPO's KL reference are frozen models merged inside the student's gradient trace; with layer
    remat on, the step runs and equals the step without it."""
    if method == "opod":
        batch, cfg = _opod_batch(_opod(tok, eps)), MethodConfig(opd_weight=0.5)
    else:
        batch, cfg = _grpo_on_decisions(tok, eps), MethodConfig(kl_coef=0.1)
    runs = [
        tiny_data.grads_via_sgd(method, tiny_data.model(0, remat=remat), batch, cfg, frozen_model=tiny_data.model(1))
        for remat in (False, True)
    ]
    (plain, g_plain), (remat, g_remat) = runs
    assert remat["loss"] == pytest.approx(plain["loss"], rel=1e-6)
    _assert_grads_close(g_remat, g_plain)


def _grpo_batch(groups, tok, t=64, k=16):
    """Recorded groups as GRPO rows (each sample under its group's prompt, with its log-probabilities) and their
    group-normalised advantages; also the rows' (prompt, action, logprobs)."""
    recorded = recorded_groups(groups, tok)
    rows = [(g.prompt, s.token_ids, s.logprobs) for g in recorded for s in g.samples]
    rewards = np.asarray([[s.reward for s in g.samples] for g in recorded], np.float32)
    advantages = np.asarray(losses.group_advantages(rewards), np.float32).reshape(-1)
    policy = scored_batch([p for p, _, _ in rows], [a for _, a, _ in rows], t, k, [lp for _, _, lp in rows])
    return _stack({"policy": GroupView(**vars(policy), advantage=advantages)}), rows, advantages


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
    batch, rows, advantages = _grpo_batch(groups, tok)
    model = tiny_data.model()
    cfg = MethodConfig(clip_eps=0.2)

    def ref(m):
        total, count = 0.0, 0
        lps = _target_logps(m, [(p, a) for p, a, _ in rows], t=64)
        for (lp, tgt), (_, _, old), adv in zip(lps, rows, advantages, strict=True):
            new = jnp.take_along_axis(lp, tgt[:, None], axis=1)[:, 0]
            ratio = jnp.exp(new - jnp.asarray(old))
            total += jnp.sum(-jnp.minimum(ratio * adv, jnp.clip(ratio, 0.8, 1.2) * adv))
            count += len(tgt)
        return total / count

    metrics, grads = tiny_data.grads_via_sgd("grpo", model, batch, cfg)
    want, want_grads = _ref(model, ref)
    assert metrics["pg"] == pytest.approx(float(want), rel=1e-5, abs=1e-7)
    assert metrics["clip_fraction"] > 0
    _assert_grads_close(grads, want_grads)


def test_on_policy_opd_rows_resample_the_action_and_the_logprob_gap_is_small(tok, eps):
    from porch_jax.train import mesh as mesh_lib
    from porch_jax.train import sources
    from porch_jax.train.config import SamplingConfig

    recorded = {r.key: _prompt_target(r)[1] for r in decision_rows(eps, tok)}
    rows = opd_rows(eps, tok, tiny_data.hints(eps))[:4]
    by_prompt = {r.student: r for r in rows}
    model = tiny_data.model()
    sampling = SamplingConfig(max_new_tokens=8, temperature=1.0, seed=0)
    source = sources.OpdSource(rows, tok, sampling, 4, (T,), mesh_lib.make_mesh((1, 1, 1)))
    assert isinstance(source.sampler, sources.ActionSampler)
    host, _ = source.host(1, model)
    s, t = host["student"], host["teacher"]
    seen = []
    for i in range(len(rows)):
        action = s.targets[i][s.target_mask[i]]
        assert 0 < len(action) <= 8
        np.testing.assert_array_equal(t.targets[i][t.target_mask[i]], action)
        np.testing.assert_array_equal(s.sampled[i], s.target_mask[i])  # every action token has its logprob
        row = by_prompt[tuple(s.tokens[i][: s.mask[i].sum() - len(action)].tolist())]
        assert tuple(t.tokens[i][: t.mask[i].sum() - len(action)].tolist()) == row.teacher
        assert tuple(action.tolist()) != recorded[row.key]  # the student's sample, not the recorded action
        seen.append(row.key)
    assert sorted(seen) == sorted(r.key for r in rows)
    metrics, _ = tiny_data.grads_via_sgd("opd", model, _stack(host), MethodConfig(), frozen_model=model)
    # Same weights in the sampler and the trainer: only numerics separate their log-probs.
    assert metrics["sampled_tokens"] == s.sampled.sum() > 0 and metrics["logprob_gap"] < 1e-3


def test_bf16_compute_keeps_fp32_master_params(tok, eps):
    from porch_jax.models import ModelConfig, init_model

    batch = _policy(_sft(tok, eps))
    config = ModelConfig.from_hf(tiny_data.TINY_HF | {"vocab_size": len(tok)})
    f32, _ = tiny_data.grads_via_sgd("sft", init_model(config, seed=0), batch, MethodConfig())
    bf16_model = init_model(config, seed=0, dtype=jnp.bfloat16, param_dtype=jnp.float32)
    bf16, grads = tiny_data.grads_via_sgd("sft", bf16_model, batch, MethodConfig())
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
        ("sft", _policy(_sft(tok, eps)), MethodConfig(), None),
        ("opod", _opod_batch(_opod(tok, eps)), MethodConfig(opd_weight=0.5), model(1)),
        ("grpo", _grpo_batch(groups, tok)[0], MethodConfig(), None),
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
