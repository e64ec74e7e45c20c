"""Llama (plain and Llama 3 scaled RoPE) and Qwen2 against transformers' PyTorch models: logits, every
gradient, cached decoding, export into a folder transformers loads, sliced (sharded) loading."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch", reason="torch is in the test extra (torch==2.13.0); scripts/test.sh installs it")
import transformers  # noqa: E402

from porch_jax.models import (  # noqa: E402
    MODEL_SPECS,
    ConfigError,
    KVCache,
    LlamaForCausalLM,
    ModelConfig,
    Qwen2ForCausalLM,
    from_pretrained,
    init_model,
    make_mesh,
    save_pretrained,
)
from porch_jax.models.layers import rope_inv_freq  # noqa: E402

VOCAB = 89
BASE = {
    "vocab_size": VOCAB,
    "hidden_size": 48,
    "intermediate_size": 80,
    "num_hidden_layers": 2,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 512,
}
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500_000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,  # small, so positions < 200 fall in every frequency band
}
# name -> (transformers classes, config overrides, our class)
CASES = {
    "llama_tied": ("Llama", {"tie_word_embeddings": True, "rope_theta": 100_000.0}, LlamaForCausalLM),
    "llama3_rope_untied": ("Llama", {"head_dim": 16, "rope_parameters": LLAMA3_ROPE}, LlamaForCausalLM),
    "qwen2_untied": ("Qwen2", {"rope_theta": 1_000_000.0, "tie_word_embeddings": False}, Qwen2ForCausalLM),
}


def torch_model(family: str, overrides: dict):
    torch.manual_seed(0)
    config = getattr(transformers, f"{family}Config")(**(BASE | overrides))
    hf = getattr(transformers, f"{family}ForCausalLM")(config).eval()
    with torch.no_grad():  # non-trivial norms and biases (HF starts them at 1 and 0), so a mis-mapped one shows
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return hf


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    family, overrides, cls = CASES[request.param]
    hf = torch_model(family, overrides)
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    model = from_pretrained(folder)
    assert type(model) is cls
    return folder, model, hf


_forward = jax.jit(lambda model, ids: model(ids))


def torch_logits(hf, ids) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor(np.asarray(ids), dtype=torch.long)).logits.numpy()


def test_logits_match_transformers(case):
    _, model, hf = case
    ids = np.random.RandomState(1).randint(0, VOCAB, (2, 150))  # > one attention block; every RoPE band
    np.testing.assert_allclose(np.asarray(_forward(model, jnp.asarray(ids))), torch_logits(hf, ids), atol=1e-4)


def test_gradients_match_transformers(case):
    _, model, hf = case
    rng = np.random.RandomState(7)
    ids = rng.randint(0, VOCAB, (2, 70))
    weights = rng.randn(2, 70, VOCAB).astype(np.float32)
    grads = jax.jit(nnx.grad(lambda m: jnp.sum(m(jnp.asarray(ids)) * weights)))(model)
    hf.zero_grad()
    (hf(torch.tensor(ids)).logits * torch.tensor(weights)).sum().backward()
    expected = {name: p.grad.numpy() for name, p in hf.named_parameters()}
    spec = MODEL_SPECS[model.config.model_type]
    seen = set()
    for path, grad in nnx.to_flat_state(grads):
        name = ".".join(map(str, path))
        hf_name, rule = next((r.match(name, hf=False), r) for r in spec.weights if r.match(name, hf=False))
        want = expected[hf_name]
        np.testing.assert_allclose(
            rule.to_hf(np.asarray(grad[...])), want, atol=1e-4 * np.abs(want).max(), err_msg=name
        )
        seen.add(hf_name)
    assert seen == set(expected)  # every parameter of theirs has a gradient of ours


def test_cached_greedy_decode_matches_transformers_generate(case):
    _, model, hf = case
    prompt = np.random.RandomState(4).randint(0, VOCAB, (1, 9))
    with torch.no_grad():
        want = hf.generate(torch.tensor(prompt), max_new_tokens=12, do_sample=False, eos_token_id=None)[0, 9:].numpy()
    step = jax.jit(lambda m, ids, c, i: m(ids, cache=c, cache_index=i))
    logits, cache = step(model, jnp.asarray(prompt), KVCache.init(model.config, 1, 32), 0)
    got = []
    for s in range(12):
        got.append(int(jnp.argmax(logits[0, -1])))
        logits, cache = step(model, jnp.asarray([[got[-1]]]), cache, 9 + s)
    assert got == want.tolist()


def test_saved_folder_loads_in_transformers_with_equal_logits(case, tmp_path):
    folder, model, hf = case
    save_pretrained(model, tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert type(reloaded) is type(hf)
    assert reloaded.config.tie_word_embeddings == hf.config.tie_word_embeddings
    ids = np.random.RandomState(2).randint(0, VOCAB, (1, 40))
    np.testing.assert_allclose(torch_logits(reloaded, ids), torch_logits(hf, ids), atol=1e-5)
    assert ModelConfig.from_pretrained(tmp_path) == model.config


@pytest.mark.parametrize("shape", [(1, 2, 4), (1, 4, 2), (2, 2, 2)])
def test_sharded_load_equals_plain_load(case, shape):
    """Every device's block read on its own (including q/k/v biases and embeddings split over 'tensor')."""
    folder, model, _ = case
    mesh = make_mesh(shape)
    sharded = from_pretrained(folder, mesh=mesh)
    for (path, want), (_, got) in zip(
        nnx.to_flat_state(nnx.state(model)), nnx.to_flat_state(nnx.state(sharded)), strict=True
    ):
        assert got[...].sharding.mesh == mesh, path
        np.testing.assert_array_equal(np.asarray(got[...]), np.asarray(want[...]), err_msg=str(path))


def test_llama3_inverse_frequencies_equal_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(
        **(BASE | {"head_dim": 64, "rope_parameters": LLAMA3_ROPE | {"original_max_position_embeddings": 8192}})
    )
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    ours = ModelConfig.from_hf(config.to_dict())
    np.testing.assert_allclose(rope_inv_freq(64, ours.rope_theta, ours.rope_scaling), want.numpy(), rtol=1e-6)


def test_random_llama_and_qwen2_init_and_unsupported_fields_are_named():
    for model_type, cls in (("llama", LlamaForCausalLM), ("qwen2", Qwen2ForCausalLM)):
        config = ModelConfig.from_hf(BASE | {"model_type": model_type})
        model = init_model(config)
        assert type(model) is cls
        assert hasattr(model.layers[0].self_attn, "q_bias") == (model_type == "qwen2")
        assert not hasattr(model.layers[0].self_attn, "q_norm")
    for field, value in (("mlp_bias", True), ("attention_bias", True), ("pretraining_tp", 2)):
        with pytest.raises(ConfigError, match=field):
            ModelConfig.from_hf(BASE | {"model_type": "llama", field: value})
    with pytest.raises(ConfigError, match="rope_type 'llama3'.*'qwen2'"):
        ModelConfig.from_hf(BASE | {"model_type": "qwen2", "rope_parameters": LLAMA3_ROPE})
    with pytest.raises(ConfigError, match="missing 'factor'"):
        ModelConfig.from_hf(BASE | {"model_type": "llama", "rope_scaling": {"rope_type": "llama3"}})
