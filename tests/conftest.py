"""Test-wide setup: 8 fake CPU devices so sharded (data, fsdp, tensor) meshes run on one CPU.

XLA reads the flag when the backend starts, so it must be set before anything imports jax.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# The real SmolLM2-135M-Instruct folder (porch_jax.models.smollm2), converted once per machine and shared
# by every real-model test of the session.
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def smollm2_dir():
    pytest.importorskip("gguf", reason="the GGUF conversion needs the `gguf` package (test extra)")
    pytest.importorskip("torch", reason="the GGUF conversion runs in transformers + torch (test extra)")
    from porch_jax.models.smollm2 import smollm2_folder

    return smollm2_folder()
