"""Tool schemas reach the model whether or not its chat template renders tools (protocol.render.prompt_ids)."""

from __future__ import annotations

import json

import pytest

from porch_jax.models import tiny
from porch_jax.protocol.render import chat_inputs, prompt_ids, template_renders_tools, tools_in_system

TOOL = {
    "type": "function",
    "function": {
        "name": "web_search",
        "description": "Search the web for a query.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}
MESSAGES = [{"role": "system", "content": "You are a sub-agent."}, {"role": "user", "content": "Find the capital."}]
# SmolLM2-135M-Instruct's ChatML template, which never reads `tools`.
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_template_detection():
    assert template_renders_tools(tiny.CHAT_TEMPLATE)
    assert not template_renders_tools(CHATML)
    assert not template_renders_tools(None)


def test_schemas_join_the_system_message_or_open_one():
    joined = tools_in_system(MESSAGES, [TOOL])
    assert joined[0]["content"].startswith("You are a sub-agent.\n\n") and json.dumps(TOOL) in joined[0]["content"]
    assert joined[1:] == MESSAGES[1:]
    opened = tools_in_system(MESSAGES[1:], [TOOL])
    assert opened[0]["role"] == "system" and json.dumps(TOOL) in opened[0]["content"] and opened[1:] == MESSAGES[1:]
    assert chat_inputs(MESSAGES, [TOOL], template_tools=True) == (MESSAGES, [TOOL])
    assert chat_inputs(MESSAGES, None, template_tools=False) == (MESSAGES, None)


def test_a_template_without_tools_still_shows_the_schemas():
    tok = tiny.build_tokenizer()
    tok.chat_template = CHATML
    text = tok.decode(prompt_ids(tok, MESSAGES, [TOOL]))
    assert "web_search" in text and "Search the web for a query." in text and "<tool_call>" in text
    assert text.endswith("<|im_start|>assistant\n")
    tok.chat_template = tiny.CHAT_TEMPLATE  # a template that renders tools gets them as `tools`, unchanged
    assert prompt_ids(tok, MESSAGES, [TOOL]) == list(
        tok.apply_chat_template(MESSAGES, tools=[TOOL], add_generation_prompt=True, tokenize=True)["input_ids"]
    )


@pytest.mark.slow
def test_smollm2_prompt_holds_the_tool_schemas(smollm2_dir):
    from transformers import AutoTokenizer

    from porch_jax.models.io import folder_renders_tools

    assert not folder_renders_tools(smollm2_dir)
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    plain = tok.decode(tok.apply_chat_template(MESSAGES, tools=[TOOL], add_generation_prompt=True)["input_ids"])
    assert "web_search" not in plain  # what the template alone does: the schemas vanish
    text = tok.decode(prompt_ids(tok, MESSAGES, [TOOL]))
    assert "web_search" in text and '"required": ["query"]' in text
