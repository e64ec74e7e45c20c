"""Records -> examples -> bucketed, host-sharded batches; the iterator's resumable state."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
import tiny_data

from porch_jax.attribution.grm import teacher_context
from porch_jax.protocol.render import prompt_ids
from porch_jax.train import data as D
from porch_jax.train import mesh as mesh_lib

BUCKETS = D.Buckets((80, 128), (32,))


def test_prompt_is_chat_template_with_generation_prompt(tok, eps):
    d = eps[0].decisions[0]
    ex = D.sft_examples(eps[:1], tok)[0]
    expected = tok.apply_chat_template(d.context, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert list(ex.views["policy"].prompt) == list(expected)
    assert tok.decode(ex.views["policy"].prompt).endswith("<|im_start|>assistant\n")


def test_target_uses_stored_token_ids_verbatim(tok, eps):
    ep = eps[0]
    # Stored ids that differ from what re-tokenizing the text would give: they must win.
    odd_ids = [5, 6, 7, tok.eos_token_id]
    ep = dataclasses.replace(ep, decisions=[dataclasses.replace(ep.decisions[0], action_token_ids=odd_ids)])
    assert tuple(D.sft_examples([ep], tok)[0].views["policy"].target) == tuple(odd_ids)
    # Without ids the text is tokenized and eos appended once.
    text_only = dataclasses.replace(ep.decisions[0], action_token_ids=[])
    target = D.decision_target(tok, text_only)
    assert target == tok.encode(text_only.action_text, add_special_tokens=False) + [tok.eos_token_id]


def test_invalid_decisions_are_skipped_and_rwr_keeps_successes(tok, eps):
    broken = dataclasses.replace(eps[0], decisions=[dataclasses.replace(eps[0].decisions[0], action=None)])
    assert D.sft_examples([broken], tok) == []
    n_success = sum(len(ep.decisions) for ep in eps if ep.outcome.success)
    assert len(D.rwr_examples(eps, tok)) == n_success
    assert len(D.sft_examples(eps, tok)) == sum(len(ep.decisions) for ep in eps)


def test_loss_mask_covers_exactly_the_decision_tokens(tok, eps):
    exs = D.sft_examples(eps, tok)[:4]
    b = D.collate(exs, ("policy",), (), 128, 32, pad_id=tok.pad_token_id)["policy"]
    for row, ex in enumerate(exs):
        view = ex.views["policy"]
        n, p = len(view.target), len(view.prompt)
        assert b["target_mask"][row].sum() == n
        # The hidden state at index[j] predicts the token right after it: the j-th target token.
        idx = b["index"][row][:n]
        np.testing.assert_array_equal(b["tokens"][row][idx + 1], view.target)
        assert idx[0] == p - 1
        assert b["mask"][row].sum() == p + n


def test_teacher_view_is_context_plus_hint_with_the_same_target(tok, eps):
    hints = tiny_data.hints(eps)
    exs = {ex.key: ex for ex in D.opod_examples(eps, tok, hints, teacher_context=teacher_context)}
    for ep in eps:
        for d in ep.decisions:
            key = D.decision_key(ep.episode_id, d.index)
            hint = hints.get((ep.episode_id, d.index))
            if not ep.outcome.success and not hint:
                assert key not in exs
                continue
            views = exs[key].views
            assert ("rwr" in views) == ep.outcome.success
            assert ("teacher" in views) == bool(hint)
            if hint:
                teacher_ctx = teacher_context(d.context, hint)
                assert teacher_ctx[-1] == {"role": "user", "content": "Hint: " + hint} and teacher_ctx[:-1] == d.context
                assert list(views["teacher"].prompt) == prompt_ids(tok, teacher_ctx)
                assert views["teacher"].target == views["student"].target
                assert views["student"].prompt == tuple(prompt_ids(tok, d.context))
    # Student and teacher score the same target tokens, position by position.
    ex = next(e for e in exs.values() if "teacher" in e.views)
    b = D.collate([ex], ("student", "teacher"), (), 128, 32, pad_id=0)
    s, t = b["student"], b["teacher"]
    np.testing.assert_array_equal(
        s["tokens"][0][s["index"][0] + 1] * s["target_mask"][0], t["tokens"][0][t["index"][0] + 1] * t["target_mask"][0]
    )


def test_resampled_opd_target_replaces_both_views(tok, eps):
    ex = next(
        e
        for e in D.opod_examples(eps, tok, tiny_data.hints(eps), teacher_context=teacher_context)
        if "teacher" in e.views
    )
    new = D.with_opd_target(ex, [9, 8, tok.eos_token_id], [-1.0, -2.0, -0.1])
    assert new.views["student"].target == new.views["teacher"].target == (9, 8, tok.eos_token_id)
    assert new.views["student"].logprobs == (-1.0, -2.0, -0.1) and new.views["teacher"].logprobs is None
    assert new.views.get("rwr") == ex.views.get("rwr")


def test_too_long_example_names_the_decision(tok, eps):
    ex = D.sft_examples(eps, tok)[0]
    with pytest.raises(D.DataError, match=ex.key):
        D.Buckets((32,), (32,)).of([ex])


def _iterator(exs, state, mesh_shape=(1, 1, 1), micro=8, accum=1):
    mesh = mesh_lib.make_mesh(mesh_shape)
    return D.BatchIterator(
        exs,
        buckets=BUCKETS,
        micro_batch=micro,
        accum_steps=accum,
        views=("policy",),
        pad_id=0,
        batch_sharding=jax.sharding.NamedSharding(mesh, mesh_lib.batch_spec(mesh=mesh)),
        state=state,
    )


def test_epoch_covers_every_example_once_in_fixed_shapes(tok, eps):
    exs = D.sft_examples(eps, tok)
    plan = D.epoch_plan(exs, BUCKETS, 8, seed=0, epoch=0)
    used = np.concatenate(plan)
    assert sorted(used[used >= 0]) == list(range(len(exs)))
    it = _iterator(exs, D.IteratorState(0))
    shapes = set()
    for _ in range(len(plan)):
        batch = next(it)
        shapes.add(batch["policy"]["tokens"].shape)
    assert shapes <= {(1, 8, 80), (1, 8, 128)} and len(shapes) == 2
    assert it.state == D.IteratorState(0, 0, len(plan))
    next(it)
    assert it.state == D.IteratorState(0, 1, 1)
    assert not np.array_equal(np.stack(D.epoch_plan(exs, BUCKETS, 8, seed=0, epoch=1)), np.stack(plan))  # reshuffled


def test_iterator_resumes_exactly_from_its_state(tok, eps):
    exs = D.sft_examples(eps, tok)
    it = _iterator(exs, D.IteratorState(seed=3))
    for _ in range(4):
        next(it)
    saved = D.IteratorState.from_json(it.state.to_json())
    expected = [jax.device_get(next(it)) for _ in range(3)]
    resumed = _iterator(exs, saved)
    for want in expected:
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(next(resumed)), want)


def test_global_batch_is_sharded_over_data_and_fsdp(tok, eps):
    exs = D.sft_examples(eps, tok)
    it = _iterator(exs, D.IteratorState(0), mesh_shape=(2, 2, 2), micro=4, accum=2)
    host = it.next_host_batch()
    batch = it.to_global(host)
    tokens = batch["policy"]["tokens"]
    assert tokens.shape[:2] == (2, 4)
    assert tokens.sharding.spec == jax.sharding.PartitionSpec(None, ("data", "fsdp"), None)
    # Each of the 4 data-parallel shards holds one row of each micro-batch.
    assert {s.data.shape[:2] for s in tokens.addressable_shards} == {(2, 1)}
    want = np.stack([D.collate(m, ("policy",), (), *host.bucket, pad_id=0)["policy"]["tokens"] for m in host.rows])
    np.testing.assert_array_equal(np.asarray(tokens), want)


def test_process_rows_single_process_owns_everything():
    mesh = mesh_lib.make_mesh((2, 2, 2))
    sharding = jax.sharding.NamedSharding(mesh, mesh_lib.batch_spec(mesh=mesh))
    assert D.process_rows(sharding, (3, 8), axis=1) == slice(0, 8)


def test_hint_table_keeps_attributable_hints_only():
    rows = [
        {"episode_id": "a", "index": 0, "attributable": True, "hint": "more budget"},
        {"episode_id": "a", "index": 1, "attributable": False, "hint": "ignored"},
        {"episode_id": "b", "index": 0, "attributable": True, "hint": ""},
    ]
    assert D.hint_table(rows) == {("a", 0): "more budget"}


def test_grpo_examples_carry_group_advantages_and_sampler_logprobs(tok):
    ctx = [{"role": "user", "content": "pick an agent"}]
    groups = [
        {
            "key": "g0",
            "context": ctx,
            "samples": [
                {"token_ids": [5, 6], "logprobs": [-1.0, -2.0], "reward": 1.0},
                {"token_ids": [7], "logprobs": [-0.5], "reward": 0.0},
            ],
        }
    ]
    exs = D.grpo_examples(groups, tok)
    adv = [e.scalars["advantage"] for e in exs]
    assert adv[0] > 0 > adv[1] and abs(adv[0] + adv[1]) < 1e-6
    b = D.collate(exs, ("policy",), ("advantage",), 64, 8, pad_id=0)
    assert b["policy"]["sampled"].sum() == 3 and b["advantage"].tolist() == pytest.approx(adv)


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
        D.sft_examples([dataclasses.replace(ep, decisions=[bad])], tok)


def test_token_sources_count_the_retokenized_rows(tok, eps):
    ep = eps[0]
    marked = [dataclasses.replace(d, token_source="server" if i else "none") for i, d in enumerate(ep.decisions)]
    counts = D.token_sources([dataclasses.replace(ep, decisions=marked)])
    valid = sum(d.action is not None for d in ep.decisions)
    assert counts["none"] == int(ep.decisions[0].action is not None) and sum(counts.values()) == valid


def test_recorded_template_kwargs_render_the_prompt_the_server_saw(tok, eps):
    """A Qwen3-style template with thinking switched off at rollout (Sampling.thinking=False) renders another
    generation prompt; training renders with the episode's recorded template kwargs, and without them the
    server's prompt ids catch the drift."""
    import copy

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
    (example,) = D.sft_examples([recorded], thinking)
    assert list(example.views["policy"].prompt) == served
    with pytest.raises(D.PromptMismatch):
        D.sft_examples([dataclasses.replace(recorded, meta={**ep.meta, "template_kwargs": {}})], thinking)
