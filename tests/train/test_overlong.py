"""Rows over the largest bucket: each `overlong` rule on each row kind, target tokens unmoved by a cut, the counts,
the error naming the row, and the defaults (packed sources drop as they always did, records raise)."""

from __future__ import annotations

import dataclasses
import io
import json

import jax
import numpy as np
import pytest
import tiny_data

from porch_jax.opod import rows as episode_rows
from porch_jax.opod.config import PolicySection
from porch_jax.opod.rewards import dagrpo_reward
from porch_jax.train import data as D
from porch_jax.train import mesh as mesh_lib
from porch_jax.train import overlong as O
from porch_jax.train import sources
from porch_jax.train.config import SamplingConfig
from porch_jax.train.packing import ExpertContext, OpdRow, SeqRow, Span, seq_batch
from porch_jax.typed_config import ConfigError, from_dict


def _mesh():
    return mesh_lib.make_mesh((1, 1, 1))


@pytest.fixture(scope="module")
def packed(tok, eps):
    """ep0 as one packed row (no limit): decision 0 at tokens 35..64, decision 1 (prompt 79) at 79..109."""
    (row,) = episode_rows.pack_episode(eps[0], tok, "full", 1.0, 10_000)
    assert [(s.start, s.length) for s in row.spans] == [(35, 29), (79, 30)] and len(row.tokens) == 109
    return row


def _targets(row: SeqRow, t: int = 128, k: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """The row's target tokens and the token after each predicting column, as seq_batch lays them out."""
    b = seq_batch([row], t, k)
    n = int(b["target_mask"][0].sum())
    return b["targets"][0][:n], b["tokens"][0][b["index"][0][:n] + 1]


# ---- packed rows --------------------------------------------------------------------------------------


def test_cut_row_keeps_every_target_token_where_it_was(packed):
    targets, _ = _targets(packed)
    crossing = O.cut_row(packed, 90)  # decision 1's prompt fits, its target crosses the cut
    assert crossing.spans == (Span(35, 29, 1.0), Span(79, 11, 1.0)) and crossing.tokens == packed.tokens[:90]
    beyond = O.cut_row(packed, 70)  # decision 1's prompt does not fit: removed, its prompt tokens trimmed
    assert beyond.spans == (Span(35, 29, 1.0),) and beyond.tokens == packed.tokens[:64]
    for cut in (crossing, beyond):
        kept, predicted = _targets(cut)
        np.testing.assert_array_equal(kept, targets[: len(kept)])  # the same tokens, in order
        np.testing.assert_array_equal(predicted, kept)  # each predicted from the column before it, as uncut
        assert cut.key == packed.key == ("ep0", 0)
    b = seq_batch([crossing], 128, 64)
    assert float(b["count"]) == 2 and b["weight"][0][29:40].sum() == pytest.approx(1.0)  # still one decision
    assert O.cut_row(packed, 30) is None  # no target token left
    assert O.cut_row(packed, 109) is packed


def test_each_rule_on_packed_rows_counts_and_names_the_row(packed):
    short = SeqRow(tuple(range(1, 21)), (Span(10, 10),), ("ep9", 2))
    rows = [short, packed, dataclasses.replace(packed, key=("ep0", 1))]
    kept, counts = O.seq_rows(rows, 64, "drop")
    assert kept == [short] and counts == O.RowCounts("drop", 64, kept=1, cut=0, dropped=2)
    kept, counts = O.seq_rows(rows, 90, "cut")
    assert kept[0] is short and [r.spans[-1].length for r in kept[1:]] == [11, 11]
    assert counts == O.RowCounts("cut", 90, kept=1, cut=2, dropped=0)
    kept, counts = O.seq_rows(rows, 30, "cut")  # decision 0's prompt (35 tokens) does not fit: nothing left
    assert kept == [short] and (counts.cut, counts.dropped) == (0, 2)
    with pytest.raises(D.DataError, match=r"episode 'ep0' decision 0: a packed row of 109 tokens .* \(64\)"):
        O.seq_rows(rows, 64, "error")
    assert O.seq_rows(rows, 109, "error")[1].kept == 3
    with pytest.raises(ValueError, match="overlong must be one of"):
        O.seq_rows(rows, 64, "trim")


def test_an_over_long_decision_gets_its_own_row_and_the_rest_pack_as_before(tok, eps):
    """The rows within max_len are those of the episode without its over-long decisions (what "drop" trains)."""
    for ep in eps[:6]:
        rows = episode_rows.pack_episode(ep, tok, "full", 1.0, 80)
        over = [(ep.episode_id, d.index) for d in ep.decisions if d.index == 1]  # prompts of 78-81 tokens
        without = dataclasses.replace(
            ep, decisions=[dataclasses.replace(d, action=None) if d.index == 1 else d for d in ep.decisions]
        )
        assert [r for r in rows if len(r.tokens) <= 80] == episode_rows.pack_episode(without, tok, "full", 1.0, 10_000)
        assert [r.key for r in rows if len(r.tokens) > 80] == over
        assert all(len(r.spans) == 1 for r in rows if len(r.tokens) > 80)


def test_packed_source_drops_by_default_exactly_as_leaving_the_rows_out(packed):
    rows = [SeqRow(tuple(range(1, n + 1)), (Span(n // 2, n - n // 2),), ("ep", n)) for n in (10, 14, 20, 30, 31)]
    plain = sources.PackedSource(rows, 2, (16, 32), 3, _mesh())
    with_long = sources.PackedSource(rows + [packed], 2, (16, 32), 3, _mesh())
    for step in range(6):
        jax.tree.map(np.testing.assert_array_equal, plain.host(step), with_long.host(step))
    assert with_long.row_counts == {"policy": O.RowCounts("drop", 32, kept=5, cut=0, dropped=1)}
    cut = sources.PackedSource(rows + [packed], 2, (16, 32), 3, _mesh(), "rwr", overlong="cut")
    assert cut.row_counts == {"rwr": O.RowCounts("cut", 32, kept=5, cut=0, dropped=1)}  # 35-token prompt: nothing
    with pytest.raises(D.DataError, match="episode 'ep0' decision 0"):
        sources.PackedSource(rows + [packed], 2, (16, 32), 3, _mesh(), overlong="error")


# ---- OPD rows and DA-GRPO contexts: prompts only, never cut -----------------------------------------------


def test_opd_rows_and_expert_contexts_drop_under_cut_and_name_the_row_under_error(tok):
    opd = [OpdRow(("ep1", 0), tuple(range(1, 11)), tuple(range(1, 15))), OpdRow(("ep1", 1), (1,) * 30, (1,) * 40)]
    contexts = [ExpertContext(("ep2", 0), (1,) * 12, {}), ExpertContext(("ep2", 3), (1,) * 33, {})]
    for rule in ("drop", "cut"):
        assert O.opd_rows(opd, 32, rule) == ([opd[0]], O.RowCounts(rule, 32, kept=1, dropped=1))
        assert O.expert_contexts(contexts, 32, rule) == ([contexts[0]], O.RowCounts(rule, 32, kept=1, dropped=1))
    with pytest.raises(D.DataError, match=r"episode 'ep1' decision 1: OPD prompts of 30 \(student\) and 40"):
        O.opd_rows(opd, 32, "error")
    with pytest.raises(D.DataError, match="episode 'ep2' decision 3: a DA-GRPO prompt of 33 tokens"):
        O.expert_contexts(contexts, 32, "error")
    sampling = SamplingConfig(max_new_tokens=8)
    source = sources.CombinedViews(
        sources.PackedSource([SeqRow((1, 2, 3), (Span(1, 2),))], 1, (16, 32), 0, _mesh(), "rwr"),
        sources.OpdSource(opd, tok, sampling, 1, (16, 32), _mesh(), overlong="cut"),
        sources.GroupSource(contexts, tok, sampling, 1, 2, (16, 32), dagrpo_reward(("search",)), _mesh()),
    )
    assert {k: (c.rule, c.kept, c.cut, c.dropped) for k, c in source.row_counts.items()} == {
        "rwr": ("drop", 1, 0, 0),
        "opd": ("cut", 1, 0, 1),
        "dagrpo": ("drop", 1, 0, 1),
    }


# ---- records examples ---------------------------------------------------------------------------------


def test_records_rules_on_decisions(tok, eps):
    exs = D.sft_examples(eps, tok)  # decision 0: prompt 34-36 + target 29-30; decision 1: prompt 78-81 + 29-30
    over = [ex for ex in exs if len(ex.views["policy"]) > 100]
    assert over and all(ex.key.endswith("/1") for ex in over)
    kept, counts = O.examples(exs, 100, 32, "drop")
    assert kept == [ex for ex in exs if ex not in over]
    assert counts == O.RowCounts("drop", 100, kept=len(kept), dropped=len(over), target_limit=32)
    kept, counts = O.examples(exs, 100, 32, "cut")
    assert (counts.kept, counts.cut, counts.dropped) == (len(exs) - len(over), len(over), 0)
    for ex, new in zip(exs, kept, strict=True):
        view, cut = ex.views["policy"], new.views["policy"]
        assert cut.prompt == view.prompt and cut.target == view.target[: 100 - len(view.prompt)]
        b = D.collate([new], ("policy",), (), 100, 32, pad_id=0)["policy"]
        n = len(cut.target)
        np.testing.assert_array_equal(b["tokens"][0][b["index"][0][:n] + 1], view.target[:n])
        assert b["index"][0][0] == len(view.prompt) - 1
    first = over[0].key.split("/")[0]
    prompt, target = (len(x) for x in (over[0].views["policy"].prompt, over[0].views["policy"].target))
    with pytest.raises(D.DataError, match=rf"episode '{first}' decision 1: .*prompt {prompt}, target {target}.*T=100"):
        O.examples(exs, 100, 32, "error")
    # A reserve (room for an on-policy resample) counts as target length; a prompt without that room is dropped.
    kept, counts = O.examples(exs, 100, 32, "cut", reserve=24)
    assert counts.dropped == sum(len(ex.views["policy"].prompt) + 24 > 100 for ex in exs) > 0


def test_records_cut_keeps_an_opd_pair_aligned_and_refuses_a_grpo_sample(tok, eps):
    p, target = tuple(range(10, 50)), tuple(range(100, 130))  # prompt 40, target 30
    hinted = p + (7,) * 15  # the teacher's prompt: s + H
    ex = D.Example("ep5/2", {"rwr": D.View(p, target), "student": D.View(p, target), "teacher": D.View(hinted, target)})
    (cut,), counts = O.examples([ex], 64, 32, "cut")
    assert counts.cut == 1 and cut.views["rwr"].target == target[:24]
    assert cut.views["student"].target == cut.views["teacher"].target == target[:9]  # the teacher's room
    b = D.collate([cut], ("student", "teacher"), (), 64, 32, pad_id=0)
    s, t = b["student"], b["teacher"]
    np.testing.assert_array_equal(s["tokens"][0][s["index"][0][:9] + 1], t["tokens"][0][t["index"][0][:9] + 1])
    (cut,), _ = O.examples([ex], 54, 32, "cut")  # the teacher's prompt (55) does not fit: the pair goes, RWR stays
    assert set(cut.views) == {"rwr"} and cut.views["rwr"].target == target[:14]
    samples = [{"token_ids": [5] * n, "logprobs": [-1.0] * n, "reward": float(n)} for n in (4, 40)]
    grpo = D.grpo_examples([{"key": "g", "context": eps[0].decisions[0].context, "samples": samples}], tok)
    with pytest.raises(ValueError, match="overlong='cut' cannot cut a GRPO sample.*'g/1'"):
        O.examples(grpo, 128, 32, "cut")
    assert O.examples(grpo, 128, 32, "drop")[0] == grpo[:1]


def test_record_source_raises_by_default_and_follows_its_rule(tok, eps):
    exs = D.sft_examples(eps, tok)
    args = dict(views=("policy",), scalars=(), micro_batch=4, accum_steps=1, pad_id=0, seed=0, mesh=_mesh())
    with pytest.raises(D.DataError, match=r"episode 'ep0' decision 1: .*prompt 79, target 30.*T=80.*'error'"):
        sources.RecordSource(exs, buckets=D.Buckets((64, 80), (32,)), **args)
    source = sources.RecordSource(exs, buckets=D.Buckets((64, 80), (32,)), overlong="drop", **args)
    n = sum(len(ex.views["policy"]) <= 80 for ex in exs)
    assert source.row_counts == {"records": O.RowCounts("drop", 80, n, 0, len(exs) - n, 32)}
    assert len(source.batches.examples) == n


def test_the_config_fields_check_their_values():
    c = tiny_data.config("/tmp/x")
    c.data.overlong = "trim"
    with pytest.raises(ConfigError, match="data.overlong"):
        tiny_data.typed(c)
    c.data.overlong, c.train.method.name = "cut", "grpo"
    with pytest.raises(ConfigError, match="data.overlong: 'cut' cannot cut a GRPO sample"):
        tiny_data.typed(c)
    c.train.method.name = "sft"
    assert tiny_data.typed(c).data.overlong == "cut"
    assert tiny_data.typed(tiny_data.config("/tmp/x")).data.overlong == "error"
    section = {"view": "dsl", "max_new_tokens": 8, "buckets": (64,), "max_len": 80}
    assert from_dict(PolicySection, section).overlong == "drop"
    with pytest.raises(ConfigError, match="overlong"):
        from_dict(PolicySection, section | {"overlong": "trim"})


def test_the_trainer_reports_the_counts_in_rows_json_and_a_line(tmp_path, eps, tok):
    c = tiny_data.config(tmp_path / "run", steps=1)
    c.data.buckets, c.data.overlong = (80,), "drop"
    stream = io.StringIO()
    examples = D.sft_examples(eps, tok)
    tiny_data.trainer(c, tiny_data.model(), examples, tokenizer=tok, stream=stream).run()
    n = sum(len(ex.views["policy"]) <= 80 for ex in examples)
    assert json.loads((tmp_path / "run" / O.ROWS_FILE).read_text()) == {
        "records": {"rule": "drop", "limit": 80, "kept": n, "cut": 0, "dropped": len(examples) - n, "target_limit": 32}
    }
    assert f"rows: records {n} kept, 0 cut, {len(examples) - n} dropped of {len(examples)} rows" in stream.getvalue()
    assert [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == [1]
