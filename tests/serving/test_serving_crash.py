"""The OPOD experiment killed with -9 inside its serving stage (the vLLM server it starts for the SFT export still
starting), then resumed: the server dies with the job (no cleanup runs after a kill -9; the kernel ends it), and the
rerun starts a server again and finishes the loop. The other stages' kills are tests/test_crash_chain.py.

The model is a tiny random one (tests/serving/conftest.py's shape, a folder of its own so the session server's
processes are not counted); the stages are experiments/opod_smollm2.py:smoke's, narrowed to SFT and its evaluation.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from porch_jax.models.tiny import make_tiny_model
from porch_jax.serving import ServerConfig, vllm_cpu_missing

ROOT = Path(__file__).resolve().parents[2]


def _servers_of(folder: Path) -> list[int]:
    """Pids of live vLLM servers whose command names a path in `folder` (the run's server serves RUN/sft/export)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"vllm.entrypoints" in cmdline and str(folder).encode() in cmdline and state != "Z":
            pids.append(int(proc.name))
    return pids


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_kill_during_serving_takes_the_server_down_and_the_rerun_serves_again(tmp_path):
    if missing := vllm_cpu_missing(ServerConfig(device="cpu")):
        pytest.skip(missing)
    model = make_tiny_model(tmp_path / "tiny", head_dim=32)  # vLLM's CPU attention needs head_dim 32+
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "launch.pipeline",
        "--config=experiments/opod_smollm2.py:smoke",
        f"--config.run_dir={run_dir}",
        f"--config.model.init_from={model}",
        "--config.methods=('sft',)",
        "--config.sft.steps=2",
        "--config.attribution.grm=scripted",
        "--config.attribution.secondary=False",
        "--config.serving.kind=vllm",  # no base_url: the run starts its own server
        "--config.serving.server.startup_timeout_s=300",
        "--config.policy.max_new_tokens=16",
        "--config.eval.max_tokens=16",
    ]
    job = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []
    try:
        assert job.stdout is not None
        for line in job.stdout:
            out.append(line)
            if "serve the SFT export (vLLM): running" in line:
                break
        assert _wait(lambda: bool(_servers_of(run_dir)), 60), "".join(out[-40:])
        job.send_signal(signal.SIGKILL)  # while the server starts: no `finally`, no atexit
        job.wait(timeout=30)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == -9
    assert _wait(lambda: not _servers_of(run_dir), 20), f"a vLLM server outlived the killed job: {_servers_of(run_dir)}"

    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "train sft: done, skipped" in done.stdout and "serve the SFT export (vLLM): running" in done.stdout
    assert "policies are sampled by vLLM at http://" in done.stdout  # a server of its own, on the SFT export
    results = json.loads((run_dir / "results.json").read_text())
    assert [(m["system"], m["n"]) for m in results["methods"]] == [("sft", 2)]
    assert not _servers_of(run_dir)  # and the finished run stopped its server
    assert os.path.getsize(run_dir / "rollouts.jsonl") > 0
