"""The configs that point the systems at the papers' hosted backbones (porch_jax/backends/providers.py `BACKBONES`): each
validates through its launcher's typed schema for every backbone and system, names the provider's hosted endpoint
and key variable, and a launch without the key stops before any call, naming the variable."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from porch_jax.backends.providers import BACKBONES
from porch_jax.eval.benchmark_eval import BenchmarkEvalConfig
from porch_jax.maca.table import TableConfig
from porch_jax.rollout import BASELINES, CORE_SYSTEMS
from porch_jax.rollout.compare import ComparisonConfig
from porch_jax.typed_config import ConfigError, from_dict

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def load(name: str, arg: str) -> dict:
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg).to_dict()


@pytest.mark.parametrize("backbone", sorted(BACKBONES))
def test_every_backbone_validates_in_every_hosted_config(backbone):
    provider, model = BACKBONES[backbone]
    workplace = from_dict(ComparisonConfig, load("workplace_baselines_hosted", backbone))
    assert workplace.orchestrator.provider == "gemini" and not workplace.orchestrator.urls  # the hosted URL
    assert (workplace.executor.provider, workplace.executor.model) == (provider, model)
    assert {"orchestra_o1", "skill_mas", "mas2"} <= set(workplace.systems)
    table = from_dict(TableConfig, load("maca_hosted_agents", backbone))
    assert table.agents.kind == "endpoint" and table.agents.model_id == model  # the cache's key
    assert (table.maca.backend.endpoint.provider, table.maca.backend.endpoint.model) == (provider, model)
    for system in (*CORE_SYSTEMS, *BASELINES):
        benchmark = "swe" if system == "mini_swe" else "gaia2"
        arg = f"benchmark={benchmark},system={system},executor={backbone}"
        cfg = from_dict(BenchmarkEvalConfig, load("eval_hosted", arg))
        assert cfg.system == system and cfg.policy.kind == "endpoint"
        assert (cfg.executor.provider, cfg.executor.model) == (provider, model)
    assert "KEY" not in json.dumps(load("eval_hosted", f"executor={backbone}")).replace("api_key_env", "")


def test_an_unknown_backbone_or_system_is_named():
    with pytest.raises(ValueError, match="backbone: unknown 'gpt_9'"):
        load("workplace_baselines_hosted", "gpt_9")
    with pytest.raises(ConfigError, match="system"):
        from_dict(BenchmarkEvalConfig, load("eval_hosted", "system=debate"))


def test_a_hosted_run_without_its_key_stops_naming_the_variable(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("GEMINI_API_KEY", "DEEPSEEK_API_KEY")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.rollout",
            "--config=experiments/workplace_baselines_hosted.py:deepseek_v3_2",
            f"--config.run_dir={tmp_path / 'run'}",
            "--config.num_tasks=1",
            "--config.systems=('orchestra_o1',)",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "PYTHONPATH": os.getcwd()},
    )
    assert done.returncode != 0
    assert "GEMINI_API_KEY" in done.stderr + done.stdout
