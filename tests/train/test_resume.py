"""kill -9 during training, rerun the same command: the final parameters equal an uninterrupted run's."""

from __future__ import annotations

import os
import re
import signal
import subprocess

import numpy as np
import tiny_data

from porch_jax import faults

STEPS, KILL_AFTER = 20, 7


def _config(tmp_path, inputs, name):
    model_dir, store = inputs
    c = tiny_data.config(tmp_path / name, steps=STEPS)
    c.model.init_from, c.data.trajectories = str(model_dir), str(store)
    c.train.checkpoint.update(every=1, keep=3)
    c.train.log.every = 1
    return tiny_data.write_config(c, tmp_path / f"{name}.py")


def test_kill_9_and_resume_gives_the_uninterrupted_parameters(tmp_path):
    inputs = tiny_data.write_run_inputs(tmp_path / "inputs")
    env = tiny_data.launch_env()

    ref = subprocess.run(
        tiny_data.launch_command(_config(tmp_path, inputs, "ref")),
        cwd=tiny_data.REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert ref.returncode == 0, ref.stderr[-3000:]

    command = tiny_data.launch_command(_config(tmp_path, inputs, "killed"))
    # Killed by the trainer's crash point after step KILL_AFTER + 1 (porch_jax/faults.py): that step's save has
    # started, and Orbax starts a save only once the one before it is committed, so step KILL_AFTER has landed.
    with open(tmp_path / "killed.log", "wb") as log:
        proc = subprocess.run(
            command,
            cwd=tiny_data.REPO,
            env={**env, faults.ENV: f"killed.step@{KILL_AFTER + 1}"},
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=300,
        )
    landed = tmp_path / "killed" / "checkpoints" / str(KILL_AFTER)  # orbax renames a step dir in once committed
    assert landed.exists() and proc.returncode == -signal.SIGKILL, (tmp_path / "killed.log").read_text()[-3000:]
    assert not (tmp_path / "killed" / "export").exists()

    resumed = subprocess.run(
        command, cwd=tiny_data.REPO, env=env, capture_output=True, text=True, check=False, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    start = int(re.search(r"resumed from step (\d+)", resumed.stdout).group(1))
    assert KILL_AFTER <= start < STEPS, (sorted(os.listdir(landed.parent)), resumed.stderr[-5000:])
    assert f"step {STEPS}/{STEPS}" in resumed.stdout and f"step {start}/{STEPS}" not in resumed.stdout

    want = tiny_data.read_safetensors(tmp_path / "ref" / "export")
    got = tiny_data.read_safetensors(tmp_path / "killed" / "export")
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
