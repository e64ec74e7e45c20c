"""The same model on a (2 data, 2 fsdp, 2 tensor) mesh of 8 fake CPU devices and unsharded."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from porch_jax.models import (
    ModelConfig,
    data_sharding,
    from_pretrained,
    init_model,
    logical_to_spec,
    make_mesh,
    save_pretrained,
    shard_model,
)

CONFIG = ModelConfig(
    model_type="qwen3",
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    tie_word_embeddings=False,
)


@pytest.fixture(scope="module")
def mesh():
    if jax.device_count() < 8:
        pytest.skip("needs 8 (fake) devices: see tests/conftest.py")
    return make_mesh((2, 2, 2))


def logits_and_grad_norm(model, ids):
    def loss(m):
        return jnp.mean(m(ids) ** 2)

    value, grads = nnx.value_and_grad(loss)(model)
    return model(ids), value, jax.tree.map(jnp.linalg.norm, grads)


def test_sharded_forward_and_grads_equal_unsharded(mesh):
    ids = jnp.asarray(np.random.RandomState(0).randint(0, 64, (4, 24)), jnp.int32)
    step = nnx.jit(logits_and_grad_norm)
    want = step(init_model(CONFIG, seed=7), ids)
    sharded = init_model(CONFIG, seed=7, mesh=mesh)
    assert sharded.layers[0].mlp.gate_proj[...].sharding.spec == P("fsdp", "tensor")
    assert sharded.embed_tokens[...].sharding.spec == P("tensor", "fsdp")
    with jax.set_mesh(mesh):
        got = step(sharded, jax.device_put(ids, data_sharding(mesh)))
    assert got[0].sharding.spec[0] == ("data", "fsdp")
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5), got, want)


def test_from_pretrained_places_tensors_on_the_mesh(mesh, tmp_path):
    model = init_model(CONFIG, seed=3)
    save_pretrained(model, tmp_path)
    loaded = from_pretrained(tmp_path, mesh=mesh)
    for (path, got), (_, want) in zip(
        nnx.to_flat_state(nnx.state(loaded)), nnx.to_flat_state(nnx.state(model)), strict=False
    ):
        assert got[...].sharding.mesh == mesh, path
        np.testing.assert_array_equal(np.asarray(got[...]), np.asarray(want[...]))
    assert loaded.layers[1].self_attn.o_proj[...].sharding.spec == P("tensor", None, "fsdp")


def test_uneven_dimensions_are_replicated(mesh):
    assert logical_to_spec(("embed", "kv_heads", "head_dim"), mesh=mesh, shape=(32, 1, 8)) == P("fsdp", None, None)
    assert logical_to_spec(("batch", "embed")) == P(("data", "fsdp"), None)  # fsdp already taken by batch
    with pytest.raises(KeyError, match="unknown_axis"):
        logical_to_spec(("unknown_axis",))


def test_shard_model_is_in_place_and_keeps_values(mesh):
    model = init_model(CONFIG, seed=5)
    before = np.asarray(model.lm_head[...])
    assert shard_model(model, mesh) is model
    assert model.lm_head[...].sharding.spec == P("fsdp", "tensor")
    np.testing.assert_array_equal(np.asarray(model.lm_head[...]), before)
