"""Gated DeltaNet core: chunked vs recurrent vs transformers' torch reference, gradients, packing, conv."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from porch_jax.models import deltanet

torch = pytest.importorskip("torch", reason="torch is in the test extra (torch==2.13.0); scripts/test.sh installs it")
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf  # noqa: E402

B, T, HK, HV, DK, DV = 2, 150, 2, 4, 16, 24  # T spans 3 chunks, the last one partial
SEGMENTS = [[(1, 40), (2, 60), (3, 50)], [(1, 64), (2, 66), (0, 20)]]  # (id, length); 0 = padding


def inputs(seed: int = 0, t: int = T) -> dict[str, np.ndarray]:
    """Raw (un-normalised) inputs as transformers' kernels take them, with grouped key heads."""
    rng = np.random.RandomState(seed)
    return dict(
        q=rng.randn(B, t, HK, DK).astype(np.float32),
        k=rng.randn(B, t, HK, DK).astype(np.float32),
        v=rng.randn(B, t, HV, DV).astype(np.float32),
        g=(-0.3 * np.abs(rng.randn(B, t, HV))).astype(np.float32),
        beta=(1 / (1 + np.exp(-rng.randn(B, t, HV)))).astype(np.float32),
        state=(0.1 * rng.randn(B, HV, DK, DV)).astype(np.float32),
    )


def prepared(x: dict, repeat: bool = False) -> tuple:
    """Our kernels' inputs: q/k l2-normalised, q scaled; key heads grouped, or repeated per value head."""
    q = deltanet.l2norm(jnp.asarray(x["q"])) * DK**-0.5
    k = deltanet.l2norm(jnp.asarray(x["k"]))
    if repeat:
        q, k = (jnp.repeat(y, HV // HK, axis=2) for y in (q, k))
    return q, k, jnp.asarray(x["v"]), jnp.asarray(x["g"]), jnp.asarray(x["beta"])


def segment_ids() -> np.ndarray:
    return np.stack([np.concatenate([np.full(n, i) for i, n in row]) for row in SEGMENTS]).astype(np.int32)


chunked = jax.jit(deltanet.chunk_gated_delta_rule)
recurrent = jax.jit(deltanet.recurrent_gated_delta_rule)


def test_chunked_and_recurrent_match_transformers():
    x = inputs()
    t = {name: torch.tensor(v) for name, v in x.items()}
    want, want_state = hf.torch_chunk_gated_delta_rule(
        t["q"],
        t["k"],
        t["v"],
        t["g"],
        t["beta"],
        initial_state=t["state"],
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    for rule in (chunked, recurrent):
        out, state = rule(*prepared(x), initial_state=jnp.asarray(x["state"]))
        np.testing.assert_allclose(out, want.numpy(), atol=2e-5, rtol=0)
        np.testing.assert_allclose(state, want_state.numpy(), atol=2e-5, rtol=0)


def test_grouped_key_heads_equal_repeated_ones():
    """The chunked form shares each key head's Gram matrices across its value heads; that must be
    the same rule as giving every value head its own copy of the key head."""
    x = inputs(4)
    for rule in (chunked, recurrent):
        grouped = rule(*prepared(x), initial_state=jnp.asarray(x["state"]), segment_ids=jnp.asarray(segment_ids()))
        repeated = rule(
            *prepared(x, repeat=True), initial_state=jnp.asarray(x["state"]), segment_ids=jnp.asarray(segment_ids())
        )
        for got, want in zip(grouped, repeated, strict=False):
            np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="multiple of the key heads"):
        deltanet.chunk_gated_delta_rule(
            *prepared(x)[:2], jnp.zeros((B, T, 3, DV)), jnp.zeros((B, T, 3)), jnp.zeros((B, T, 3))
        )


@pytest.mark.parametrize("t, packed, chunk", [(80, False, 64), (150, True, 64), (150, True, 32)])
def test_chunked_gradients_match_recurrent(t, packed, chunk):
    """The hand-written backward against autodiff of the token-by-token form: a partial last chunk,
    grouped key heads, an initial state, and packed segments (boundaries inside and at chunk edges)."""
    x = inputs(1, t=t)
    args = (*prepared(x), jnp.asarray(x["state"]))
    weights = jnp.asarray(np.random.RandomState(2).randn(B, t, HV, DV).astype(np.float32))
    segments = jnp.asarray(segment_ids()) if packed else None

    def loss(rule, **kwargs):
        def f(q, k, v, g, beta, state):
            out, final = rule(q, k, v, g, beta, initial_state=state, segment_ids=segments, **kwargs)
            return jnp.sum(out * weights) + jnp.sum(final**2)

        return jax.jit(jax.grad(f, argnums=tuple(range(6))))

    chunk_grads = loss(deltanet.chunk_gated_delta_rule, chunk_size=chunk)(*args)
    for got, want in zip(chunk_grads, loss(deltanet.recurrent_gated_delta_rule)(*args), strict=False):
        scale = float(jnp.max(jnp.abs(want)))
        assert scale > 0
        np.testing.assert_allclose(got, want, atol=1e-5 * max(scale, 1.0), rtol=0)


def test_packed_segments_equal_separate_runs():
    x = inputs(3)
    q, k, v, g, beta = prepared(x)
    packed = [rule(q, k, v, g, beta, segment_ids=jnp.asarray(segment_ids())) for rule in (chunked, recurrent)]
    # Each segment alone, as a row of its own; zero tokens after it leave its state unchanged.
    pieces = [
        (row, start, n)
        for row, parts in enumerate(SEGMENTS)
        for start, n in zip(np.cumsum([0] + [n for _, n in parts]), [n for _, n in parts], strict=False)
    ]

    def alone(x):
        out = np.zeros((len(pieces), *x.shape[1:]), np.float32)
        for i, (row, start, n) in enumerate(pieces):
            out[i, :n] = x[row, start : start + n]
        return jnp.asarray(out)

    separate, separate_state = recurrent(*(alone(np.asarray(a)) for a in (q, k, v, g, beta)))
    for i, (row, start, n) in enumerate(pieces):
        for out, _ in packed:
            np.testing.assert_allclose(out[row, start : start + n], separate[i, :n], atol=2e-5, rtol=0)
    for row, last in ((0, 2), (1, 5)):  # a row's final state is that of its last segment alone
        for _, state in packed:
            np.testing.assert_allclose(state[row], separate_state[last], atol=2e-5, rtol=0)


def test_prefill_state_then_recurrent_steps_equal_one_pass():
    x = inputs(4)
    q, k, v, g, beta = prepared(x)
    full, full_state = chunked(q, k, v, g, beta)
    split = T - 3
    head, state = chunked(q[:, :split], k[:, :split], v[:, :split], g[:, :split], beta[:, :split])
    outs = [head]
    for t in range(split, T):  # decoding: one token at a time from the prefill state
        step = slice(t, t + 1)
        out, state = recurrent(q[:, step], k[:, step], v[:, step], g[:, step], beta[:, step], initial_state=state)
        outs.append(out)
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, atol=2e-5, rtol=0)
    np.testing.assert_allclose(state, full_state, atol=2e-5, rtol=0)


def test_unit_lower_inverse():
    rng = np.random.RandomState(5)
    lower = jnp.asarray(np.tril(rng.randn(3, 64, 64), -1).astype(np.float32) * 0.2)
    eye = jnp.eye(64, dtype=jnp.float32)
    np.testing.assert_allclose(
        deltanet.unit_lower_inverse(lower) @ (eye + lower), np.broadcast_to(eye, (3, 64, 64)), atol=1e-5, rtol=0
    )


def _native_conv(*args, **kwargs):
    from porch_jax.kernels import causal_conv

    if not causal_conv.available():
        pytest.skip("the native kernel needs a C++ compiler (g++); see the warning in the log")
    return causal_conv.causal_conv1d(*args, **kwargs)


@pytest.mark.parametrize(
    "conv, channels",
    [(deltanet.xla_causal_conv1d, 10), (deltanet.xla_causal_conv1d, 32), (_native_conv, 32)],
    ids=["xla-10", "xla-32", "native-32"],
)
def test_causal_conv_matches_transformers_and_continues_from_state(conv, channels):
    rng = np.random.RandomState(6)
    x = rng.randn(B, 20, channels).astype(np.float32)
    weight = rng.randn(channels, 4).astype(np.float32)
    want = hf.causal_conv1d_fn(torch.tensor(x).transpose(1, 2), torch.tensor(weight), activation="silu")
    full, _ = conv(jnp.asarray(x), jnp.asarray(weight))
    np.testing.assert_allclose(full, want.transpose(1, 2).numpy(), atol=1e-5, rtol=0)
    head, state = conv(jnp.asarray(x[:, :7]), jnp.asarray(weight))
    tail, _ = conv(jnp.asarray(x[:, 7:]), jnp.asarray(weight), state=state)
    np.testing.assert_allclose(jnp.concatenate([head, tail], axis=1), full, atol=1e-5, rtol=0)
    segments = np.repeat([[1, 2, 3]], B, axis=0).repeat([5, 1, 14], axis=1)  # a 1-token segment too
    packed, _ = conv(jnp.asarray(x), jnp.asarray(weight), segment_ids=jnp.asarray(segments))
    for start, end in ((0, 5), (5, 6), (6, 20)):
        alone, _ = conv(jnp.asarray(x[:, start:end]), jnp.asarray(weight))
        np.testing.assert_allclose(packed[:, start:end], alone, atol=1e-6, rtol=0)
