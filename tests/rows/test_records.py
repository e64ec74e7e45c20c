"""Rows from records: each recorded decision a one-span row (its prompt, then its target as one span of weight 1),
each method's rows (SFT every valid decision, RWR the successful episodes', OPOD's OPD rows the hinted decisions'),
GRPO groups from their record rows, and the batches a records run draws from them."""

from __future__ import annotations

import copy
import dataclasses

import jax
import numpy as np
import pytest
import tiny_data

from porch_jax.attribution.grm import teacher_context
from porch_jax.protocol.render import prompt_ids
from porch_jax.rows import records as R
from porch_jax.rows.decisions import PromptMismatch, decision_prompt, decision_target
from porch_jax.train import mesh as mesh_lib
from porch_jax.train import sources
from porch_jax.train.config import MethodConfig, TrainConfig
from porch_jax.train.packing import DataError, RecordedGroup, RecordedSample, Span, scored_batch, seq_batch

CONTEXT = [{"role": "user", "content": "pick an agent"}]


def _cfg(method: str) -> R.RecordsConfig:
    return R.RecordsConfig(workdir="", train=TrainConfig(steps=1, method=MethodConfig(name=method)))


def _valid(eps):
    return [(ep, d) for ep in eps for d in ep.decisions if d.action is not None]


def test_a_decision_row_is_its_prompt_then_its_target_as_one_span(tok, eps):
    rows = R.decision_rows(eps, tok)
    valid = _valid(eps)
    assert [r.key for r in rows] == [(ep.episode_id, d.index) for ep, d in valid]
    for row, (ep, d) in zip(rows, valid, strict=True):
        prompt, target = decision_prompt(tok, ep.episode_id, d), decision_target(tok, d)
        assert row.tokens == tuple(prompt + target) and target[-1] == tok.eos_token_id
        assert row.spans == (Span(len(prompt), len(target), 1.0),)
    # The span is exactly the decision's target: each target token predicted from the column before it.
    b = seq_batch(rows[:4], 128, 32)
    for i, row in enumerate(rows[:4]):
        ((p, n, _),) = [dataclasses.astuple(s) for s in row.spans]
        assert b.target_mask[i].sum() == n and b.mask[i].sum() == p + n
        idx = b.index[i][:n]
        assert idx[0] == p - 1
        np.testing.assert_array_equal(b.tokens[i][idx + 1], row.tokens[p:])
        np.testing.assert_array_equal(b.targets[i][:n], row.tokens[p:])
        assert b.weight[i].sum() == pytest.approx(1.0)  # a per-decision mean
    np.testing.assert_array_equal(b.count, [1, 1, 1, 1])  # one decision each


def test_a_decision_row_targets_the_stored_ids_verbatim(tok, eps):
    ep = eps[0]
    odd_ids = [5, 6, 7, tok.eos_token_id]
    ep = dataclasses.replace(ep, decisions=[dataclasses.replace(ep.decisions[0], action_token_ids=odd_ids)])
    (row,) = R.decision_rows([ep], tok)
    (span,) = row.spans
    assert row.tokens[span.start :] == tuple(odd_ids) and span.length == len(odd_ids)


def test_invalid_decisions_are_skipped_and_rwr_keeps_successes(tok, eps):
    broken = dataclasses.replace(eps[0], decisions=[dataclasses.replace(eps[0].decisions[0], action=None)])
    assert R.decision_rows([broken], tok) == []
    sft = R.method_rows(_cfg("sft"), tok, episodes=eps)
    assert len(sft.decisions) == sum(len(ep.decisions) for ep in eps) and not sft.opd and not sft.groups
    rwr = R.method_rows(_cfg("rwr"), tok, episodes=eps)
    successful = {ep.episode_id for ep in eps if ep.outcome.success}
    assert rwr.decisions == [r for r in sft.decisions if r.key[0] in successful]
    assert len(rwr.decisions) == sum(len(ep.decisions) for ep in eps if ep.outcome.success) < len(sft.decisions)
    assert not rwr.opd and not rwr.groups


def test_opd_rows_are_the_hinted_decisions_with_the_hint_in_the_teacher_prompt(tok, eps):
    hints = tiny_data.hints(eps)
    rows = R.opd_rows(eps, tok, hints)
    hinted = [(ep, d) for ep, d in _valid(eps) if (ep.episode_id, d.index) in hints]
    assert [r.key for r in rows] == [(ep.episode_id, d.index) for ep, d in hinted]
    assert 0 < len(rows) < len(_valid(eps))
    for row, (ep, d) in zip(rows, hinted, strict=True):
        hint = hints[row.key]
        teacher_ctx = teacher_context(d.context, hint)
        assert teacher_ctx[-1] == {"role": "user", "content": "Hint: " + hint} and teacher_ctx[:-1] == d.context
        assert list(row.student) == decision_prompt(tok, ep.episode_id, d)
        assert list(row.teacher) == prompt_ids(tok, teacher_ctx)
        assert "Hint: " + hint in tok.decode(row.teacher) and "Hint: " not in tok.decode(row.student)
    # OPOD: RWR rows for the successful episodes beside OPD rows for the hinted decisions; without hints RWR alone.
    opod = R.method_rows(_cfg("opod"), tok, episodes=eps, hints=hints)
    assert opod.decisions == R.method_rows(_cfg("rwr"), tok, episodes=eps).decisions and opod.opd == rows
    assert R.method_rows(_cfg("opod"), tok, episodes=eps).opd == []
    # Student and teacher score the same action tokens, position by position.
    action = decision_target(tok, hinted[0][1])
    s = scored_batch([rows[0].student], [action], 192, 32)
    t = scored_batch([rows[0].teacher], [action], 192, 32)
    assert s.target_mask[0].sum() == t.target_mask[0].sum() == len(action)
    np.testing.assert_array_equal(
        s.tokens[0][s.index[0] + 1] * s.target_mask[0], t.tokens[0][t.index[0] + 1] * t.target_mask[0]
    )


def test_decision_rows_render_with_the_episodes_recorded_template_kwargs(tok, eps):
    """Rows render each prompt as the episode's orchestrator template was rendered (here: thinking off), so the
    server's prompt ids agree; without the recorded kwargs they catch the drift."""
    thinking = copy.deepcopy(tok)
    thinking.chat_template = (
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}{% if add_generation_prompt %}"
        "<|assistant|>{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}"
    )
    ep = eps[0]
    d = ep.decisions[0]
    served = prompt_ids(thinking, d.context, enable_thinking=False)
    d = dataclasses.replace(d, prompt_token_ids=served, token_source="server")
    recorded = dataclasses.replace(ep, decisions=[d], meta={**ep.meta, "template_kwargs": {"enable_thinking": False}})
    (row,) = R.decision_rows([recorded], thinking)
    assert list(row.tokens[: row.spans[0].start]) == served
    (opd,) = R.opd_rows([recorded], thinking, {(ep.episode_id, d.index): "ask the archive"})
    assert list(opd.student) == served and thinking.decode(opd.teacher).endswith("<|assistant|><think></think>")
    with pytest.raises(PromptMismatch):
        R.decision_rows([dataclasses.replace(recorded, meta={})], thinking)


def test_recorded_groups_replay_their_samples_logprobs_and_rewards(tok):
    samples = [
        {"token_ids": [5, 6], "logprobs": [-1.0, -2.0], "reward": 1.0},
        {"token_ids": [7], "logprobs": [-0.5], "reward": 0.0},
    ]
    (group,) = R.recorded_groups([{"key": "g0", "context": CONTEXT, "samples": samples}], tok)
    assert group == RecordedGroup(
        "g0",
        tuple(prompt_ids(tok, CONTEXT)),
        (RecordedSample((5, 6), (-1.0, -2.0), 1.0), RecordedSample((7,), (-0.5,), 0.0)),
    )
    grpo = R.method_rows(_cfg("grpo"), tok, groups=[{"key": "g0", "context": CONTEXT, "samples": samples}])
    assert grpo.groups == [group] and not grpo.decisions and not grpo.opd
    batch, stats = sources.RecordedGroups([group], 1, (64,), 0, mesh_lib.make_mesh((1, 1, 1)))(0, None)
    adv = np.asarray(batch["policy"].advantage).reshape(-1)
    assert adv[0] > 0 > adv[1] and abs(adv[0] + adv[1]) < 1e-6
    policy = jax.tree.map(lambda x: np.asarray(x)[0], batch["policy"])
    np.testing.assert_array_equal(policy.sampled[:, :2], [[True, True], [True, False]])
    assert policy.sampled.sum() == 3
    np.testing.assert_allclose(policy.logprobs[:, :2], [[-1.0, -2.0], [-0.5, 0.0]])
    np.testing.assert_array_equal(policy.targets[:, :2], [[5, 6], [7, 0]])
    assert stats["reward"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("group", "match"),
    [
        ({"key": "g1", "context": CONTEXT}, r"GRPO group 'g1': KeyError 'samples'"),
        ({"key": "g2", "samples": []}, r"GRPO group 'g2': KeyError 'context'"),
        (
            {"key": "g3", "context": CONTEXT, "samples": [{"token_ids": [5], "logprobs": [-1.0]}]},
            r"GRPO group 'g3': KeyError 'reward'",
        ),
        (
            {"key": "g4", "context": CONTEXT, "samples": [{"token_ids": [5], "logprobs": ["high"], "reward": 1}]},
            r"GRPO group 'g4': ValueError",
        ),
        ({"context": CONTEXT, "samples": []}, r"GRPO group '#1': KeyError 'key'"),
    ],
)
def test_recorded_groups_name_a_malformed_group(tok, group, match):
    good = {"key": "g0", "context": CONTEXT, "samples": [{"token_ids": [5], "logprobs": [-1.0], "reward": 1.0}]}
    with pytest.raises(DataError, match=match + r".*a group holds key, context and samples"):
        R.recorded_groups([good, group], tok)


def test_an_over_long_decision_row_is_named_under_error(tok, eps):
    rows = R.decision_rows(eps, tok)
    with pytest.raises(DataError, match=r"episode 'ep0' decision 0: a row of \d+ tokens .* \(32\)"):
        sources.PackedSource(rows, 4, (32,), 0, mesh_lib.make_mesh((1, 1, 1)), overlong="error")


def test_a_records_runs_batches_are_a_function_of_the_seed_and_the_step(tok, eps):
    """A resumed run (its data state is {}) draws the batches the uninterrupted run would have, each from one
    length bucket (one compiled shape per bucket)."""
    rows = R.decision_rows(eps, tok)
    mesh = mesh_lib.make_mesh((1, 1, 1))
    first, resumed = (sources.PackedSource(rows, 8, (80, 128), 3, mesh) for _ in range(2))
    assert first.state() == {}
    resumed.restore(first.state())
    for step in (7, 0, 3):
        jax.tree.map(np.testing.assert_array_equal, resumed.host(step), first.host(step))
    shapes = {first.host(step)["policy"].tokens.shape for step in range(12)}
    assert shapes == {(8, 80), (8, 128)}
    other = sources.PackedSource(rows, 8, (80, 128), 4, mesh)
    assert any(not np.array_equal(other.host(s)["policy"].tokens, first.host(s)["policy"].tokens) for s in range(4))


def test_global_batch_is_sharded_over_data_and_fsdp(tok, eps):
    rows = R.decision_rows(eps, tok)
    source = sources.PackedSource(rows, 8, (80, 128), 0, mesh_lib.make_mesh((2, 2, 2)), accum_steps=2)
    batch, _ = source(0, None)
    tokens = batch["policy"].tokens
    assert tokens.shape[:2] == (2, 4) and batch["policy"].count.shape == (2, 4)
    assert tokens.sharding.spec == jax.sharding.PartitionSpec(None, ("data", "fsdp"), None)
    # Each of the 4 data-parallel shards holds one row of each micro-batch.
    assert {s.data.shape[:2] for s in tokens.addressable_shards} == {(2, 1)}
    host = source.host(0)["policy"].tokens
    np.testing.assert_array_equal(np.asarray(tokens), host.reshape(2, 4, host.shape[-1]))
