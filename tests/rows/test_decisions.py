"""A recorded decision as token ids: its prompt as the chat template renders it (checked against the server's), its
target as it was sampled; which decisions are trainable, where their ids came from, and which hints count."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from porch_jax.protocol.render import prompt_ids
from porch_jax.rows import decisions as D
from porch_jax.train.packing import DataError


def test_prompt_is_chat_template_with_generation_prompt(tok, eps):
    ep = eps[0]
    d = ep.decisions[0]
    prompt = D.decision_prompt(tok, ep.episode_id, d, template_kwargs=D.template_kwargs(ep))
    expected = tok.apply_chat_template(d.context, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert prompt == list(expected)
    assert tok.decode(prompt).endswith("<|im_start|>assistant\n")


def test_target_uses_stored_token_ids_verbatim(tok, eps):
    d = eps[0].decisions[0]
    assert d.action_token_ids and D.decision_target(tok, d) == d.action_token_ids
    # Stored ids that differ from what re-tokenizing the text would give: they must win.
    odd_ids = [5, 6, 7, tok.eos_token_id]
    assert D.decision_target(tok, dataclasses.replace(d, action_token_ids=odd_ids)) == odd_ids
    assert D.decision_target(tok, dataclasses.replace(d, action_token_ids=odd_ids[:-1])) == odd_ids  # eos once
    # Without ids the text is tokenized and eos appended once.
    text_only = dataclasses.replace(d, action_token_ids=[])
    target = D.decision_target(tok, text_only)
    assert target == tok.encode(text_only.action_text, add_special_tokens=False) + [tok.eos_token_id]


def test_invalid_decisions_are_skipped(eps):
    ep = eps[1]
    broken = dataclasses.replace(ep, decisions=[dataclasses.replace(ep.decisions[0], action=None), *ep.decisions[1:]])
    kept = [(e.episode_id, d.index) for e, d in D.valid_decisions([eps[0], broken])]
    assert kept == [(eps[0].episode_id, d.index) for d in eps[0].decisions] + [
        (ep.episode_id, d.index) for d in ep.decisions[1:]
    ]


def test_hint_table_keeps_attributable_hints_only():
    rows = [
        {"episode_id": "a", "index": 0, "attributable": True, "hint": "more budget"},
        {"episode_id": "a", "index": 1, "attributable": False, "hint": "ignored"},
        {"episode_id": "b", "index": 0, "attributable": True, "hint": ""},
        {"episode_id": "c", "index": "2", "hint": "no flag: attributable"},
    ]
    assert D.hint_table(rows) == {("a", 0): "more budget", ("c", 2): "no flag: attributable"}


def test_server_prompt_ids_are_checked_against_our_rendering(tok, eps):
    ep = eps[0]
    d = ep.decisions[0]
    ours = prompt_ids(tok, d.context)
    same = dataclasses.replace(d, prompt_token_ids=list(ours), token_source="server")
    assert D.decision_prompt(tok, ep.episode_id, same) == ours
    drifted = list(ours)
    drifted[3] = (drifted[3] + 1) % len(tok)
    bad = dataclasses.replace(d, prompt_token_ids=drifted)
    with pytest.raises(D.PromptMismatch, match=rf"episode '{ep.episode_id}' decision {d.index}: .* from token 3"):
        D.decision_prompt(tok, ep.episode_id, bad)
    assert issubclass(D.PromptMismatch, DataError)  # a run refuses it before its first step, as any bad row


def test_token_sources_count_the_retokenized_rows(eps):
    ep = eps[0]
    marked = [dataclasses.replace(d, token_source="server" if i else "none") for i, d in enumerate(ep.decisions)]
    counts = D.token_sources([dataclasses.replace(ep, decisions=marked)])
    valid = sum(d.action is not None for d in ep.decisions)
    assert counts["none"] == int(ep.decisions[0].action is not None) and sum(counts.values()) == valid


def test_recorded_template_kwargs_render_the_prompt_the_server_saw(tok, eps):
    """A Qwen3-style template with thinking switched off at rollout (Sampling.thinking=False) renders another
    generation prompt; training renders with the episode's recorded template kwargs, and without them the
    server's prompt ids catch the drift."""
    thinking = copy.deepcopy(tok)
    thinking.chat_template = (
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}{% if add_generation_prompt %}"
        "<|assistant|>{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}"
    )
    ep = eps[0]
    d = next(d for d in ep.decisions if d.action is not None)
    served = prompt_ids(thinking, d.context, enable_thinking=False)
    assert served != prompt_ids(thinking, d.context)
    d = dataclasses.replace(d, prompt_token_ids=served, token_source="server")
    recorded = dataclasses.replace(ep, decisions=[d], meta={**ep.meta, "template_kwargs": {"enable_thinking": False}})
    assert D.template_kwargs(recorded) == {"enable_thinking": False} and D.template_kwargs(ep) == {}
    assert D.decision_prompt(thinking, ep.episode_id, d, template_kwargs=D.template_kwargs(recorded)) == served
    with pytest.raises(D.PromptMismatch):
        D.decision_prompt(thinking, ep.episode_id, d, template_kwargs=D.template_kwargs(ep))
