"""Fast checks of the serving package that need no vLLM: startup failures report the server log,
stop ends the whole process group, and weight folders are exported and vetted correctly.

The "servers" here are test doubles: a fake venv whose bin/python is a shell script that crashes,
hangs or forks, standing in for vLLM so each failure path runs in milliseconds.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from porch_jax.models import from_pretrained
from porch_jax.models.tiny import make_tiny_model
from porch_jax.serving import (
    EXPORTED_ARCHITECTURES,
    ArchitectureError,
    FolderError,
    ServerConfig,
    ServerError,
    VLLMServer,
    check_vllm_architecture,
    registered_architectures,
    vllm_cpu_missing,
)
from porch_jax.serving.architectures import registry_file
from porch_jax.serving.weights import HEAD_FILE, WeightSyncError, check_weights_folder, export_for_serving


def fake_venv(tmp_path: Path, script: str) -> str:
    """A venv whose python is ``script`` (bash); returns the venv path for ServerConfig.cpu_venv."""
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/usr/bin/env bash\n" + script)
    python.chmod(0o755)
    return str(python.parent.parent)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A folder that passes the start's folder check, so the fake server behind it runs."""
    return make_tiny_model(tmp_path_factory.mktemp("served") / "model")


def server(tmp_path: Path, model_dir: Path, script: str, **config) -> VLLMServer:
    config = ServerConfig(device="cpu", cpu_venv=fake_venv(tmp_path, script), **config)
    return VLLMServer(model_dir, tmp_path / "run", api_key="k", config=config)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_crash_at_startup_reports_the_cause_from_the_log(tmp_path, model_dir):
    crash = (
        'echo "INFO starting"\necho "RuntimeError: Unsupported CPU attention configuration: head_dim=16"\n'
        + "".join(f'echo "shutdown noise {i}"\n' for i in range(50))
        + "exit 3\n"
    )
    with pytest.raises(ServerError, match="exited with code 3") as info:
        server(tmp_path, model_dir, crash).start()
    message = str(info.value)
    assert "RuntimeError: Unsupported CPU attention configuration" in message and "shutdown noise 49" in message


def test_startup_timeout_stops_the_process_group(tmp_path, model_dir):
    pid_file = tmp_path / "child.pid"
    hang = f"sleep 1000 &\necho $! > {pid_file}\nsleep 1000\n"
    s = server(tmp_path, model_dir, hang, startup_timeout_s=1.0, stop_timeout_s=2.0)
    t0 = time.perf_counter()
    with pytest.raises(ServerError, match="did not answer /v1/models within 1 s"):
        s.start()
    assert time.perf_counter() - t0 < 10 and s.process is None
    child = int(pid_file.read_text())
    for _ in range(50):
        if not alive(child):
            break
        time.sleep(0.1)
    assert not alive(child), "a child of the server outlived stop()"


SILENT_ENGINE = """
import sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # /v1/models answers: the process is up
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def do_POST(self):  # the first completion never comes: an engine that hangs on its first request
        time.sleep(1000)

port = int(sys.argv[sys.argv.index("--port") + 1])
HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def test_a_first_completion_that_never_comes_is_bounded_by_the_startup_timeout(tmp_path, model_dir):
    engine = tmp_path / "silent_engine.py"
    engine.write_text(SILENT_ENGINE)
    s = server(tmp_path, model_dir, f'exec {sys.executable} {engine} "$@"\n', startup_timeout_s=6.0, stop_timeout_s=2.0)
    t0 = time.perf_counter()
    with pytest.raises(ServerError, match="did not answer its first completion within 6 s of starting"):
        s.start()
    assert time.perf_counter() - t0 < 6.0 + 2.0 + 5.0 and s.process is None  # the bound, the stop, slack


def test_command_keeps_the_key_out_of_argv_and_config_rejects_typos(tmp_path, model_dir, monkeypatch):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)  # the tests' workers set it (tests/conftest.py)
    s = server(tmp_path, model_dir, "exit 0\n")
    cmd, env = s.command(), s.environment()
    assert "k" not in cmd and env["VLLM_API_KEY"] == "k" and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(128 * 2**20) and "--enforce-eager" in cmd
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and "PYTHONPATH" not in env
    assert env["GOMP_SPINCOUNT"] == "10000"  # CPU threads sleep soon at a barrier (a busy core must not stall them)
    monkeypatch.setenv("GOMP_SPINCOUNT", "0")
    assert s.environment()["GOMP_SPINCOUNT"] == "0"  # the environment's value wins
    monkeypatch.delenv("GOMP_SPINCOUNT")
    with pytest.raises(ValueError, match="tensor_paralel_size"):
        ServerConfig.from_mapping({"tensor_paralel_size": 2})
    assert ServerConfig.from_mapping({"tensor_parallel_size": 2, "extra_args": ["--x"]}).extra_args == ("--x",)
    assert ServerConfig.from_mapping(ServerConfig.config_dict(device="gpu").to_dict()) == ServerConfig(device="gpu")
    gpu_config = ServerConfig(device="gpu", tensor_parallel_size=2)
    gpu = VLLMServer(model_dir, tmp_path / "gpu", api_key="k", config=gpu_config)
    gpu_cmd = gpu.command()
    assert "--enforce-eager" not in gpu_cmd and gpu_cmd[gpu_cmd.index("--tensor-parallel-size") + 1] == "2"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in gpu.environment() and "GOMP_SPINCOUNT" not in gpu.environment()
    with pytest.raises(ValueError, match="cpu_spin_count must be >= 0"):
        ServerConfig(cpu_spin_count=-1)
    with pytest.raises(FolderError, match="is not a model folder \\(no config.json\\)"):
        server(tmp_path / "b", tmp_path, "exit 0\n").start()


def test_export_for_serving_writes_the_tied_head_and_still_loads(tmp_path):
    model = from_pretrained(make_tiny_model(tmp_path / "plain"))
    with pytest.raises(WeightSyncError, match="tied embeddings but no lm_head.weight"):
        check_weights_folder(tmp_path / "plain")
    folder = export_for_serving(model, tmp_path / "served")
    assert (folder / HEAD_FILE).is_file() and check_weights_folder(folder) == folder.resolve()
    reloaded = from_pretrained(folder)  # the extra tensor is ignored for tied models
    np.testing.assert_array_equal(np.asarray(reloaded.embed_tokens[...]), np.asarray(model.embed_tokens[...]))
    with pytest.raises(WeightSyncError, match="no config.json"):
        check_weights_folder(tmp_path)


def test_registry_is_read_from_the_installed_vllm():
    """With vLLM installed for this machine's default server (the vllm-cpu venv, or this env's vllm on a
    GPU), its registry.py is read; only without one does the check fall back to our list."""
    config = ServerConfig()
    registry = registered_architectures(config)
    if config.resolved_device() == "gpu":
        installed = importlib.util.find_spec("vllm") is not None
    else:
        installed = vllm_cpu_missing(config) is None
    print(f"\nvLLM architectures from {registry.source}: {len(registry.architectures)}")
    if installed:
        assert registry.source == str(registry_file(config)) and registry.source.endswith("registry.py")
        assert len(registry.architectures) > 100 and set(EXPORTED_ARCHITECTURES) <= registry.architectures
        assert "Qwen3_5ForConditionalGeneration" in registry.architectures  # a multimodal entry is read too
    else:
        assert registry.architectures == frozenset(EXPORTED_ARCHITECTURES)


def fake_registry(tmp_path: Path) -> ServerConfig:
    """A venv holding a registry.py laid out as vLLM 0.32's: dicts merged into _VLLM_MODELS."""
    file = tmp_path / "venv/lib/python3.11/site-packages/vllm/model_executor/models/registry.py"
    file.parent.mkdir(parents=True)
    file.write_text(
        '_TEXT = {"LlamaForCausalLM": ("llama", "LlamaForCausalLM"), "Qwen3_5ForCausalLM": ("qwen3_5", "X")}\n'
        "_EMBED: dict[str, tuple[str, str]] = {\n"
        '    "LlamaModel": ("llama", "LlamaForCausalLM"),\n'
        "    **{k: v for k, v in _TEXT.items() if k.startswith('Llama')},\n"
        "}\n"
        '_VLLM_MODELS = {**_TEXT, **_EMBED, "MambaForCausalLM": ("mamba", "MambaForCausalLM")}\n'
        '_OTHER = {"NotServed": ("x", "y")}\n'
    )
    return ServerConfig(device="cpu", cpu_venv=str(tmp_path / "venv"))


def test_architecture_check_reads_the_registry_and_names_what_is_missing(tmp_path):
    config = fake_registry(tmp_path)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    registry = registered_architectures(config)
    assert registry.architectures == {"LlamaForCausalLM", "Qwen3_5ForCausalLM", "LlamaModel", "MambaForCausalLM"}
    assert check_vllm_architecture({"architectures": ["Nope", "Qwen3_5ForCausalLM"]}, config) == "Qwen3_5ForCausalLM"
    (model_dir / "config.json").write_text(json.dumps({"architectures": ["NotServed"], "model_type": "x"}))
    with pytest.raises(ArchitectureError, match=r"\['NotServed'\].*registry\.py.*registered: LlamaForCausalLM, Llama"):
        check_vllm_architecture(model_dir, config)
    with pytest.raises(ArchitectureError, match=r"\[\] .*not registered"):
        check_vllm_architecture({"model_type": "x"}, config)


def test_a_server_dies_with_the_process_that_started_it_even_by_kill_9(tmp_path):
    """A job killed with -9 runs no cleanup; the kernel ends its server (PR_SET_PDEATHSIG) instead of leaving it
    holding its port and memory."""
    import signal
    import subprocess

    from porch_jax.serving.server import with_parent_death_signal

    if sys.platform != "linux":
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    pid_file = tmp_path / "server.pid"
    job = (
        "import subprocess, sys, time\n"
        "from porch_jax.serving.server import with_parent_death_signal\n"
        "cmd = with_parent_death_signal([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "p = subprocess.Popen(cmd, start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", job], env={**os.environ, "PYTHONPATH": os.getcwd()})
    for _ in range(200):
        if pid_file.is_file() and pid_file.read_text():
            break
        time.sleep(0.05)
    server_pid = int(pid_file.read_text())
    cmdline = b""
    for _ in range(600):  # until the guard has run and exec'd the server's own command
        cmdline = Path(f"/proc/{server_pid}/cmdline").read_bytes()
        if b"prctl" not in cmdline:  # the guard's own command line names the server's command too
            break
        time.sleep(0.05)
    assert alive(server_pid)
    assert b"time.sleep(600)" in cmdline and b"prctl" not in cmdline  # the guard exec'd the server's command
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for _ in range(100):
        if not alive(server_pid):
            break
        time.sleep(0.05)
    assert not alive(server_pid), "the server outlived the job that started it"
    assert with_parent_death_signal(["python", "-m", "x"])[-2:] == ["-m", "x"]


def test_vllm_sockets_stay_within_the_unix_path_limit_under_a_deep_run_dir(tmp_path, model_dir):
    """vLLM binds IPC sockets at VLLM_RPC_BASE_PATH/<uuid4>; a Unix socket path over 107 bytes fails its start."""
    short = VLLMServer(model_dir, "/tmp/r", api_key="k", config=ServerConfig(device="cpu"))
    assert short.environment()["VLLM_RPC_BASE_PATH"] == "/tmp/r/vllm_rpc"
    deep_dir = tmp_path / ("d" * 60) / "run" / "vllm"
    deep = VLLMServer(model_dir, deep_dir, api_key="k", config=ServerConfig(device="cpu"))
    rpc = deep.environment()["VLLM_RPC_BASE_PATH"]
    assert len(os.fsencode(rpc)) + 1 + 36 <= 107 and "porch_vllm_rpc_" in rpc
    other = VLLMServer(model_dir, deep_dir.parent / "vllm2", api_key="k", config=ServerConfig(device="cpu"))
    assert other.environment()["VLLM_RPC_BASE_PATH"] != rpc  # one folder per run directory
