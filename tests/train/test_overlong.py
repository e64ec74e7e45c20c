"""Rows over the largest bucket: each `overlong` rule on each row kind, target tokens unmoved by a cut, the counts,
the error naming the row, and the defaults (sources drop; a records run and recorded GRPO groups raise)."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import jax
import numpy as np
import pytest
import tiny_data

from porch_jax.opod import rows as episode_rows
from porch_jax.opod.config import PolicySection
from porch_jax.opod.rewards import dagrpo_reward
from porch_jax.rows import records
from porch_jax.train import mesh as mesh_lib
from porch_jax.train import overlong as O
from porch_jax.train import sources
from porch_jax.train.config import SamplingConfig
from porch_jax.train.packing import (
    DataError,
    ExpertContext,
    OpdRow,
    RecordedGroup,
    RecordedSample,
    SeqRow,
    Span,
    seq_batch,
)
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
    n = int(b.target_mask[0].sum())
    return b.targets[0][:n], b.tokens[0][b.index[0][:n] + 1]


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
    assert b.count.sum() == 2 and b.weight[0][29:40].sum() == pytest.approx(1.0)  # still one decision
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
    with pytest.raises(DataError, match=r"episode 'ep0' decision 0: a row of 109 tokens .* \(64\)"):
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
    with pytest.raises(DataError, match="episode 'ep0' decision 0"):
        sources.PackedSource(rows + [packed], 2, (16, 32), 3, _mesh(), overlong="error")


# ---- OPD rows and DA-GRPO contexts: prompts only, never cut -----------------------------------------------


def test_opd_rows_and_expert_contexts_drop_under_cut_and_name_the_row_under_error(tok):
    opd = [OpdRow(("ep1", 0), tuple(range(1, 11)), tuple(range(1, 15))), OpdRow(("ep1", 1), (1,) * 30, (1,) * 40)]
    contexts = [ExpertContext(("ep2", 0), (1,) * 12, {}), ExpertContext(("ep2", 3), (1,) * 33, {})]
    for rule in ("drop", "cut"):
        assert O.opd_rows(opd, 32, rule) == ([opd[0]], O.RowCounts(rule, 32, kept=1, dropped=1))
        assert O.expert_contexts(contexts, 32, rule) == ([contexts[0]], O.RowCounts(rule, 32, kept=1, dropped=1))
    with pytest.raises(DataError, match=r"episode 'ep1' decision 1: OPD prompts of 30 \(student\) and 40"):
        O.opd_rows(opd, 32, "error")
    with pytest.raises(DataError, match="episode 'ep2' decision 3: a DA-GRPO prompt of 33 tokens"):
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


# ---- records: one-span decision rows and recorded GRPO groups --------------------------------------------


def test_one_span_decision_rows_under_each_rule(tok, eps):
    rows = records.decision_rows(eps, tok)  # decision 0: prompt 34-36 + target 29-30; decision 1: prompt 78-81 + 29-30
    over = [r for r in rows if len(r.tokens) > 100]
    assert over and all(r.key[1] == 1 for r in over)
    kept, counts = O.seq_rows(rows, 100, "drop")
    assert kept == [r for r in rows if r not in over]
    assert counts == O.RowCounts("drop", 100, kept=len(kept), cut=0, dropped=len(over))
    kept, counts = O.seq_rows(rows, 100, "cut")
    assert counts == O.RowCounts("cut", 100, kept=len(rows) - len(over), cut=len(over), dropped=0)
    for row, new in zip(rows, kept, strict=True):
        ((start, length, _),) = [dataclasses.astuple(s) for s in row.spans]
        if row not in over:
            assert new is row
            continue
        # The row keeps its first tokens: its whole prompt and the first target tokens, still one decision.
        assert new.key == row.key and new.tokens == row.tokens[:100]
        assert new.spans == (Span(start, 100 - start, 1.0),)
        targets, predicted = _targets(new)
        np.testing.assert_array_equal(targets, row.tokens[start:100])
        np.testing.assert_array_equal(predicted, targets)
        b = seq_batch([new], 100, 32)
        assert b.index[0][0] == start - 1 and b.count.sum() == 1
        assert b.weight[0].sum() == pytest.approx(1.0)
    first = over[0]
    with pytest.raises(
        DataError,
        match=rf"episode '{first.key[0]}' decision 1: a row of {len(first.tokens)} tokens exceeds the largest "
        r"bucket \(100\) \(overlong='error'",
    ):
        O.seq_rows(rows, 100, "error")
    # A prompt that does not fit leaves no target token: the row is dropped, never cut into its prompt.
    kept, counts = O.seq_rows(rows, 60, "cut")
    assert counts.dropped == sum(r.spans[0].start >= 60 for r in rows) > 0
    assert counts.cut == len(kept) and all(r.spans[0].start < 60 and len(r.tokens) == 60 for r in kept)


def _group(key: str, prompt: int, sizes: tuple[int, ...] = (3, 40)) -> RecordedGroup:
    """A recorded group with a `prompt`-token prompt and one sample of each size (rewarded by its length)."""
    samples = tuple(RecordedSample((5,) * n, (-1.0,) * n, float(n)) for n in sizes)
    return RecordedGroup(key, (1,) * prompt, samples)


def test_recorded_groups_follow_the_rule_on_their_prompt_and_cut_drops_the_group():
    groups = [_group("g0", 20), _group("g1", 33), _group("g2", 32)]
    for rule in ("drop", "cut"):
        kept, counts = O.recorded_groups(groups, 32, rule)
        assert kept == [groups[0], groups[2]] and counts == O.RowCounts(rule, 32, kept=2, cut=0, dropped=1)
        assert kept[0] is groups[0]  # a sample longer than the limit (40) is kept whole: it has its own room
    with pytest.raises(DataError, match=r"'g1': a GRPO group prompt of 33 tokens exceeds the largest bucket \(32\)"):
        O.recorded_groups(groups, 32, "error")


def test_recorded_groups_source_raises_by_default_and_refuses_groups_of_different_sizes():
    groups = [_group(f"g{i}", n) for i, n in enumerate((10, 12, 40, 14))]
    with pytest.raises(DataError, match=r"'g2': a GRPO group prompt of 40 tokens .*\(overlong='error'"):
        sources.RecordedGroups(groups, 2, (16, 32), 0, _mesh())
    source = sources.RecordedGroups(groups, 2, (16, 32), 0, _mesh(), overlong="cut")
    assert source.row_counts == {"grpo": O.RowCounts("cut", 32, kept=3, cut=0, dropped=1)}
    batch, _ = source(0, None)
    assert batch["policy"].tokens.shape[:2] == (1, 4) and batch["policy"].advantage.shape == (1, 4)
    odd = [_group("g0", 10), _group("g1", 10, sizes=(3, 4, 5))]
    with pytest.raises(DataError, match=r"GRPO group 'g1' has 3 samples, group 'g0' 2: recorded groups need one size"):
        sources.RecordedGroups(odd, 1, (32,), 0, _mesh())
    with pytest.raises(DataError, match=r"GRPO group 'g0' has 1 sample\(s\); advantages need at least 2"):
        sources.RecordedGroups([_group("g0", 10, sizes=(3,))], 1, (32,), 0, _mesh())


def test_the_config_fields_check_their_values():
    c = tiny_data.config("/tmp/x")
    c.data.overlong = "trim"
    with pytest.raises(ConfigError, match="data.overlong"):
        tiny_data.typed(c)
    c.data.overlong = "cut"
    assert tiny_data.typed(c).data.overlong == "cut"
    c.train.method.name = "grpo"  # nothing of a GRPO group is cut: "cut" drops a group whose prompt does not fit
    assert tiny_data.typed(c).data.overlong == "cut"
    assert tiny_data.typed(tiny_data.config("/tmp/x")).data.overlong == "error"
    section = {"view": "dsl", "max_new_tokens": 8, "buckets": (64,), "max_len": 80}
    assert from_dict(PolicySection, section).overlong == "drop"
    with pytest.raises(ConfigError, match="overlong"):
        from_dict(PolicySection, section | {"overlong": "trim"})


def _run_rows(c, rows, tok) -> tuple[dict, str]:
    """One step of a records run on `rows`: its WORKDIR/rows.json and its printed output."""
    stream = io.StringIO()
    tiny_data.trainer(c, tiny_data.model(), rows, tokenizer=tok, stream=stream).run()
    workdir = Path(c.workdir)
    assert [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()] == [1]
    return json.loads((workdir / O.ROWS_FILE).read_text()), stream.getvalue()


def test_the_trainer_reports_the_counts_in_rows_json_and_a_line(tmp_path, eps, tok):
    c = tiny_data.config(tmp_path / "run", steps=1)
    c.data.buckets, c.data.overlong = (80,), "drop"
    rows = records.decision_rows(eps, tok)
    counts, out = _run_rows(c, records.MethodRows(decisions=rows), tok)
    n = sum(len(r.tokens) <= 80 for r in rows)
    assert counts == {"policy": {"rule": "drop", "limit": 80, "kept": n, "cut": 0, "dropped": len(rows) - n}}
    assert f"rows: policy {n} kept, 0 cut, {len(rows) - n} dropped of {len(rows)} rows" in out


def test_a_grpo_records_run_reports_its_groups_counts(tmp_path, tok):
    c = tiny_data.config(tmp_path / "grpo", steps=1, method="grpo")
    c.data.buckets, c.data.overlong = (80,), "cut"
    groups = [_group(f"g{i}", 30 + i) for i in range(5)] + [_group("long", 81)]
    counts, out = _run_rows(c, records.MethodRows(groups=groups), tok)
    assert counts == {"grpo": {"rule": "cut", "limit": 80, "kept": 5, "cut": 0, "dropped": 1}}
    assert "rows: grpo 5 kept, 0 cut, 1 dropped of 6 rows" in out
