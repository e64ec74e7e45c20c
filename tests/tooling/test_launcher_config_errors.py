"""Every launcher in launch/ rejects an unknown key (or flag) and a bad value while absl parses the command line:
a nonzero exit, stderr naming the key, and no traceback. Each case fails before any model or data work, so the
whole file costs one interpreter start (and the launcher's imports) per case."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
LAUNCHERS = {p.stem for p in (REPO / "launch").glob("*.py") if p.stem != "__init__"}

SERVE_CONFIG = """
from ml_collections import ConfigDict

from porch_jax.serving import ServerConfig


def get_config():
    return ConfigDict({"serve": ServerConfig.config_dict()})
"""


def _cases(tmp: pathlib.Path) -> dict[str, list[tuple[str, list[str], str]]]:
    """launcher -> [(case, argv, what stderr must name)]; every launcher has an unknown-key and a bad-value case."""
    run = f"--config.run_dir={tmp / 'run'}"
    serve = ["--model_dir=/nonexistent", "--api_key=k", f"--config={tmp / 'serve_config.py'}"]
    return {
        "train": [
            (
                "unknown",
                ["--config=experiments/sft_tiny.py", "--config.train.nonexistent_key=3"],
                "config.train.nonexistent_key",
            ),
            ("bad", ["--config=experiments/sft_tiny.py", "--config.train.method.name=ppo"], "config.train.method.name"),
        ],
        "pipeline": [
            (
                "unknown",
                ["--config=experiments/quickstart.py", run, "--config.opod.nonexistent_key=3"],
                "config.opod.nonexistent_key",
            ),
            ("bad", ["--config=experiments/quickstart.py", run, "--config.rwr.steps=0"], "config.rwr.steps"),
        ],
        "export": [
            ("unknown", [f"--run_dir={tmp}", f"--out={tmp / 'x'}", "--nonexistent_flag=3"], "nonexistent_flag"),
            ("bad", [f"--run_dir={tmp}", f"--out={tmp / 'x'}", "--step=abc"], "--step"),
        ],
        "maca": [
            (
                "unknown",
                ["--config=experiments/maca_synthetic.py", run, "--config.nonexistent_key=3"],
                "config.nonexistent_key",
            ),
            (
                "unknown_deep",
                ["--config=experiments/maca_synthetic.py", run, "--config.grpo.itrations=3"],
                "config.grpo.itrations",
            ),
            (
                "bad",
                ["--config=experiments/maca_synthetic.py", run, "--config.grpo.group_size=1"],
                "config.grpo.group_size",
            ),
            ("bad_arg", ["--config=experiments/maca_gsm_hard.py:gsm8k", run], "benchmark"),
            (
                "bad_choice",
                ["--config=experiments/maca_synthetic.py", run, "--config.systems=('maca','nope')"],
                "config.systems",
            ),
        ],
        "rollout": [
            (
                "unknown",
                ["--config=experiments/workplace_compare.py", run, "--config.expert.nonexistent_key=3"],
                "config.expert.nonexistent_key",
            ),
            ("bad", ["--config=experiments/workplace_compare.py", run, "--config.num_tasks=0"], "config.num_tasks"),
            (
                "bad_endpoint",
                ["--config=experiments/workplace_compare.py", run, "--config.orchestrator.provider=nope"],
                "config.orchestrator",
            ),
            (
                "bad_choice",
                ["--config=experiments/workplace_compare.py", run, "--config.systems=('proactive','nope')"],
                "config.systems",
            ),
        ],
        "serve": [
            ("unknown", [*serve, "--config.serve.nonexistent_key=3"], "config.serve.nonexistent_key"),
            ("bad", [*serve, "--config.serve.tensor_parallel_size=0"], "tensor_parallel_size"),
            ("bad_flag", [*serve, "--port=-1"], "--port"),
        ],
        "baseline": [
            (
                "unknown",
                ["--config=experiments/smollm2_baseline.py", run, "--config.serve.nonexistent_key=3"],
                "config.serve.nonexistent_key",
            ),
            (
                "bad",
                ["--config=experiments/smollm2_baseline.py", run, "--config.engine.orchestrator_sampling.max_tokens=0"],
                "config.engine.orchestrator_sampling",
            ),
            (
                "bad_choice",
                ["--config=experiments/smollm2_baseline.py", run, "--config.readings=('zero_shot','ten_shot')"],
                "config.readings",
            ),
        ],
        "attribute": [
            (
                "unknown",
                ["--config=experiments/attribute_smollm2.py", "--config.grm.nonexistent_key=3"],
                "config.grm.nonexistent_key",
            ),
            ("bad", ["--config=experiments/attribute_smollm2.py", "--config.concurrency=0"], "config.concurrency"),
            (
                "bad_endpoint",
                ["--config=experiments/attribute_smollm2.py", "--config.grm.model="],
                "config.grm.model",
            ),
        ],
        "eval": [
            (
                "unknown",
                ["--config=experiments/eval_benchmarks.py:gaia", "--config.nonexistent_key=3"],
                "config.nonexistent_key",
            ),
            ("bad", ["--config=experiments/eval_benchmarks.py:gaia", "--config.runs=0"], "config.runs"),
        ],
        "sample": [
            ("unknown", [f"--out_dir={tmp}", "--nonexistent_flag=3"], "nonexistent_flag"),
            ("bad", [f"--out_dir={tmp}", "--top_p=2"], "--top_p"),
        ],
        "maca_table": [
            (
                "unknown",
                ["--config=experiments/maca_real_agents.py", run, "--config.maca.grpo.itrations=3"],
                "config.maca.grpo.itrations",
            ),
            (
                "bad",
                ["--config=experiments/maca_real_agents.py", run, "--config.grpo_on=('gsm_hard','svamp')"],
                "config.grpo_on",
            ),
        ],
        "view": [
            (
                "unknown",
                [f"--store={tmp / 's.jsonl'}", f"--out={tmp / 'v'}", "--nonexistent_flag=3"],
                "nonexistent_flag",
            ),
            ("bad", [f"--store={tmp / 's.jsonl'}", f"--out={tmp / 'v'}", "--price=orchestrator:cheap"], "--price"),
        ],
    }


CASES = [(launcher, case) for launcher, cases in _cases(pathlib.Path("/tmp")).items() for case, _, _ in cases]


def test_every_launcher_has_cases():
    assert LAUNCHERS == {launcher for launcher, _ in CASES}
    for launcher in LAUNCHERS:
        kinds = {case.split("_")[0] for name, case in CASES if name == launcher}
        assert {"unknown", "bad"} <= kinds, launcher


@pytest.mark.parametrize(("launcher", "case"), CASES)
def test_launcher_names_the_key_without_a_traceback(launcher, case, tmp_path):
    (tmp_path / "serve_config.py").write_text(SERVE_CONFIG)
    argv, named = next((a, n) for c, a, n in _cases(tmp_path)[launcher] if c == case)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_"))}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    out = subprocess.run(
        [sys.executable, "-m", f"launch.{launcher}", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
    )
    assert out.returncode != 0, out.stdout[-2000:]
    assert named in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert not (tmp_path / "run").exists()  # stopped before any work
