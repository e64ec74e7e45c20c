"""The native CPU kernel of the gated delta rule (porch_jax/kernels) against the pure-JAX forms:
values against the recurrent form, gradients against the chunked form's hand-written backward, for
each of the kernel's code paths (head dims 64 and 128, other multiples of 16, anything else)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from porch_jax.kernels import gated_delta, native
from porch_jax.models import deltanet

pytestmark = pytest.mark.skipif(
    not gated_delta.available(), reason="the native kernel needs a C++ compiler (g++); see the warning in the log"
)

# (batch, tokens, key heads, value heads, key dim, value dim): partial last chunk, one token, every
# template path of the kernel (64, 128, a multiple of 16, an odd size).
SHAPES = [
    (2, 150, 2, 4, 64, 64),
    (1, 1, 1, 1, 64, 64),
    (1, 70, 1, 2, 128, 128),
    (2, 65, 2, 2, 32, 48),
    (1, 90, 1, 3, 16, 24),
]


def operands(b, t, hk, h, dk, dv, seed=0):
    rng = np.random.RandomState(seed)
    q = deltanet.l2norm(jnp.asarray(rng.randn(b, t, hk, dk), jnp.float32)) * dk**-0.5
    k = deltanet.l2norm(jnp.asarray(rng.randn(b, t, hk, dk), jnp.float32))
    v = jnp.asarray(rng.randn(b, t, h, dv), jnp.float32)
    g = jnp.asarray(-0.3 * np.abs(rng.randn(b, t, h)), jnp.float32)
    beta = jnp.asarray(1 / (1 + np.exp(-rng.randn(b, t, h))), jnp.float32)
    state = jnp.asarray(0.1 * rng.randn(b, h, dk, dv), jnp.float32)
    segments = jnp.asarray(np.sort(rng.randint(0, 3, (b, t)), axis=1), jnp.int32)  # restarts mid-chunk
    return (q, k, v, g, beta), state, segments


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("packed", [False, True], ids=["one_sequence", "packed"])
def test_values_equal_the_recurrent_form(shape, packed):
    args, state, segments = operands(*shape)
    kwargs = dict(initial_state=state, segment_ids=segments if packed else None)
    out, final = jax.jit(gated_delta.gated_delta_rule)(*args, **kwargs)
    want, want_final = jax.jit(deltanet.recurrent_gated_delta_rule)(*args, **kwargs)
    np.testing.assert_allclose(out, want, atol=2e-6, rtol=0)
    np.testing.assert_allclose(final, want_final, atol=2e-6, rtol=0)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gradients_equal_the_chunked_form(shape):
    args, state, segments = operands(*shape, seed=1)
    rng = np.random.RandomState(2)
    probe = jnp.asarray(rng.randn(*args[2].shape), jnp.float32)
    probe_final = jnp.asarray(rng.randn(*state.shape), jnp.float32)

    def loss(rule):
        def value(q, k, v, g, beta, state):
            out, final = rule(q, k, v, g, beta, initial_state=state, segment_ids=segments)
            return jnp.sum(out * probe) + jnp.sum(final * probe_final)

        return jax.jit(jax.grad(value, argnums=tuple(range(6))))

    ours, want = loss(gated_delta.gated_delta_rule)(*args, state), loss(deltanet.chunk_gated_delta_rule)(*args, state)
    for name, a, b in zip(["q", "k", "v", "g", "beta", "state"], ours, want, strict=False):
        assert np.abs(b).max() > 0, name
        np.testing.assert_allclose(a, b, atol=2e-5 * np.abs(b).max(), rtol=0, err_msg=name)


def test_models_use_the_kernels_on_cpu_unless_told_otherwise(monkeypatch):
    args, _, _ = operands(1, 8, 1, 1, 16, 16)
    x, weight = jnp.ones((1, 8, 32)), jnp.ones((32, 4))

    def custom_calls() -> tuple[int, int]:  # new functions each time: the choice is made when tracing
        rule = jax.jit(lambda *a: deltanet.gated_delta_rule(*a)).lower(*args).as_text()
        conv = jax.jit(lambda *a: deltanet.causal_conv1d(*a)).lower(x, weight).as_text()
        return rule.count("PorchGatedDeltaForward"), conv.count("PorchCausalConvForward")

    assert custom_calls() == (1, 1)
    monkeypatch.setenv("PORCH_JAX_CPU_KERNELS", "off")
    assert custom_calls() == (0, 0)
    monkeypatch.setenv("PORCH_JAX_CPU_KERNELS", "on")
    assert custom_calls() == (1, 1)
    with pytest.raises(ValueError, match="does not take these shapes"):  # 24 channels: not a multiple of 16
        deltanet.causal_conv1d(jnp.ones((1, 8, 24)), jnp.ones((24, 4)))
    monkeypatch.setenv("PORCH_JAX_CPU_KERNELS", "fast")
    with pytest.raises(ValueError, match="PORCH_JAX_CPU_KERNELS='fast'"):
        deltanet.gated_delta_rule(*args)
    monkeypatch.setenv("PORCH_JAX_CPU_KERNELS", "auto")  # auto takes the XLA form where the kernel cannot run
    assert deltanet.causal_conv1d(jnp.ones((1, 8, 24)), jnp.ones((24, 4)))[0].shape == (1, 8, 24)


def test_build_without_a_compiler_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("PORCH_JAX_KERNEL_CACHE", str(tmp_path))  # no cached library to fall back on
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler found"):
        native.build("gated_delta_cpu.cc")


def test_bad_shapes_are_refused_with_what_was_expected():
    (q, k, v, g, beta), state, _ = operands(1, 8, 2, 2, 16, 16)
    with pytest.raises(ValueError, match="multiple of the key heads"):
        gated_delta.gated_delta_rule(q, k, jnp.concatenate([v, v[:, :, :1]], axis=2), g, beta)
    with pytest.raises(ValueError, match=r"must be \[B, T, value heads\]"):
        gated_delta.gated_delta_rule(q, k, v, g[:, :4], beta)
    with pytest.raises(ValueError, match=r"initial_state \(1, 2, 16, 8\)"):
        gated_delta.gated_delta_rule(q, k, v, g, beta, initial_state=state[..., :8])


def test_an_empty_sequence_passes_the_state_through():
    args, state, _ = operands(1, 0, 1, 2, 16, 16)
    out, final = jax.jit(gated_delta.gated_delta_rule)(*args, initial_state=state)
    assert out.shape == (1, 0, 2, 16)
    np.testing.assert_array_equal(final, state)


def test_sharded_over_cpu_devices_gives_the_same_gradients():
    """No partitioning rule: XLA gathers the operands. Exact, on the 8 host devices conftest makes."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    if jax.device_count() < 2:
        pytest.skip("needs several host devices (tests/conftest.py sets 8)")
    args, _, _ = operands(jax.device_count(), 20, 1, 2, 16, 16)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharded = [jax.device_put(x, NamedSharding(mesh, PartitionSpec("data"))) for x in args]

    def grads(rule):
        return jax.jit(jax.grad(lambda *a: jnp.sum(rule(*a)[0] ** 2), argnums=tuple(range(5))))

    for a, b in zip(
        grads(gated_delta.gated_delta_rule)(*sharded), grads(deltanet.chunk_gated_delta_rule)(*args), strict=False
    ):
        np.testing.assert_allclose(a, b, atol=2e-5 * np.abs(b).max(), rtol=0)


def test_under_a_mesh_the_kernels_run_per_batch_shard_without_gathering():
    """Under `jax.set_mesh`, each device runs the kernels on its rows of the batch."""
    from porch_jax.train import mesh as mesh_lib

    if jax.device_count() < 2:
        pytest.skip("needs several host devices (tests/conftest.py sets 8)")
    n = jax.device_count()
    mesh = mesh_lib.make_mesh((n, 1, 1))
    (q, k, v, g, beta), state, segments = operands(n, 20, 1, 2, 16, 16)
    x, weight = jnp.asarray(np.random.RandomState(3).randn(n, 20, 32), jnp.float32), jnp.ones((32, 4)) * 0.1

    def loss(q, k, v, g, beta, state, x, weight):
        out, final = deltanet.gated_delta_rule(q, k, v, g, beta, initial_state=state, segment_ids=segments)
        y, _ = deltanet.causal_conv1d(x, weight, segment_ids=segments)
        return jnp.sum(out**2) + jnp.sum(final) + jnp.sum(y**2)

    args = (q, k, v, g, beta, state, x, weight)
    want = jax.jit(jax.grad(loss, argnums=tuple(range(8))))(*args)
    with jax.set_mesh(mesh):
        step = jax.jit(lambda *a: jax.grad(loss, argnums=tuple(range(8)))(*a))
        hlo = step.lower(*args).compile().as_text()
        got = step(*args)
    assert "all-gather" not in hlo
    for a, b in zip(got, want, strict=False):
        np.testing.assert_allclose(a, b, atol=1e-5 * max(1.0, float(np.abs(b).max())), rtol=0)
