"""Qwen3.5 (hybrid Gated DeltaNet + gated attention) against transformers' PyTorch model."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

torch = pytest.importorskip("torch", reason="torch is in the test extra (torch==2.13.0); scripts/test.sh installs it")
from transformers import AutoConfig, AutoModelForCausalLM, Qwen3_5TextConfig  # noqa: E402
from transformers import Qwen3_5ForCausalLM as TorchQwen3_5  # noqa: E402

from porch_jax.models import (  # noqa: E402
    ConfigError,
    ModelConfig,
    export_config,
    export_tensor_shapes,
    from_pretrained,
)
from porch_jax.models.presets import preset  # noqa: E402
from porch_jax.models.qwen3_5 import Qwen3_5ForCausalLM  # noqa: E402
from porch_jax.models.sampler import Sampler, SamplingParams  # noqa: E402
from porch_jax.models.tiny import make_tiny_model  # noqa: E402
from porch_jax.serving import check_vllm_architecture  # noqa: E402
from porch_jax.serving.weights import export_for_serving  # noqa: E402

VOCAB = 97
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=48,
    intermediate_size=80,
    rms_norm_eps=1e-6,
    max_position_embeddings=512,
    initializer_range=0.05,
)  # above HF's 0.02 so logits are not tiny; 0.1 makes 8 layers chaotic in fp32
CONFIGS = {
    # Both layer kinds repeat; GQA in both (2 value heads per key head); tied embeddings.
    "8layers_tied": dict(
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=12,
        linear_conv_kernel_dim=4,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.25},
    ),
    # One kv head, 3 value heads per key head, conv kernel 3, Qwen3.5's theta; untied.
    "4layers_mqa_untied": dict(
        num_hidden_layers=4,
        num_attention_heads=6,
        num_key_value_heads=1,
        head_dim=24,
        linear_num_key_heads=1,
        linear_num_value_heads=3,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=3,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
    ),
    # Explicit layer_types starting with attention; half-rotary heads; as many key as value heads.
    "custom_layer_types": dict(
        num_hidden_layers=3,
        layer_types=["full_attention", "linear_attention", "full_attention"],
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=3,
        linear_num_value_heads=3,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.5},
    ),
}


def torch_model(name: str, seed: int = 0, layer_types: list[str] | None = None) -> TorchQwen3_5:
    """A random transformers Qwen3.5 with non-trivial norms, decays and biases."""
    torch.manual_seed(seed)
    config = BASE | CONFIGS[name]
    if layer_types:
        config |= dict(num_hidden_layers=len(layer_types), layer_types=layer_types)
    hf = TorchQwen3_5(Qwen3_5TextConfig(**config)).eval()
    with torch.no_grad():
        for key, p in hf.named_parameters():
            if key.endswith("linear_attn.norm.weight"):  # the gated norm scales by w, the others by 1 + w
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif "norm" in key or key.endswith("dt_bias"):
                p.copy_(0.2 * torch.randn_like(p))
    return hf


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request, tmp_path_factory):
    hf = torch_model(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    return from_pretrained(folder), hf


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """Ours and theirs for the cache, sampler, packing and gradient tests: 4 layers, each kind twice
    (so each kind has cache slots 0 and 1), half the compile time of 8."""
    hf = torch_model("8layers_tied", seed=1, layer_types=["linear_attention", "full_attention"] * 2)
    folder = tmp_path_factory.mktemp("hybrid")
    hf.save_pretrained(folder)
    return from_pretrained(folder), hf


_forward = jax.jit(lambda model, ids, kwargs: model(ids, **kwargs))


@pytest.fixture(params=["auto", "off"])
def cpu_kernels(request, monkeypatch):
    """Runs a test with the native CPU kernels of DeltaNet's rule and conv (auto: what runs here by
    default, where the shapes allow) and without them (the chunked rule and XLA conv that GPUs and
    TPUs run). Traces are per setting."""
    from porch_jax.kernels import gated_delta

    if request.param == "auto" and not gated_delta.available():
        pytest.skip("the native kernels need a C++ compiler (g++); see the warning in the log")
    monkeypatch.setenv("PORCH_JAX_CPU_KERNELS", request.param)
    _forward.clear_cache()
    yield request.param
    _forward.clear_cache()


def forward(model, ids, **kwargs) -> np.ndarray:
    return np.asarray(_forward(model, jnp.asarray(ids, jnp.int32), {k: jnp.asarray(v) for k, v in kwargs.items()}))


def torch_logits(hf, ids) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor(np.asarray(ids), dtype=torch.long)).logits.numpy()


def test_logits_match_transformers(pair):
    model, hf = pair
    ids = np.random.RandomState(1).randint(0, VOCAB, (2, 150))  # 3 DeltaNet chunks, the last partial
    want = torch_logits(hf, ids)
    assert want.std() > 0.25  # logits large enough for 1e-4 to be a real bound
    np.testing.assert_allclose(forward(model, ids), want, atol=1e-4, rtol=0)


def test_left_padding_matches_unpadded_rows(hybrid):
    model, hf = hybrid
    rng = np.random.RandomState(2)
    lengths, t = [80, 13], 80  # the shape of the full forward in the next test: one compile
    ids, mask = np.zeros((2, t), int), np.zeros((2, t), bool)
    rows = [rng.randint(0, VOCAB, n) for n in lengths]
    for i, (row, n) in enumerate(zip(rows, lengths, strict=False)):
        ids[i, t - n :], mask[i, t - n :] = row, True
    logits = forward(model, ids, attention_mask=mask)
    for i, (row, n) in enumerate(zip(rows, lengths, strict=False)):
        np.testing.assert_allclose(logits[i, t - n :], torch_logits(hf, row[None])[0], atol=1e-4, rtol=0)


def test_packed_segments_match_separate_sequences(hybrid, cpu_kernels):
    model, hf = hybrid
    rng = np.random.RandomState(3)
    lengths = [50, 70, 30]  # the second crosses a chunk boundary; a new segment starts mid-chunk
    seqs = [rng.randint(0, VOCAB, n) for n in lengths]
    ids = np.concatenate(seqs + [np.zeros(4, int)])[None]  # 4 pad tokens (segment 0) at the end
    segments = np.concatenate([np.full(n, i + 1) for i, n in enumerate(lengths)] + [np.zeros(4, int)])[None]
    logits = forward(model, ids, segment_ids=segments)
    start = 0
    for seq in seqs:
        np.testing.assert_allclose(
            logits[0, start : start + len(seq)], torch_logits(hf, seq[None])[0], atol=1e-4, rtol=0
        )
        start += len(seq)


def test_prefill_then_decode_matches_full_forward(hybrid):
    model, _ = hybrid
    rng = np.random.RandomState(4)
    prompt_lens, prompt_t, extend, steps = [70, 45], 70, 3, 7
    total = prompt_t + extend + steps
    ids, mask = np.zeros((2, total), int), np.zeros((2, total), bool)
    for i, n in enumerate(prompt_lens):  # left-padded prompts, then shared continuation slots
        ids[i, prompt_t - n :] = rng.randint(0, VOCAB, n + extend + steps)
        mask[i, prompt_t - n :] = True
    full = forward(model, ids, attention_mask=mask)

    step = jax.jit(lambda m, ids, c, i, am: m(ids, attention_mask=am, cache=c, cache_index=i))
    cache = model.init_cache(2, 96)
    logits, cache = step(model, jnp.asarray(ids[:, :prompt_t]), cache, 0, jnp.asarray(mask[:, :prompt_t]))
    got = [np.asarray(logits)]
    # A multi-token continuation (chunked form from the cached state), then single-token steps.
    for start, end in [(prompt_t, prompt_t + extend)] + [(s, s + 1) for s in range(prompt_t + extend, total)]:
        logits, cache = step(model, jnp.asarray(ids[:, start:end]), cache, start, jnp.ones((2, end - start), bool))
        got.append(np.asarray(logits))
    got = np.concatenate(got, axis=1)
    np.testing.assert_allclose(got[mask], full[mask], atol=1e-4, rtol=0)
    assert int(cache.mask.sum()) == int(mask.sum())


def test_greedy_sampler_matches_transformers_generate(hybrid):
    model, hf = hybrid
    rng = np.random.RandomState(5)
    prompts = [rng.randint(0, VOCAB, n).tolist() for n in (37, 20)]  # the shorter one is left-padded
    sampler = Sampler(model, None, max_len=128, prompt_buckets=(64,), batch_buckets=(2,))
    completions = sampler.generate(prompts, SamplingParams(max_new_tokens=32, ignore_eos=True))
    for prompt, completion in zip(prompts, completions, strict=False):
        with torch.inference_mode():
            out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=32, min_new_tokens=32)
        assert completion.token_ids == out[0, len(prompt) :].tolist()


def test_gradients_match_transformers(hybrid, cpu_kernels):
    """The fused-loss path (hidden_states + lm_head_kernel) under jax.grad, against torch autograd."""
    model, hf = hybrid
    ids = np.random.RandomState(6).randint(0, VOCAB, (2, 70))

    def loss(m):
        logits = m.hidden_states(jnp.asarray(ids[:, :-1])) @ m.lm_head_kernel()
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, jnp.asarray(ids[:, 1:, None]), axis=-1))

    value, grads = jax.jit(nnx.value_and_grad(loss))(model)
    hf.zero_grad()
    logits = hf(torch.tensor(ids[:, :-1])).logits
    t_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), torch.tensor(ids[:, 1:]).reshape(-1))
    t_loss.backward()
    np.testing.assert_allclose(float(value), t_loss.item(), atol=1e-5, rtol=0)
    ours = {".".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(grads)}
    theirs = dict(hf.named_parameters())
    pairs = {  # one of each kind of parameter, in both layer kinds
        "layers.0.linear_attn.A_log": ("model.layers.0.linear_attn.A_log", lambda g: g),
        "layers.0.linear_attn.dt_bias": ("model.layers.0.linear_attn.dt_bias", lambda g: g),
        "layers.0.linear_attn.conv1d": ("model.layers.0.linear_attn.conv1d.weight", lambda g: g),
        "layers.2.linear_attn.in_proj_qkv": ("model.layers.2.linear_attn.in_proj_qkv.weight", lambda g: g.T),
        "layers.2.linear_attn.norm.weight": ("model.layers.2.linear_attn.norm.weight", lambda g: g),
        "layers.1.self_attn.q_proj": ("model.layers.1.self_attn.q_proj.weight", lambda g: g.reshape(48, -1).T),
        "layers.3.self_attn.k_norm.weight": ("model.layers.3.self_attn.k_norm.weight", lambda g: g),
        "embed_tokens": ("model.embed_tokens.weight", lambda g: g),
    }
    for name, (hf_name, to_hf) in pairs.items():
        want = theirs[hf_name].grad.numpy()
        assert np.abs(want).max() > 0
        np.testing.assert_allclose(to_hf(ours[name]), want, atol=1e-5 + 1e-3 * np.abs(want).max(), rtol=0)
    assert all(np.isfinite(g).all() and np.abs(g).max() > 0 for g in ours.values())


def multimodal_folder(hf: TorchQwen3_5, path) -> tuple[dict[str, np.ndarray], dict]:
    """Writes `hf` as the text half of a multimodal Qwen3.5 checkpoint (text weights under
    model.language_model., a vision tower and an MTP head our loader must drop, text_config keys we do not
    model); returns its tensors and config.json."""
    text = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    tensors = {k.replace("model.", "model.language_model.", 1): v for k, v in text.items()}
    tensors |= {
        "model.visual.patch_embed.proj.weight": np.ones((8, 3, 2, 2, 2), np.float32),
        "model.visual.merger.linear_fc1.weight": np.ones((8, 8), np.float32),
        "mtp.fc.weight": np.ones((48, 96), np.float32),
        "mtp.layers.0.mlp.up_proj.weight": np.ones((80, 48), np.float32),
    }
    path.mkdir()
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    text_config = hf.config.to_dict() | {"mtp_num_hidden_layers": 1, "mamba_ssm_dtype": "float32"}
    rotary_half = int(hf.config.head_dim * hf.config.rope_parameters["partial_rotary_factor"]) // 2
    text_config["rope_parameters"] = text_config["rope_parameters"] | {
        "mrope_section": [rotary_half - 2, 1, 1],
        "mrope_interleaved": True,
    }
    multimodal = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text_config,
        "vision_config": {"model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 8, "out_hidden_size": 48},
        "image_token_id": 90,
        "video_token_id": 91,
        "tie_word_embeddings": False,
    }
    (path / "config.json").write_text(json.dumps(multimodal))
    return tensors, multimodal


def test_multimodal_folder_loads_text_and_exports_a_text_only_folder(tmp_path):
    """Loads the text model of a multimodal folder; the export is a Qwen3_5ForCausalLM folder that vLLM
    registers, transformers loads with the same logits, and our loader reads back as the same model."""
    hf = torch_model("4layers_mqa_untied", seed=2)
    tensors, multimodal = multimodal_folder(hf, tmp_path / "multimodal")
    model = from_pretrained(tmp_path / "multimodal")
    assert model.config.model_type == "qwen3_5"
    ids = np.random.RandomState(7).randint(0, VOCAB, (2, 40))
    ours = forward(model, ids)
    np.testing.assert_allclose(ours, torch_logits(hf, ids), atol=1e-4, rtol=0)

    saved = export_for_serving(model, tmp_path / "saved")
    config = json.loads((saved / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_text" and config["architectures"] == ["Qwen3_5ForCausalLM"]
    assert not {"text_config", "vision_config", "image_token_id", "video_token_id"} & set(config)
    text_config = multimodal["text_config"]
    for key in ("hidden_size", "num_hidden_layers", "layer_types", "linear_num_value_heads", "head_dim"):
        assert config[key] == text_config[key], key
    assert config["rope_parameters"] == text_config["rope_parameters"]  # mRoPE sections kept
    assert config["mamba_ssm_dtype"] == "float32" and "mtp_num_hidden_layers" not in config  # no MTP weights
    assert check_vllm_architecture(saved) == "Qwen3_5ForCausalLM"

    written = load_file(saved / "model.safetensors")
    assert set(written) == set(hf.state_dict())  # transformers' Qwen3_5ForCausalLM names
    for key, value in written.items():
        source = "lm_head.weight" if key == "lm_head.weight" else key.replace("model.", "model.language_model.", 1)
        np.testing.assert_array_equal(value, tensors[source])

    reloaded = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32).eval()
    assert type(reloaded) is TorchQwen3_5
    gap = np.abs(torch_logits(reloaded, ids) - ours).max()
    print(f"\nexported folder in transformers' Qwen3_5ForCausalLM vs our model: max |logit gap| {gap:.3g}")
    assert gap <= 1e-4

    ours_again = from_pretrained(saved)
    assert ours_again.config == dataclasses.replace(model.config, model_type="qwen3_5_text", multimodal_config=None)
    np.testing.assert_array_equal(forward(ours_again, ids), ours)


def test_tiny_qwen3_5_folder_loads_in_transformers(tmp_path):
    folder = make_tiny_model(tmp_path, model_type="qwen3_5", seed=3, initializer_range=0.1)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_text" and config["architectures"] == ["Qwen3_5ForCausalLM"]
    assert "full_attention" in config["layer_types"] and "linear_attention" in config["layer_types"]
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen3_5ForCausalLM"
    ids = np.random.RandomState(8).randint(0, config["vocab_size"], (1, 70))
    np.testing.assert_allclose(forward(from_pretrained(folder), ids), torch_logits(hf, ids), atol=1e-4, rtol=0)


def count_9b_text_parameters(c: dict) -> int:
    """Qwen3.5 text parameters from the published dims, independently of our model code."""
    h, v, i = c["hidden_size"], c["vocab_size"], c["intermediate_size"]
    heads, kv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    nk, nv, dk, dv = (c[f"linear_{k}"] for k in ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim"))
    attention = h * heads * d * 2 + 2 * h * kv * d + heads * d * h + 2 * d  # q (+gate), k, v, o, q/k norms
    conv_channels = 2 * nk * dk + nv * dv
    deltanet = (
        h * conv_channels
        + h * nv * dv
        + 2 * h * nv  # in_proj_qkv, z, b, a
        + conv_channels * c["linear_conv_kernel_dim"]
        + 2 * nv
        + dv
        + nv * dv * h
    )  # conv, A/dt, norm, out
    per_layer = 3 * h * i + 2 * h  # MLP, two norms
    layers = sum(per_layer + (attention if kind == "full_attention" else deltanet) for kind in c["layer_types"])
    return v * h * (1 if c["tie_word_embeddings"] else 2) + layers + h  # embeddings (+ head), final norm


def test_9b_preset_parameter_count_without_allocating():
    hf = preset("qwen3.5-9b")
    assert hf["layer_types"].count("full_attention") == 8 and hf["layer_types"][3] == "full_attention"
    config = ModelConfig.from_hf(hf)
    abstract = nnx.eval_shape(lambda: Qwen3_5ForCausalLM(config, rngs=nnx.Rngs(0)))
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    assert count == count_9b_text_parameters(hf)
    assert 8.5e9 < count < 9.5e9


def multimodal_9b() -> dict:
    """The 9B's checkpoint layout: its text model nested under text_config, beside a vision tower and MTP."""
    text = preset("qwen3.5-9b") | {"mtp_num_hidden_layers": 1, "eos_token_id": 248044}
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": {"model_type": "qwen3_5_vision", "depth": 27, "hidden_size": 1152, "out_hidden_size": 4096},
        "image_token_id": 248056,
        "tie_word_embeddings": False,
    }


@pytest.mark.parametrize("layout", ["text", "multimodal"])
def test_9b_export_is_a_text_only_folder_transformers_builds_without_allocating(layout, tmp_path):
    """The config.json a 9B export writes (the export code path, no parameters): Qwen3_5ForCausalLM,
    registered by vLLM, and transformers builds from it (on the meta device) exactly the tensors we write."""
    config = ModelConfig.from_hf(preset("qwen3.5-9b") if layout == "text" else multimodal_9b())
    exported = export_config(config, jnp.bfloat16)
    assert exported["model_type"] == "qwen3_5_text" and exported["architectures"] == ["Qwen3_5ForCausalLM"]
    assert not {"text_config", "vision_config", "image_token_id"} & set(exported)
    assert "mtp_num_hidden_layers" not in exported and exported["dtype"] == "bfloat16"
    fields = dict(vocab_size=248320, hidden_size=4096, num_hidden_layers=32, head_dim=256, tie_word_embeddings=False)
    assert {k: exported[k] for k in fields} == fields
    assert exported["layer_types"] == preset("qwen3.5-9b")["layer_types"]
    rope = exported["rope_parameters"]
    assert rope["rope_theta"] == 10_000_000.0 and rope["partial_rotary_factor"] == 0.25
    if layout == "multimodal":
        assert rope["mrope_section"] == [11, 11, 10] and exported["eos_token_id"] == 248044
    assert check_vllm_architecture(exported) == "Qwen3_5ForCausalLM"

    (tmp_path / "config.json").write_text(json.dumps(exported))
    with torch.device("meta"):
        theirs = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path))
    assert type(theirs) is TorchQwen3_5
    abstract = nnx.eval_shape(lambda: Qwen3_5ForCausalLM(config, rngs=nnx.Rngs(0)))
    assert export_tensor_shapes(abstract) == {k: tuple(v.shape) for k, v in theirs.state_dict().items()}


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(layer_types=["linear_attention"] * 3), "layer_types"),
        (dict(layer_types=["linear_attention"] * 3 + ["sliding_attention"]), "layer_types"),
        (dict(linear_num_key_heads=3), "linear_num_value_heads"),
        (dict(attn_output_gate=False), "attn_output_gate"),
    ],
)
def test_config_rejects_what_the_model_cannot_run(change, field):
    with pytest.raises(ConfigError, match=field):
        ModelConfig.from_hf(preset("qwen3.5-tiny") | change)


def test_config_round_trips_through_hf_dict():
    config = ModelConfig.from_hf(preset("qwen3.5-tiny"))
    assert ModelConfig.from_hf(config.to_hf()) == config
    assert config.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    assert config.partial_rotary_factor == 0.25 and config.rope_theta == 10_000_000.0
