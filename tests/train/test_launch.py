"""launch/train.py end to end: config file + overrides, OPOD with on-policy sampling, export."""

from __future__ import annotations

import json
import subprocess

import pytest
import tiny_data

from porch_jax.trajectories import TrajectoryStore


def test_unknown_method_is_a_usage_error(tmp_path):
    config = tiny_data.write_config(tiny_data.config(tmp_path / "run"), tmp_path / "c.py")
    out = subprocess.run(
        tiny_data.launch_command(config, "--config.method=ppo"),
        cwd=tiny_data.REPO,
        env=tiny_data.launch_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert out.returncode != 0 and "must be one of ('sft', 'rwr', 'opod', 'grpo')" in out.stderr


def test_opod_run_with_overrides_samples_on_policy_and_exports(tmp_path):
    model_dir, store = tiny_data.write_run_inputs(tmp_path / "inputs")
    hints = tmp_path / "hints.jsonl"
    hints.write_text(
        "".join(
            json.dumps({"episode_id": e, "index": i, "attributable": True, "hint": h}) + "\n"
            for (e, i), h in tiny_data.hints(TrajectoryStore(store).read()).items()
        )
    )
    c = tiny_data.config(tmp_path / "run", steps=2, method="opod")
    c.model.init_from, c.data.trajectories, c.data.hints = str(model_dir), str(store), str(hints)
    c.data.buckets = (128, 192)  # room for 8 sampled tokens after the longest hinted context
    c.opd.update(max_new_tokens=8, max_len=256)
    c.log.update(every=1, tensorboard=True)
    c.export.dir = str(tmp_path / "run" / "export")
    config = tiny_data.write_config(c, tmp_path / "opod.py")

    out = subprocess.run(
        tiny_data.launch_command(config, "--config.train.learning_rate=1e-5", "--config.loss.opd_weight=0.5"),
        cwd=tiny_data.REPO,
        env=tiny_data.launch_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=400,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("step ")]
    assert len(lines) == 2 and all("opd" in line and "logprob_gap" in line for line in lines)
    saved = json.loads((tmp_path / "run" / "checkpoints" / "2" / "config" / "metadata").read_text())
    assert saved["train"]["learning_rate"] == 1e-5 and saved["loss"]["opd_weight"] == 0.5
    assert saved["data"]["target_reserve"] == 8  # on-policy targets get room in the buckets
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))

    transformers = pytest.importorskip("transformers", reason="transformers is a runtime dependency of porch_jax")
    pytest.importorskip("torch", reason="torch is in the test extra (torch==2.13.0); scripts/test.sh installs it")
    model = transformers.AutoModelForCausalLM.from_pretrained(c.export.dir)
    assert model.config.hidden_size == tiny_data.TINY_HF["hidden_size"]
