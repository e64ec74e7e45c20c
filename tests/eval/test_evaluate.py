"""Evaluation reads only the exported folder: a fresh subprocess given the folder's path records the
same episodes as the in-process evaluation; another folder's weights give other actions; swapping
weights into a loaded policy equals loading the folder fresh."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from porch_jax.envs.views import POLICY_FILE
from porch_jax.eval import suite as suite_lib
from porch_jax.eval.evaluate import evaluate, load_config
from porch_jax.eval.policy import load_policy
from porch_jax.eval.suite import EvalConfig, SuiteConfig
from porch_jax.models.tiny import make_tiny_model
from porch_jax.typed_config import from_dict

TINY = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    initializer_range=0.5,
)  # large init: random weights that emit varied tokens

CONFIG = textwrap.dedent("""
    from ml_collections import ConfigDict

    def get_config():
        c = ConfigDict()
        c.suite = ConfigDict({"mixture": {"templates": {"mail_text": 1.0}, "p_change": 0.0, "p_distract": 0.0},
                              "expert": {}, "subagent": {}, "max_decisions": 2, "max_evidence_chars": 160})
        c.eval = ConfigDict({"tasks": {"num_tasks": 3, "seed_start": 500, "prefix": "heldout"},
                             "temperature": 1.0, "max_tokens": 8, "concurrency": 3, "seed": 11})
        c.policy = ConfigDict({"max_len": 1024, "buckets": (1024,)})
        return c
""")


def _folder(path, seed):
    folder = make_tiny_model(path, seed=seed, **TINY)
    (folder / POLICY_FILE).write_text(json.dumps({"view": "compact"}))
    return folder


def _actions(records):
    return {r.episode_id: ([d.action_text for d in r.decisions], r.outcome.reason) for r in records}


@pytest.mark.slow
def test_a_fresh_process_reproduces_the_evaluation_from_the_folder_alone(tmp_path):
    folder, other = _folder(tmp_path / "a", 0), _folder(tmp_path / "b", 1)
    (tmp_path / "exp.py").write_text(CONFIG)
    cfg = load_config(tmp_path / "exp.py")
    suite, eval_cfg = from_dict(SuiteConfig, cfg.suite), from_dict(EvalConfig, cfg.eval)
    tasks = suite_lib.task_set(eval_cfg.tasks, suite)
    policy = load_policy(folder, max_len=1024, prompt_buckets=(1024,))
    mine = evaluate(policy, tasks, tmp_path / "in_process.jsonl", suite, eval_cfg, "eval")
    assert len(mine) == 3 and all(r.decisions and r.decisions[0].action_token_ids for r in mine)

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "porch_jax.eval.evaluate",
            f"--policy={folder}",
            f"--config={tmp_path / 'exp.py'}",
            f"--out={tmp_path / 'fresh.jsonl'}",
            "--name=eval",
        ],
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    from porch_jax.trajectories import TrajectoryStore

    fresh = TrajectoryStore(tmp_path / "fresh.jsonl").read()
    assert _actions(fresh) == _actions(mine)

    swapped = evaluate(policy.load(other), tasks, tmp_path / "other.jsonl", suite, eval_cfg, "eval")
    assert _actions(swapped) != _actions(mine)  # the weights come from the folder
    loaded = evaluate(
        load_policy(other, max_len=1024, prompt_buckets=(1024,)),
        tasks,
        tmp_path / "other2.jsonl",
        suite,
        eval_cfg,
        "eval",
    )
    assert _actions(loaded) == _actions(swapped)


def test_a_folder_of_another_architecture_is_refused(tmp_path):
    policy = load_policy(_folder(tmp_path / "a", 0), max_len=1024, prompt_buckets=(1024,))
    bigger = make_tiny_model(tmp_path / "c", **{**TINY, "hidden_size": 64, "head_dim": 16})
    (bigger / POLICY_FILE).write_text(json.dumps({"view": "compact"}))
    with pytest.raises(ValueError, match="different architecture"):
        policy.load(bigger)
    with pytest.raises(FileNotFoundError):
        load_policy(tmp_path / "missing")
