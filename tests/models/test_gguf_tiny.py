"""Tiny qwen2 and qwen3 GGUF files written here with gguf.GGUFWriter (from random transformers models and
the tiny BPE tokenizer) convert into folders whose logits, in our loader, equal the source model's."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the `gguf` package is in the test extra")
torch = pytest.importorskip("torch", reason="torch is in the test extra (torch==2.13.0); scripts/test.sh installs it")
import transformers  # noqa: E402

from porch_jax.models import from_pretrained  # noqa: E402
from porch_jax.models.gguf_convert import check_gguf, convert  # noqa: E402
from porch_jax.models.tiny import IM_END, build_tokenizer  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, i, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{i}.{LAYER[module]}.{kind}"


def write_gguf(path, arch: str, hf, tok) -> None:
    c = hf.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    spec = json.loads(tok.backend_tokenizer.to_str())
    vocab = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    added = {t["id"]: t["content"] for t in spec["added_tokens"]}
    tokens = [added.get(i, t) for t, i in vocab] + [added[i] for i in sorted(added) if i >= len(vocab)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([3 if i in added else 1 for i in range(len(tokens))])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]])
    w.add_eos_token_id(tok.convert_tokens_to_ids(IM_END))
    w.add_pad_token_id(tok.pad_token_id)
    w.add_chat_template(tok.chat_template)
    for name, p in hf.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        w.add_tensor(gguf_name(name), p.detach().numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# transformers 5.24 reads no head_dim from a qwen3 GGUF file and takes Qwen3Config's default (128), as
# every real Qwen3 has: the tiny qwen3 keeps it.
SHAPES = {
    "qwen2": {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16},
    "qwen3": {"hidden_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128},
}


@pytest.mark.parametrize("arch", list(SHAPES))
def test_tiny_gguf_converts_to_a_folder_with_the_same_logits(tmp_path, arch):
    tok = build_tokenizer(512)
    torch.manual_seed(0)
    family = {"qwen2": "Qwen2", "qwen3": "Qwen3"}[arch]
    config = getattr(transformers, f"{family}Config")(
        vocab_size=len(tok),
        intermediate_size=96,
        num_hidden_layers=2,
        **SHAPES[arch],
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_theta=10_000.0,
        tie_word_embeddings=False,
    )
    hf = getattr(transformers, f"{family}ForCausalLM")(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(".bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    gguf_file = tmp_path / f"tiny-{arch}.gguf"
    write_gguf(gguf_file, arch, hf, tok)
    assert check_gguf(gguf_file) == arch
    folder = convert(gguf_file, tmp_path / "out")
    assert json.loads((folder / "config.json").read_text())["model_type"] == arch
    assert (folder / "tokenizer.json").is_file()
    reloaded = transformers.AutoTokenizer.from_pretrained(folder)
    text = "Task 3: read the file."
    assert reloaded.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    ids = np.random.RandomState(0).randint(0, len(tok), (1, 30))
    with torch.no_grad():
        want = hf(torch.tensor(ids)).logits.numpy()
    model = from_pretrained(folder)
    np.testing.assert_allclose(np.asarray(jax.jit(lambda m, x: m(x))(model, jnp.asarray(ids))), want, atol=1e-4)
