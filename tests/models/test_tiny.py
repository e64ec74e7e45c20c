"""make_tiny_model: an offline Hugging Face folder that transformers (and vLLM) load."""

from __future__ import annotations

import json
import re
import time

import pytest

from porch_jax.models.tiny import MARKUP_TOKENS, make_tiny_model

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_emails",
            "description": "Search the mailbox.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    }
]
CONVERSATION = [
    {"role": "system", "content": "You plan before acting."},
    {"role": "user", "content": "Find the invoice from Northwind."},
    {
        "role": "assistant",
        "content": "Searching.",
        "tool_calls": [
            {"type": "function", "function": {"name": "search_emails", "arguments": {"query": "invoice Northwind"}}},
            {"type": "function", "function": {"name": "search_emails", "arguments": '{"query": "INV-2031"}'}},
        ],
    },
    {"role": "tool", "content": '{"count": 1}'},
    {"role": "tool", "content": '{"count": 0}'},
    {"role": "assistant", "content": "Found it."},
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def tokenizer(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def test_reloads_in_transformers(folder, tokenizer):
    torch = pytest.importorskip(
        "torch", reason="torch is in the test extra (torch==2.13.0); scripts/test.sh installs it"
    )
    from transformers import AutoModelForCausalLM

    config = json.loads((folder / "config.json").read_text())
    assert config["vocab_size"] == len(tokenizer) == 1024
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert config["eos_token_id"] == tokenizer.eos_token_id
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.model_type == "qwen3" and model.config.hidden_size == 64
    with torch.inference_mode():
        logits = model(torch.tensor([tokenizer("Hello there")["input_ids"]])).logits
    assert logits.shape[-1] == len(tokenizer) and torch.isfinite(logits).all()


def test_chat_template_renders_hermes_tool_calls(tokenizer):
    text = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou plan before acting.\n\n# Tools")
    tools_block = re.search(r"<tools>\n(.*)\n</tools>", text, re.DOTALL).group(1)
    assert [json.loads(line) for line in tools_block.splitlines()] == TOOLS
    # What vLLM's hermes parser extracts from an assistant turn.
    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    assert turn.startswith("Searching.\n<tool_call>\n")
    calls = [json.loads(c) for c in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", turn, re.DOTALL)]
    assert calls == [
        {"name": "search_emails", "arguments": {"query": "invoice Northwind"}},
        {"name": "search_emails", "arguments": {"query": "INV-2031"}},
    ]
    assert (
        '<|im_start|>user\n<tool_response>\n{"count": 1}\n</tool_response>\n'
        '<tool_response>\n{"count": 0}\n</tool_response><|im_end|>\n'
    ) in text
    assert text.endswith("<|im_start|>assistant\nFound it.<|im_end|>\n<|im_start|>assistant\n")
    plain = tokenizer.apply_chat_template(CONVERSATION[1:2], tokenize=False)
    assert plain == "<|im_start|>user\nFind the invoice from Northwind.<|im_end|>\n"


def test_markup_tokens_are_single_tokens_kept_in_decoded_text(tokenizer):
    for token in (*MARKUP_TOKENS, "<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert len(tokenizer(token)["input_ids"]) == 1, token
    ids = tokenizer("<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>")["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "assistant\n<tool_call>\n{}\n</tool_call>"


def test_tokenizes_orchestration_text_compactly(tokenizer):
    text = 'Delegate the search to a worker: {"name": "search_emails", "arguments": {"query": "invoice"}}'
    assert len(text) / len(tokenizer(text)["input_ids"]) > 2.5


def test_deterministic_per_seed_and_fast(folder, tmp_path):
    start = time.perf_counter()
    same = make_tiny_model(tmp_path / "same", seed=0)
    assert time.perf_counter() - start < 10
    other = make_tiny_model(tmp_path / "other", seed=1)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (same / name).read_bytes() == (folder / name).read_bytes(), name
    assert (other / "model.safetensors").read_bytes() != (folder / "model.safetensors").read_bytes()


def test_overrides_and_unknown_model_types(tmp_path):
    folder = make_tiny_model(tmp_path / "m", vocab_size=2048, hidden_size=32, num_hidden_layers=1)
    config = json.loads((folder / "config.json").read_text())
    assert (config["vocab_size"], config["hidden_size"], config["num_hidden_layers"]) == (2048, 32, 1)
    with pytest.raises(NotImplementedError, match="'llama' is not implemented"):
        make_tiny_model(tmp_path / "x", model_type="llama")
