"""Two processes (jax.distributed over 127.0.0.1, 2 CPU devices each) train like one process.

The mesh (data 1, fsdp 2, tensor 2) puts fsdp across the two processes, so parameters, optimizer
state, checkpoints and the export are split between hosts, and each process feeds only its rows.
"""

from __future__ import annotations

import re
import socket
import subprocess

import numpy as np
import pytest
import tiny_data

STEPS = 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(tmp_path, inputs, name, mesh):
    c = tiny_data.config(tmp_path / name, steps=STEPS, mesh=mesh)
    c.model.init_from, c.data.trajectories = str(inputs[0]), str(inputs[1])
    c.train.log.every = 1
    return tiny_data.write_config(c, tmp_path / f"{name}.py")


def _losses(stdout: str) -> list[float]:
    return [float(x) for x in re.findall(r"^step \d+/\d+ .*?\| loss ([-\d.]+)", stdout, re.MULTILINE)]


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
    inputs = tiny_data.write_run_inputs(tmp_path / "inputs")
    env = tiny_data.launch_env()
    single = subprocess.run(
        [
            "timeout",
            "300",
            *tiny_data.launch_command(_config(tmp_path, inputs, "single", (1, 1, 1)), "--cpu_devices=1"),
        ],
        cwd=tiny_data.REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert single.returncode == 0, single.stderr[-3000:]

    config = _config(tmp_path, inputs, "multi", (1, 2, 2))
    address = f"127.0.0.1:{_free_port()}"
    logs = [(tmp_path / f"out{i}.log", tmp_path / f"err{i}.log") for i in range(2)]
    procs = []
    for i, (out, err) in enumerate(logs):  # files, not pipes: an unread pipe would stall its process (and the other)
        with open(out, "w") as o, open(err, "w") as e:
            procs.append(
                subprocess.Popen(
                    [
                        "timeout",
                        "300",
                        *tiny_data.launch_command(
                            config,
                            "--cpu_devices=2",
                            f"--coordinator_address={address}",
                            "--num_processes=2",
                            f"--process_id={i}",
                            "--init_timeout_s=120",
                        ),
                    ],
                    cwd=tiny_data.REPO,
                    env=env,
                    stdout=o,
                    stderr=e,
                )
            )
    for p, (_, err) in zip(procs, logs, strict=False):
        assert p.wait(timeout=330) == 0, err.read_text()[-3000:]

    want, got = _losses(single.stdout), _losses(logs[0][0].read_text())
    assert len(want) == len(got) == STEPS and not _losses(logs[1][0].read_text())  # only process 0 logs
    np.testing.assert_allclose(got, want, atol=1.5e-4)  # printed with 4 decimals
    ref = tiny_data.read_safetensors(tmp_path / "single" / "export")
    out = tiny_data.read_safetensors(tmp_path / "multi" / "export")
    assert ref.keys() == out.keys()
    for name in ref:
        np.testing.assert_allclose(out[name], ref[name], atol=1e-5, err_msg=name)
