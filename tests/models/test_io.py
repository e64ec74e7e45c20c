"""HF safetensors folders: both directions against transformers, sharded indexes, bad folders."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

torch = pytest.importorskip("torch", reason="torch is in the test extra (torch==2.13.0); scripts/test.sh installs it")
from transformers import AutoModelForCausalLM, Qwen3Config
from transformers import Qwen3ForCausalLM as TorchQwen3

from porch_jax.models import (
    CheckpointError,
    ConfigError,
    ModelConfig,
    check_pretrained,
    from_pretrained,
    init_model,
    save_pretrained,
)

CONFIG = ModelConfig(
    model_type="qwen3",
    vocab_size=67,
    hidden_size=32,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=12,
    rope_theta=10_000.0,
    bos_token_id=1,
    eos_token_id=2,
)
IDS = np.random.RandomState(0).randint(0, 67, (2, 11))
_forward = jax.jit(lambda model, ids: model(ids))


def ours(model) -> np.ndarray:
    return np.asarray(_forward(model, jnp.asarray(IDS, jnp.int32)))


def theirs(folder) -> np.ndarray:
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor(IDS)).logits.numpy()


@pytest.mark.parametrize("tied", [False, True])
def test_saved_folder_loads_in_transformers_with_equal_logits(tmp_path, tied):
    import dataclasses

    model = init_model(dataclasses.replace(CONFIG, tie_word_embeddings=tied), seed=1)
    save_pretrained(model, tmp_path)
    np.testing.assert_allclose(theirs(tmp_path), ours(model), atol=1e-4, rtol=0)
    assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == 2


def test_bf16_save_round_trips(tmp_path):
    model = init_model(CONFIG, seed=2, param_dtype=jnp.bfloat16)
    save_pretrained(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    assert str(load_file(tmp_path / "model.safetensors")["model.norm.weight"].dtype) == "bfloat16"
    reloaded = from_pretrained(tmp_path, param_dtype=jnp.bfloat16)
    for got, want in zip(jax.tree.leaves(nnx.state(reloaded)), jax.tree.leaves(nnx.state(model)), strict=True):
        assert got.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_allclose(theirs(tmp_path), ours(from_pretrained(tmp_path)), atol=1e-4, rtol=0)


def test_sharded_transformers_folder_loads_with_equal_logits(tmp_path):
    torch.manual_seed(0)
    hf = TorchQwen3(Qwen3Config(**{k: v for k, v in CONFIG.to_hf().items() if k != "architectures"})).eval()
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    np.testing.assert_allclose(ours(from_pretrained(tmp_path)), theirs(tmp_path), atol=1e-4, rtol=0)


@pytest.fixture
def folder(tmp_path):
    save_pretrained(init_model(CONFIG), tmp_path)
    return tmp_path


def edit_tensors(folder, edit):
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def edit_config(folder, edit):
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "breaks,message",
    [
        (
            lambda f: edit_tensors(f, lambda t: t.pop("model.layers.1.mlp.up_proj.weight")),
            "model.layers.1.mlp.up_proj.weight",
        ),
        (
            lambda f: edit_tensors(
                f, lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": np.zeros((12, 32), np.float32)})
            ),
            "model.layers.0.self_attn.k_proj.weight",
        ),
        (
            lambda f: edit_tensors(
                f, lambda t: t.update({"model.layers.0.self_attn.bogus.weight": np.zeros(3, np.float32)})
            ),
            "model.layers.0.self_attn.bogus.weight",
        ),
        (
            lambda f: edit_tensors(
                f, lambda t: t.update({"model.layers.5.mlp.up_proj.weight": np.zeros((40, 32), np.float32)})
            ),
            "model.layers.5.mlp.up_proj.weight",
        ),
        (lambda f: edit_config(f, lambda c: c.update(model_type="llama_next")), "llama_next"),
        (lambda f: edit_config(f, lambda c: c.pop("intermediate_size")), "intermediate_size"),
        (lambda f: edit_config(f, lambda c: c.update(num_key_value_heads=3)), "num_key_value_heads"),
        (
            lambda f: edit_config(f, lambda c: c.update(rope_parameters={"rope_type": "yarn", "factor": 4.0})),
            "rope_parameters",
        ),
    ],
    ids=[
        "missing_tensor",
        "wrong_shape",
        "unknown_tensor",
        "extra_layer",
        "model_type",
        "missing_field",
        "bad_heads",
        "rope_type",
    ],
)
@pytest.mark.parametrize("load", [from_pretrained, check_pretrained], ids=["from_pretrained", "check_pretrained"])
def test_bad_folder_error_names_the_culprit(folder, breaks, message, load):
    breaks(folder)
    with pytest.raises((CheckpointError, ConfigError), match=message.replace(".", r"\.")):
        load(folder)


def test_config_round_trips_through_hf_dict():
    assert ModelConfig.from_hf(CONFIG.to_hf()) == CONFIG
    legacy = CONFIG.to_hf() | {"rope_theta": 5.0}
    del legacy["rope_parameters"]
    assert ModelConfig.from_hf(legacy).rope_theta == 5.0
