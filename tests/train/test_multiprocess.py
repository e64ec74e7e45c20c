"""Two processes (jax.distributed over 127.0.0.1, 2 CPU devices each) train like one process.

The mesh (data 1, fsdp 2, tensor 2) puts fsdp across the two processes, so parameters, optimizer
state, checkpoints and the export are split between hosts, and each process feeds only its rows.
The records run goes through launch/train.py; the packed sources (SFT, RWR, OPOD with on-policy OPD,
DA-GRPO, recorded GRPO groups over accumulation steps) through multiprocess_worker.py, whose samplers run over both
processes' devices.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tiny_data

STEPS = 10
WORKER = Path(__file__).with_name("multiprocess_worker.py")


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
@pytest.mark.timeout(400, method="thread")  # a collective deadlock hangs in C++
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


def _worker(model_dir: Path, out: Path, mesh: str, *distributed: str, log: Path) -> subprocess.Popen:
    with open(log, "w") as f:  # a file, not a pipe: an unread pipe would stall its process (and the other)
        return subprocess.Popen(
            ["timeout", "840", sys.executable, str(WORKER), str(model_dir), str(out), mesh, *distributed],
            cwd=tiny_data.REPO,
            env=tiny_data.launch_env(),
            stdout=f,
            stderr=subprocess.STDOUT,
        )


@pytest.mark.slow
@pytest.mark.timeout(1000, method="thread")  # ~2 min on 2 quiet cores; busy shared cores stretch it 5x
def test_packed_sources_and_on_policy_sampling_on_two_processes_match_one(tmp_path):
    """SFT and RWR (packed rows), OPOD with the student sampling every OPD action, DA-GRPO (sampled groups) and
    GRPO (recorded groups, [accum 2, micro 2]): 3 steps each on 2 processes x 2 devices draw the same tokens as on 1
    device (each row's seed comes from its key, not its place) and give the same losses, gradient norms and final
    weights."""
    model_dir, _ = tiny_data.write_run_inputs(tmp_path / "inputs")
    single = _worker(model_dir, tmp_path / "single.json", "1,1,1", log=tmp_path / "single.log")
    address = f"127.0.0.1:{_free_port()}"
    procs = [
        _worker(model_dir, tmp_path / f"multi{i}.json", "1,2,2", address, str(i), "2", log=tmp_path / f"multi{i}.log")
        for i in range(2)
    ]
    for p, name in zip([single, *procs], ["single", "multi0", "multi1"], strict=True):
        assert p.wait(timeout=900) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]

    want = json.loads((tmp_path / "single.json").read_text())
    assert set(want) == {"sft", "rwr", "opod", "dagrpo", "grpo"}
    for method in ("opod", "dagrpo"):  # one sampler each, 4 actions a step, a fresh draw each step
        (steps,) = want[method]["samples"]
        assert [len(s) for s in steps] == [4] * 3 and all(c for s in steps for c in s)
        assert steps[0] != steps[1] != steps[2]
    for method in ("dagrpo", "grpo"):  # rewards varied within some group
        assert any(m["grad_norm"] > 0 for m in want[method]["metrics"]), method
    for i in range(2):
        got = json.loads((tmp_path / f"multi{i}.json").read_text())
        for method, ref in want.items():
            assert got[method]["samples"] == ref["samples"], method
            assert len(got[method]["metrics"]) == len(ref["metrics"]) == 3
            for step, (g, r) in enumerate(zip(got[method]["metrics"], ref["metrics"], strict=True), 1):
                for key in ("loss", "grad_norm", "ce", "rwr", "opd", "pg", "reward"):
                    if key in r:
                        assert g[key] == pytest.approx(r[key], rel=1e-5, abs=1e-6), (method, step, key)
            assert got[method]["param_norm"] == pytest.approx(ref["param_norm"], rel=1e-6), method
