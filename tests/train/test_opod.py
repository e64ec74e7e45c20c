"""OPOD trainer: packing is exact, losses average within then across decisions, λ = 0 reproduces
RWR, the teacher stays at the initial (SFT) weights while the student learns, a killed run resumes
to the same weights, and DA-GRPO's reward weights."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from porch_jax.attribution.judge import follow_hint
from porch_jax.envs.views import POLICY_FILE, selection_candidates, write_policy_file
from porch_jax.envs.workplace import TOOLS, TaskMixture, codec
from porch_jax.eval import suite as suite_lib
from porch_jax.eval.suite import SuiteConfig, TaskSet
from porch_jax.models import from_pretrained
from porch_jax.models.tiny import make_tiny_model
from porch_jax.opod import rows as episode_rows
from porch_jax.opod.rewards import decision_reward
from porch_jax.protocol import render_call
from porch_jax.rows.decisions import decision_target
from porch_jax.train import mesh as mesh_lib
from porch_jax.train import packing, sources
from porch_jax.train.config import CheckpointConfig, LogConfig, OptimizerConfig, SamplingConfig, TrainConfig
from porch_jax.train.methods import MethodConfig, make_method
from porch_jax.train.trainer import Trainer

SUITE = SuiteConfig(
    max_decisions=20,
    max_evidence_chars=160,
    mixture=TaskMixture(templates={"history": 1.0, "mail_text": 1.0}, p_change=0.0, p_distract=0.0, slack=(1, 3)),
)
TINY = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    initializer_range=0.05,
)
BUCKETS = (512,)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", **TINY)
    (folder / POLICY_FILE).write_text(json.dumps({"view": "compact"}))
    return folder


@pytest.fixture(scope="module")
def tok(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def episodes():
    """Expert episodes cut to their first three decisions (rows within 512 tokens: quick to compile)."""
    engine = suite_lib.expert_engine(SUITE)
    tasks = suite_lib.task_set(TaskSet(6, 0), SUITE)

    async def run():
        return [await engine.run(t, episode_id=t.task_id) for t in tasks]

    return [dataclasses.replace(ep, decisions=ep.decisions[:3]) for ep in asyncio.run(run())]


def _logps(model, tokens):
    logits = model(jnp.asarray([tokens], jnp.int32))[0]
    return np.asarray(jax.nn.log_softmax(logits, axis=-1))


def test_packing_keeps_every_decision_under_its_own_context(tok, episodes, model_dir):
    """Each span's tokens and left context equal the decision's own prompt + target, and the
    packed row's per-decision mean losses equal those of separate rows (full logits, no gather)."""
    ep = episodes[0]
    rows = episode_rows.pack_episode(ep, tok, "compact", 1.0, 512)
    valid = [d for d in ep.decisions if d.action is not None]
    spans = [(r, s) for r in rows for s in r.spans]
    assert len(spans) == len(valid) and len(rows) < len(valid)
    model = from_pretrained(model_dir)
    for (row, span), d in zip(spans, valid, strict=False):
        prompt = episode_rows.policy_prompt(tok, d.context, "compact")
        target = decision_target(tok, d)
        assert (
            list(row.tokens[: span.start]) == prompt
            and list(row.tokens[span.start : span.start + span.length]) == target
        )
    row = rows[0]
    lp = _logps(model, row.tokens)
    for span, d in zip(row.spans, valid, strict=False):
        seq = episode_rows.policy_prompt(tok, d.context, "compact") + decision_target(tok, d)
        alone = _logps(model, seq)
        p = span.start
        packed = [lp[p - 1 + j, row.tokens[p + j]] for j in range(span.length)]
        single = [alone[p - 1 + j, seq[p + j]] for j in range(span.length)]
        np.testing.assert_allclose(packed, single, rtol=2e-4, atol=2e-4)


def test_losses_average_within_each_decision_then_across(tok, episodes, model_dir):
    rows = episode_rows.packed_rows(episodes[:3], tok, "compact", 512, weight=lambda ep: 1.0)
    batch = packing.seq_batch(rows, 512, 256)
    model = from_pretrained(model_dir)
    method = make_method(MethodConfig(name="sft"))
    parts, _ = method.micro_parts(model, None, {"policy": jax.tree.map(jnp.asarray, batch)})
    total, count = map(float, parts["ce"])
    means = []
    for row in rows:
        lp = _logps(model, row.tokens)
        means += [-np.mean([lp[s.start - 1 + j, row.tokens[s.start + j]] for j in range(s.length)]) for s in row.spans]
    assert count == len(means) == sum(len(r.spans) for r in rows)
    assert total / count == pytest.approx(np.mean(means), rel=1e-4)


MESH = None


def _mesh():
    global MESH
    MESH = MESH or mesh_lib.make_mesh((1, 1, 1))
    return MESH


def _cfg(steps=3, *, method="rwr", learning_rate=1e-3, opd_weight=1.0, export_every=0):
    return TrainConfig(
        steps=steps,
        optimizer=OptimizerConfig(learning_rate=learning_rate, warmup_steps=1, final_lr_ratio=0.1, weight_decay=0.0),
        method=MethodConfig(name=method, opd_weight=opd_weight),
        checkpoint=CheckpointConfig(every=2, keep=1, async_save=False),
        log=LogConfig(every=100),
        export_every=export_every,
    )


def _trainer(model_dir, workdir, cfg, source, tok):
    model = from_pretrained(model_dir)
    return Trainer(
        cfg,
        model,
        make_method(cfg.method),
        source,
        workdir,
        tokenizer=tok,
        on_export=lambda folder, step: write_policy_file(folder, "compact", step),
        stream=io.StringIO(),
    )


def _opd_source(rows, tok):
    return sources.OpdSource(rows, tok, SamplingConfig(max_new_tokens=16, seed=5), 2, BUCKETS, _mesh())


def _packed(rows, seed=0, view="policy"):
    return sources.PackedSource(rows, 2, BUCKETS, seed, _mesh(), view)


def _hints(episodes):
    return {
        (ep.episode_id, d.index): "add archive to tools"
        for ep in episodes
        for d in ep.decisions[:2]
        if d.action is not None
    }


def _params(trainer):
    return jax.tree.map(np.asarray, trainer.state["params"])


def test_opod_at_lambda_zero_reproduces_rwr(tmp_path, tok, episodes, model_dir):
    rows = episode_rows.packed_rows(episodes, tok, "compact", 512)
    rwr = _trainer(model_dir, tmp_path / "rwr", _cfg(), _packed(rows), tok)
    rwr.run()
    source = sources.CombinedViews(
        _packed(rows, view="rwr"), _opd_source(episode_rows.opd_rows(episodes, _hints(episodes), tok, "compact"), tok)
    )
    zero = _trainer(model_dir, tmp_path / "opod0", _cfg(method="opod", opd_weight=0.0), source, tok)
    history = zero.run().history
    assert all(m["opd"] > 0 and m["opd_count"] == 2 for m in history)  # OPD was computed, with weight 0
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), _params(rwr), _params(zero))
    assert (tmp_path / "opod0" / "export" / POLICY_FILE).is_file()


def test_teacher_stays_at_the_initial_weights_and_opd_moves_the_student_toward_it(tmp_path, tok, episodes, model_dir):
    initial = jax.tree.map(np.asarray, nnx.state(from_pretrained(model_dir), nnx.Param))
    rows = episode_rows.opd_rows(episodes, _hints(episodes), tok, "compact")
    cfg = _cfg(steps=4, method="opd", learning_rate=3e-3, opd_weight=1.0)  # OPOD without RWR rows trains as OPD
    trainer = _trainer(model_dir, tmp_path / "opd", cfg, sources.CombinedViews(_opd_source(rows, tok)), tok)
    history = trainer.run().history
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, trainer.frozen), initial)
    moved = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), _params(trainer), initial)
    assert max(jax.tree.leaves(moved)) > 0
    assert all("rwr" not in m and m["logprob_gap"] < 1e-3 for m in history)  # sampler and trainer agree


class _DiesAt3(sources.BatchSource):
    def __init__(self, source):
        self.source, self.views = source, source.views

    def __call__(self, step, student):
        if step == 3:
            raise KeyboardInterrupt
        return self.source(step, student)


def test_a_killed_run_resumes_to_the_same_weights(tmp_path, tok, episodes, model_dir):
    rows = episode_rows.packed_rows(episodes, tok, "compact", 512)
    full = _trainer(model_dir, tmp_path / "full", _cfg(steps=4), _packed(rows, 7), tok)
    full.run()
    with pytest.raises(KeyboardInterrupt):
        _trainer(model_dir, tmp_path / "cut", _cfg(steps=4), _DiesAt3(_packed(rows, 7)), tok).run()
    resumed = _trainer(model_dir, tmp_path / "cut", _cfg(steps=4), _packed(rows, 7), tok)
    assert resumed.start_step == 2
    resumed.run()
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), _params(full), _params(resumed))
    steps = [json.loads(line)["step"] for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


def test_export_every_leaves_the_selection_candidates(tmp_path, tok, episodes, model_dir):
    rows = episode_rows.packed_rows(episodes, tok, "compact", 512)
    trainer = _trainer(model_dir, tmp_path / "rwr", _cfg(steps=3, export_every=2), _packed(rows), tok)
    trainer.run()
    exports = tmp_path / "rwr" / "exports"
    assert sorted(p.name for p in exports.iterdir()) == ["step_2"]  # every 2 steps; the last is the final export
    assert selection_candidates(trainer.export_dir) == {2: exports / "step_2", 3: trainer.export_dir}
    assert json.loads((trainer.export_dir / POLICY_FILE).read_text())["step"] == 3
    final = jax.tree.map(np.asarray, nnx.state(from_pretrained(trainer.export_dir), nnx.Param))
    earlier = jax.tree.map(np.asarray, nnx.state(from_pretrained(exports / "step_2"), nnx.Param))
    assert max(jax.tree.leaves(jax.tree.map(lambda a, b: float(np.abs(a - b).max()), earlier, final))) > 0


def test_hint_following_rows_put_the_corrected_action_after_the_hint(tok, episodes):
    hints = _hints(episodes)
    rows = episode_rows.hint_following_rows(episodes, hints, tok, "compact", follow_hint)
    assert rows
    text = tok.decode(list(rows[0].tokens))
    assert "Hint: add archive to tools" in text and '"archive"' in tok.decode(
        list(rows[0].tokens[rows[0].spans[0].start :])
    )


def test_hint_following_reads_each_teacher_context(tok, episodes):
    """The check's rates come from the prompts it builds (a sampler that follows exactly the hint in its prompt gives
    teacher 1 and the controls 0), one sampler call per context (the sampler bounds each forward: test_sampler)."""
    from porch_jax.models.sampler import Completion
    from porch_jax.opod.diagnostics import hint_following

    hints = {
        (ep.episode_id, d.index): f"set budget to {10 + i}"
        for i, (ep, d) in enumerate((ep, d) for ep in episodes for d in ep.decisions if d.action is not None)
    }
    targets = {
        h: tok.decode(episode_rows.action_tokens(tok, follow_hint(d.action, h), d.context, "compact")[:-1])
        for ep in episodes
        for d in ep.decisions
        if (h := hints.get((ep.episode_id, d.index)))
    }

    class Follows:
        tokenizer, prompt_buckets, calls = tok, (4096,), []

        def generate(self, prompts, params):
            self.calls.append(len(prompts))
            texts = [tok.decode(p) for p in prompts]
            return [
                Completion([], [], next((t for h, t in targets.items() if f"{h}<" in text), "no action"), "stop")
                for text in texts
            ]

    sampler = Follows()
    rates = hint_following(sampler, episodes, hints, "compact", follow_hint)
    assert rates["n"] == len(hints) > 4
    assert rates["teacher"] == 1.0
    assert rates["student"] == rates["teacher_empty_hint"] == rates["teacher_wrong_hint"] == 0.0
    assert sampler.calls == [len(hints)] * 4


def test_dagrpo_reward_weights():
    ref = {"name": "delegate", "arguments": {"subgoal": "find x", "context": [], "tools": ["search"], "budget": 4}}
    assert decision_reward(render_call(ref), ref, TOOLS)["reward"] == pytest.approx(1.0)
    near = {"name": "delegate", "arguments": {**ref["arguments"], "budget": 2}}
    assert decision_reward(render_call(near), ref, TOOLS)["reward"] == pytest.approx(0.4 + 0.6 * (3.5 / 4))
    other = {"name": "finish", "arguments": {"answer": "done"}}
    assert decision_reward(render_call(other), ref, TOOLS)["reward"] == pytest.approx(0.2)
    bad_tool = {"name": "delegate", "arguments": {**ref["arguments"], "tools": ["teleport"]}}
    assert decision_reward(render_call(bad_tool), ref, TOOLS)["validity"] == 0.0
    assert decision_reward("<tool_call>{not json", ref, TOOLS)["reward"] == 0.0


def test_dagrpo_reward_scores_a_delegate_all_decision_subtask_by_subtask():
    """Orchestra-o1's decisions: valid only under its action set, each subtask scored as a delegation (paired by
    subgoal, in any order), a missing or extra subtask scoring 0."""
    a = {"subgoal": "find x", "context": [], "tools": ["search"], "budget": 4}
    b = {"subgoal": "find y", "context": ["k: v"], "tools": ["mail"], "budget": 2}
    ref = {"name": "delegate_all", "arguments": {"subtasks": [a, b]}}
    o1 = ("delegate_all", "finish")
    assert decision_reward(render_call(ref), ref, TOOLS, o1)["reward"] == pytest.approx(1.0)
    assert decision_reward(render_call(ref), ref, TOOLS)["validity"] == 0.0  # not one of POrchestra's actions
    swapped = {"name": "delegate_all", "arguments": {"subtasks": [b, a]}}
    assert decision_reward(render_call(swapped), ref, TOOLS, o1)["reward"] == pytest.approx(1.0)
    one = {"name": "delegate_all", "arguments": {"subtasks": [a]}}
    assert decision_reward(render_call(one), ref, TOOLS, o1)["reward"] == pytest.approx(0.4 + 0.6 * 0.5)
    tight = {"name": "delegate_all", "arguments": {"subtasks": [a, {**b, "budget": 1, "context": []}]}}
    assert decision_reward(render_call(tight), ref, TOOLS, o1)["quality"] == pytest.approx(
        (1 + (1 + 0 + 1 + 0.5) / 4) / 2
    )
    single = {"name": "delegate", "arguments": a}  # a different action: format and validity at most
    assert decision_reward(render_call(single), ref, TOOLS, o1)["reward"] == pytest.approx(0.1)


def test_dsl_view_trains_on_compact_actions_and_hint_rows(tok, episodes):
    """The miniature's "dsl" view: packed rows hold the compact actions (not the stored JSON), every
    target still follows its own context, hint rows put the corrected compact action after the hint,
    and DA-GRPO contexts decode a compact sample before scoring it against the expert's action."""

    rows = episode_rows.packed_rows(episodes, tok, "dsl", 512)
    first = episodes[0].decisions[0]
    target = tok.decode(list(rows[0].tokens[rows[0].spans[0].start :][: rows[0].spans[0].length - 1]))
    assert target == codec.encode_action(first.action, first.context) and "<tool_call>" not in target
    for row in rows:
        for s in row.spans:
            assert row.tokens[s.start + s.length - 1] == tok.eos_token_id
    hints = _hints(episodes)
    hinted = episode_rows.hint_following_rows(episodes, hints, tok, "dsl", follow_hint)
    assert hinted and "hint tools+archive" in tok.decode(list(hinted[0].tokens))
    assert "tools=archive" in tok.decode(list(hinted[0].tokens[hinted[0].spans[0].start :]))
    ctx = episode_rows.expert_contexts(episodes, tok, "dsl")[0]
    dsl = codec.encode_action(ctx.reference, first.context)
    assert decision_reward(ctx.decode(dsl), ctx.reference, TOOLS)["reward"] == pytest.approx(1.0)
    assert decision_reward(ctx.decode("delegate c9"), ctx.reference, TOOLS)["reward"] < 1.0


def test_empty_hint_rows_keep_the_action_on_the_same_decisions(tok, episodes):
    hints = _hints(episodes)
    hinted = episode_rows.hint_following_rows(episodes, hints, tok, "dsl", follow_hint)
    empty = episode_rows.empty_hint_rows(episodes, hints, tok, "dsl", follow_hint)
    assert len(empty) == len(hinted)
    first = next(d for d in episodes[0].decisions if d.action is not None)
    text = tok.decode(list(empty[0].tokens))
    assert text.removesuffix("<|im_end|>").endswith(codec.encode_action(first.action, first.context))
    assert "hint<|im_end|>" in text and "hint tools" not in text


def test_opd_distils_only_samples_that_are_actions(tok, episodes, model_dir):
    """A sampled reply that is no action (OpdRow.is_action False) scores no token and counts no decision."""
    model = from_pretrained(model_dir)
    rows = episode_rows.opd_rows(episodes, _hints(episodes), tok, "compact")
    seen = []

    def only_first(text):  # the first sample of each batch counts as an action, the rest not
        seen.append(text)
        return len(seen) % 2 == 1

    def batch(check):
        source = _opd_source([dataclasses.replace(r, is_action=check) for r in rows], tok)
        return source.host(0, model)

    (full, full_stats), (half, half_stats) = batch(None), batch(only_first)
    assert float(full["student"].count.sum()) == 2 and full_stats["sampled_not_action"] == 0.0
    assert float(half["student"].count.sum()) == 1 and float(half["teacher"].count.sum()) == 1
    assert half_stats["sampled_not_action"] == 0.5 and len(seen) == 2
    assert not half["student"].target_mask[1].any() and not half["teacher"].target_mask[1].any()
    assert half["student"].target_mask[0].sum() == full["student"].target_mask[0].sum() > 0  # same sample


def test_fewer_opd_rows_than_the_batch_fill_it_with_rows_that_score_nothing(tok, episodes, model_dir):
    """3 OPD rows in a batch of 4 over 2 accumulation steps: [2, 2, ...], the fourth row without a target."""
    model = from_pretrained(model_dir)
    rows = episode_rows.opd_rows(episodes, _hints(episodes), tok, "compact")[:3]
    source = sources.OpdSource(rows, tok, SamplingConfig(max_new_tokens=8, seed=5), 4, BUCKETS, _mesh(), accum_steps=2)
    batch, _ = source(0, model)
    student, teacher = batch["student"], batch["teacher"]
    assert student.tokens.shape[:2] == teacher.tokens.shape[:2] == (2, 2)
    assert np.asarray(student.count).tolist() == [[1, 1], [1, 0]]
    assert not np.asarray(teacher.target_mask)[1, 1].any() and np.asarray(teacher.target_mask)[1, 0].any()


def test_wrong_hints_give_each_flagged_decision_another_decisions_hint():
    hints = {("e1", 0): "add archive to tools", ("e1", 2): "set budget to 7", ("e2", 1): "add archive to tools",
             ("e3", 4): "add 'phone of Ana: 1' to context"}  # fmt: skip
    wrong = episode_rows.wrong_hints(hints, seed=3)
    assert wrong.keys() == hints.keys() and all(wrong[k] != hints[k] for k in hints)
    assert set(wrong.values()) <= set(hints.values())  # drawn from the other flagged decisions' hints
    assert episode_rows.wrong_hints(hints, seed=3) == wrong  # seeded
    assert episode_rows.wrong_hints({("e", 0): "x", ("f", 1): "x"}, seed=0) == {}  # no other hint to draw


def test_the_validation_loss_is_the_methods_loss_at_the_current_weights(tmp_path, tok, episodes, model_dir):
    """Validation batches fixed once: the loss logged at step 0 (the initial weights) on the batch step 1 trains on
    is step 1's own loss (computed before its update); over several batches it is their parts' pooled mean."""
    rows = episode_rows.packed_rows(episodes, tok, "compact", 512)
    source = _packed(rows)
    first, second = source(1, None)[0], source(2, None)[0]
    cfg = _cfg(steps=4, method="rwr")
    model = from_pretrained(model_dir)
    trainer = Trainer(
        cfg, model, make_method(cfg.method), _packed(rows), tmp_path / "v", tokenizer=tok,
        stream=io.StringIO(), validation=[first], validate_every=2,
    )  # fmt: skip
    history = trainer.run().history
    logged = [json.loads(line) for line in (tmp_path / "v" / "metrics.jsonl").read_text().splitlines()]
    assert history[0]["loss"] > 0 and logged[0] == {"step": 0, "val_loss": pytest.approx(history[0]["loss"], rel=1e-6)}
    assert [m["step"] for m in logged if "val_loss" in m] == [0, 2, 4]
    assert logged[-1]["val_loss"] == pytest.approx(trainer.validation_loss(), rel=1e-6)
    trainer.validation = [first, second]
    parts = [jax.device_get(trainer.step_fn.parts(trainer.state["params"], b)["rwr"]) for b in (first, second)]
    pooled = (parts[0][0] + parts[1][0]) / (parts[0][1] + parts[1][1])
    assert trainer.validation_loss() == pytest.approx(float(pooled), rel=1e-6)
    with pytest.raises(ValueError, match="validate_every"):
        Trainer(cfg, model, make_method(cfg.method), source, None, validation=[first])
