"""A tiny local model folder (tokenizer + config + random weights), built offline in seconds.

Tests, the quickstart and benchmarks need a real Hugging Face folder (one that transformers and
vLLM load) but no hub is reachable: we train a byte-level BPE on a small corpus that ships with
the package, give it Qwen's special tokens and a Qwen-style chat template with Hermes tool calls
(what vLLM's `hermes` parser reads), and save random weights from our own model code.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from porch_jax.models.config import ModelConfig
from porch_jax.models.io import init_model, save_pretrained
from porch_jax.models.presets import preset

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
# Control tokens never appear in decoded text; markup tokens (tool calls, thinking) must, because
# tool-call parsers read them from the text (as in Qwen's tokenizer, where they are not "special").
CONTROL_TOKENS = (END_OF_TEXT, IM_START, IM_END)
MARKUP_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")

# Qwen2/3's pre-tokenizer split: words with their leading space, single digits, punctuation runs,
# newlines kept apart from other whitespace.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen-style ChatML with Hermes tool calling: tools are listed as JSON in <tools></tools> inside the
# system turn; assistant tool calls are <tool_call>{"name": ..., "arguments": ...}</tool_call>; tool
# results go back in a user turn as <tool_response> blocks (consecutive results share one turn).
CHAT_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'
    '{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') }}
{%- for call in message.tool_calls or [] %}
{%- set call = call.function if call.function is defined else call %}
{%- if loop.first and message.content %}{{- '\\n' }}{%- endif %}
{{- '<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' }}
{{- call.arguments if call.arguments is string else call.arguments | tojson }}
{{- '}\\n</tool_call>' + ('' if loop.last else '\\n') }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


def make_tiny_model(
    out_dir: str | Path,
    model_type: str = "qwen3",
    seed: int = 0,
    vocab_size: int = 1024,
    corpus: str | None = None,
    **overrides: Any,
) -> Path:
    """Writes tokenizer files, config.json and random safetensors weights to `out_dir`.

    `overrides` are config.json fields (hidden_size=256, num_hidden_layers=4, ...). The config's
    vocab_size is len(tokenizer), which equals `vocab_size` unless the corpus runs out of merges
    (at about 2,700). The same arguments always give the same files. ``corpus``: text to train the
    BPE on instead of the packaged corpus (a policy that reads a compact language).
    """
    if model_type not in _HF_CONFIGS:
        raise NotImplementedError(
            f"make_tiny_model: model_type {model_type!r} is not implemented (known: {', '.join(_HF_CONFIGS)})"
        )
    out = Path(out_dir)
    tokenizer = build_tokenizer(vocab_size, corpus)
    hf = _HF_CONFIGS[model_type](tokenizer)
    hf.update(overrides)
    config = ModelConfig.from_hf(hf)
    save_pretrained(init_model(config, seed=seed), out, tokenizer=tokenizer)
    return out


def build_tokenizer(vocab_size: int = 1024, corpus: str | None = None) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on ``corpus`` (default: the packaged one), with Qwen's special tokens
    and chat template."""
    added = len(CONTROL_TOKENS) + len(MARKUP_TOKENS)
    if vocab_size < 256 + added:
        raise ValueError(f"vocab_size must be at least {256 + added} (256 bytes + {added} added tokens)")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - added,
        min_frequency=1,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    if corpus is None:
        corpus = resources.files("porch_jax.models").joinpath("tokenizer_corpus.txt").read_text(encoding="utf-8")
    bpe.train_from_iterator(corpus.splitlines(keepends=True), trainer)
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CONTROL_TOKENS])
    bpe.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        extra_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )


def _qwen3_config(tokenizer: PreTrainedTokenizerFast) -> dict[str, Any]:
    return {
        "model_type": "qwen3",
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        # vLLM's CPU attention kernels take head_dim in {32, 64, 80, ...}: 16 loads but fails at the
        # first request, so the default tiny model stays servable.
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "bos_token_id": None,
        "eos_token_id": tokenizer.convert_tokens_to_ids(IM_END),
        "pad_token_id": tokenizer.convert_tokens_to_ids(END_OF_TEXT),
    }


def _qwen3_5_config(tokenizer: PreTrainedTokenizerFast) -> dict[str, Any]:
    return preset(
        "qwen3.5-tiny",
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(END_OF_TEXT),
    )


# model_type -> the default config.json of its tiny model; a new architecture adds one entry.
_HF_CONFIGS: dict[str, Callable[[PreTrainedTokenizerFast], dict[str, Any]]] = {
    "qwen3": _qwen3_config,
    "qwen3_5": _qwen3_5_config,  # a text-only checkpoint (model_type qwen3_5_text)
    "qwen3_5_text": _qwen3_5_config,
}
