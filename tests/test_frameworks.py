"""The other two frameworks the paper trains beside POrchestra, in miniature (porch_jax/opod/experiment.py
`train_framework`): Orchestra-o1 and the lifecycle orchestrator each get SFT on their own expert's decisions, RWR on
their SFT policy's successful rollouts and DA-GRPO at their expert's contexts, through the same trainer and row format
as POrchestra's, and the results table reports them beside POrchestra's rows, with OPOD / OPD not applicable.

One tiny run holds both frameworks (module fixture). Its SFT rollouts and evaluation are played by the scripted expert
(`ExpertPolicy`), so RWR has successful rollouts to train on after a few SFT steps; the trained weights are checked
directly (target log-likelihood, parameters), with no weight decay, so a parameter that moved had a gradient."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from porch_jax.backends import ScriptedBackend
from porch_jax.envs.workplace import ScriptedExpert, codec
from porch_jax.models import from_pretrained
from porch_jax.opod import experiment
from porch_jax.opod import rows as episode_rows
from porch_jax.opod.config import NOT_APPLICABLE, ExperimentConfig
from porch_jax.protocol import parse_orchestrator_action
from porch_jax.rollout import system_config
from porch_jax.trajectories import TrajectoryStore
from porch_jax.typed_config import from_dict

FRAMEWORKS = ("orchestra_o1", "lifecycle")
pytestmark = pytest.mark.slow  # the stages of a tiny run: about 1-2 minutes on 2 cores


class ExpertPolicy:
    """A policy whose rollouts the scripted expert plays (what the experiment calls: `load(folder).backend(seed)`);
    it records the folders it was loaded from."""

    def __init__(self, cfg: ExperimentConfig):
        self.cfg, self.loaded = cfg, []

    def load(self, folder):
        self.loaded.append(Path(folder))
        return self

    def backend(self, seed=0):
        return ScriptedBackend(ScriptedExpert(self.cfg.suite.expert))


def tiny_config(run_dir: Path) -> ExperimentConfig:
    from experiments.quickstart import get_config

    c = get_config()
    assert set(c.frameworks) == set(FRAMEWORKS)  # the quickstart trains both beside POrchestra
    c.run_dir = str(run_dir)
    c.suite.mixture.templates = {"mail_text": 1.0, "history": 1.0}
    c.expert_rollouts.num_tasks, c.rollouts.num_tasks = 12, 8
    c.eval.tasks.num_tasks, c.eval.tasks.mixture = 3, None
    c.selection.enabled = False
    c.policy.buckets = (256,)
    c.model.hf.update(hidden_size=32, intermediate_size=64, num_hidden_layers=2, head_dim=8)
    c.optimizer.weight_decay = 0.0  # a parameter moves only with a gradient
    c.checkpoint.every, c.log.every = 100, 1
    c.sft.update(steps=150, batch=4, warmup_steps=1, hint_rows=0.0, empty_hint_rows=False)
    c.rwr.update(steps=2, batch=4, learning_rate=3e-4, warmup_steps=1, lr_grid=None, export_every=0)
    c.dagrpo.update(steps=2, learning_rate=3e-3, warmup_steps=1, lr_grid=None, export_every=0)
    c.dagrpo.group.update(contexts_per_step=4, group_size=4)
    for name in ("opod", "opd_empty"):
        c[name].lr_grid = None
    return from_dict(ExperimentConfig, c)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    cfg = tiny_config(tmp_path_factory.mktemp("frameworks") / "run")
    run = experiment.Run(cfg)
    init = experiment.init_model(run)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(init))
    policy = ExpertPolicy(cfg)
    scored: list[tuple[str, str, float]] = []
    real = experiment.dagrpo_reward

    def spy(tools, actions):  # DA-GRPO's reward as the experiment builds it, each call recorded
        reward = real(tools, actions)

        def call(context, text):
            r = reward(context, text)
            scored.append((tuple(actions), context.reference["name"], r))
            return r

        return call

    experiment.dagrpo_reward = spy
    try:
        out = {f: experiment.train_framework(run, f, init, tok, policy) for f in cfg.frameworks}
    finally:
        experiment.dagrpo_reward = real
    return run, init, tok, policy, out, scored


def target_logprob(folder: Path, rows) -> float:
    """The rows' target log-likelihood under the weights in `folder`, averaged within each decision then across them
    (as the SFT and RWR losses are), in one right-padded batch."""
    width = max(len(r.tokens) for r in rows)
    ids = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        ids[i, : len(r.tokens)] = r.tokens
    mask = np.arange(width)[None, :] < np.asarray([len(r.tokens) for r in rows])[:, None]
    lp = np.asarray(jax.nn.log_softmax(from_pretrained(folder)(jnp.asarray(ids), attention_mask=jnp.asarray(mask))))
    means = [
        np.mean([lp[i, s.start - 1 + j, r.tokens[s.start + j]] for j in range(s.length)])
        for i, r in enumerate(rows)
        for s in r.spans
    ]
    return float(np.mean(means))


def params(folder: Path) -> np.ndarray:
    from flax import nnx

    return np.concatenate([np.ravel(x) for x in jax.tree.leaves(nnx.state(from_pretrained(folder), nnx.Param))])


def decoded_targets(episodes, tok, view: str, max_len: int) -> list[dict]:
    """Each target span of the episodes' packed rows (the SFT rows) decoded back into a protocol call against its
    decision's recorded context, beside the recorded action."""
    out = []
    for ep in episodes:
        valid = [d for d in ep.decisions if d.action is not None]
        rows = episode_rows.pack_episode(ep, tok, view, 1.0, max_len)
        spans = [(row, s) for row in rows for s in row.spans]
        assert all(len(row.tokens) <= max_len for row in rows) and len(spans) == len(valid)
        for (row, s), d in zip(spans, valid, strict=True):
            dsl = tok.decode(list(row.tokens[s.start : s.start + s.length - 1]))
            out.append(codec.decode_call(dsl, codec.state_of(d.context)) | {"recorded": d.action})
    return out


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_sft_rwr_and_dagrpo_train_each_framework_through_the_same_trainer(trained, framework):
    run, init, tok, policy, out, scored = trained
    cfg = run.cfg
    exports, skipped = out[framework]
    assert set(exports) == {f"sft@{framework}", f"rwr@{framework}", f"dagrpo@{framework}"} and not skipped
    actions = set(system_config(framework).prompt_actions)

    # SFT: the framework's own expert decisions (its action set, joined subtasks included), learnt
    expert = TrajectoryStore(run / framework / "expert.jsonl").read()
    assert {e.system for e in expert} == {"expert"} and len(expert) == cfg.expert_rollouts.num_tasks
    rows = episode_rows.packed_rows(expert, tok, cfg.policy.view, max(cfg.policy.buckets))
    targets = decoded_targets(expert, tok, cfg.policy.view, max(cfg.policy.buckets))
    assert all(t["name"] == t["recorded"]["name"] for t in targets)
    assert {t["name"] for t in targets} <= actions
    if framework == "orchestra_o1":  # delegate_all with its subtasks, each its recorded harness
        joined = [t for t in targets if t["name"] == "delegate_all"]
        assert joined and any(len(t["arguments"]["subtasks"]) > 1 for t in joined)
        for t in joined:
            assert [(s["tools"], s["budget"]) for s in t["arguments"]["subtasks"]] == [
                (sorted(s["tools"]), s["budget"]) for s in t["recorded"]["arguments"]["subtasks"]
            ]
    else:  # lifecycle: one delegation at a time; sub-agents only submit, so nothing to revise or stop
        assert {t["name"] for t in targets} == {"delegate", "finish"}
    sft = exports[f"sft@{framework}"][cfg.sft.learning_rate]
    assert sft == run / framework / "sft" / "export"
    assert target_logprob(sft, rows[:8]) > target_logprob(init, rows[:8]) + 0.5

    # RWR: its SFT policy's rollouts under its own engine, the successful ones, from the SFT weights
    rollouts = TrajectoryStore(run / framework / "rollouts.jsonl").read()
    assert sft in policy.loaded and {e.system for e in rollouts} == {f"sft@{framework}"}
    assert {d.action["name"] for e in rollouts for d in e.decisions if d.action} <= actions
    won = [e for e in rollouts if e.outcome.success]
    rwr_rows = episode_rows.packed_rows(won, tok, cfg.policy.view, max(cfg.policy.buckets))
    assert won and rwr_rows
    rwr = exports[f"rwr@{framework}"][cfg.rwr.learning_rate]
    assert target_logprob(rwr, rwr_rows) > target_logprob(sft, rwr_rows)
    steps = [json.loads(line) for line in (run / framework / "rwr" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps if "loss" in m][-1] == cfg.rwr.steps

    # DA-GRPO: samples at its expert's contexts, scored against its expert's actions under its action set
    mine = [s for s in scored if set(s[0]) == actions]
    assert len(mine) == cfg.dagrpo.steps * cfg.dagrpo.group.contexts_per_step * cfg.dagrpo.group.group_size
    assert {name for _, name, _ in mine} <= actions and len({r for *_, r in mine}) > 1  # rewards that differ
    dagrpo = exports[f"dagrpo@{framework}"][cfg.dagrpo.learning_rate]
    assert not np.array_equal(params(dagrpo), params(sft))  # a gradient moved it, from the SFT weights
    metrics = [json.loads(line) for line in (run / framework / "dagrpo" / "metrics.jsonl").read_text().splitlines()]
    assert all("reward" in m for m in metrics if "loss" in m)


def test_the_results_table_reports_the_frameworks_beside_porchestra(trained):
    """Each framework's policies evaluated on the same held-out tasks under its own engine; results.md/json have
    their rows beside POrchestra's, and OPOD / OPD as not applicable to them, with why."""
    run, init, tok, policy, out, _ = trained
    exports = {"sft": {run.cfg.sft.learning_rate: init}}  # POrchestra's row (a stand-in folder: the expert plays)
    for f in FRAMEWORKS:
        exports |= out[f][0]
    experiment.evaluate_and_report(run, policy, exports, {})
    table = (run / "results.md").read_text()
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    names = [line.split("|")[1].strip() for line in lines[1:]]
    assert names[0] == "sft"
    for f in FRAMEWORKS:
        assert {f"sft@{f}", f"rwr@{f}", f"dagrpo@{f}"} <= set(names)
        for m in ("opod", "opd_empty"):
            assert f"| {m}@{f} | - | not applicable: {NOT_APPLICABLE} |" in table
        assert f"rwr@{f} - sft@{f}: paired" in table and f"sft - sft@{f}: paired" in table
        records = TrajectoryStore(run / "eval" / f / "rwr.jsonl").read()  # played under the framework's engine
        assert len(records) == run.cfg.eval.tasks.num_tasks
        assert {e.task_id for e in records} == {e.task_id for e in TrajectoryStore(run / "eval" / "sft.jsonl").read()}
        called = {d.action["name"] for e in records for d in e.decisions if d.action}
        assert called <= set(system_config(f).prompt_actions) and (f != "orchestra_o1" or "delegate_all" in called)
        for e in records:
            for d in e.decisions:  # every action valid under the framework's own action set
                if d.action:
                    parse_orchestrator_action(d.action_text, actions=system_config(f).prompt_actions)
    assert "OPOD and OPD need mid-run feedback" in table
    results = json.loads((run / "results.json").read_text())
    assert {m["system"] for m in results["methods"]} == set(exports)
    assert set(results["not_applicable"]) == {f"{m}@{f}" for f in FRAMEWORKS for m in ("opod", "opd_empty")}
