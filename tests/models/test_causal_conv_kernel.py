"""The native CPU kernel of DeltaNet's causal conv + SiLU (porch_jax/kernels) against the XLA form:
values, the carried state, and gradients w.r.t. input, weight and state, over several token blocks
of the kernel (128 tokens each), packed segments and two kernel widths."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from porch_jax.kernels import causal_conv
from porch_jax.models import deltanet

pytestmark = pytest.mark.skipif(
    not causal_conv.available(), reason="the native kernel needs a C++ compiler (g++); see the warning in the log"
)

SHAPES = [(2, 300, 48, 4), (1, 5, 16, 4), (2, 130, 64, 3), (1, 1, 32, 4)]  # (batch, tokens, channels, width)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("case", ["fresh", "state", "state_packed"])
def test_values_and_gradients_equal_the_xla_form(shape, case):
    b, t, c, k = shape
    rng = np.random.RandomState(0)
    x = jnp.asarray(rng.randn(b, t, c), jnp.float32)
    weight = jnp.asarray(0.4 * rng.randn(c, k), jnp.float32)
    state = jnp.asarray(rng.randn(b, k - 1, c), jnp.float32)
    segments = jnp.asarray(np.sort(rng.randint(0, 4, (b, t)), axis=1), jnp.int32)
    probe, probe_state = jnp.asarray(rng.randn(b, t, c), jnp.float32), jnp.asarray(rng.randn(b, k - 1, c), jnp.float32)

    def run(conv):
        def value(x, weight, state):
            y, new_state = conv(
                x,
                weight,
                state=None if case == "fresh" else state,
                segment_ids=segments if case == "state_packed" else None,
            )
            return jnp.sum(y * probe) + jnp.sum(new_state * probe_state), (y, new_state)

        return jax.jit(jax.grad(value, argnums=(0, 1, 2), has_aux=True))(x, weight, state)

    (grads, (y, new_state)), (want_grads, (want_y, want_state)) = (
        run(causal_conv.causal_conv1d),
        run(deltanet.xla_causal_conv1d),
    )
    np.testing.assert_allclose(y, want_y, atol=2e-6, rtol=0)
    np.testing.assert_array_equal(new_state, want_state)
    for name, got, want in zip(["x", "weight", "state"], grads, want_grads, strict=False):
        np.testing.assert_allclose(got, want, atol=2e-6 * max(1.0, float(np.abs(want).max())), rtol=0, err_msg=name)


def test_bad_shapes_are_refused_with_what_was_expected():
    x = jnp.ones((1, 8, 24))
    with pytest.raises(ValueError, match="multiples of 16, not 24"):
        causal_conv.causal_conv1d(x, jnp.ones((24, 4)))
    with pytest.raises(ValueError, match=r"state \(1, 2, 32\) \[B, K-1, C\] = \(1, 3, 32\)"):
        causal_conv.causal_conv1d(jnp.ones((1, 8, 32)), jnp.ones((32, 4)), state=jnp.ones((1, 2, 32)))
