"""Loading at scale: on 2 processes x 2 CPU devices each process reads only the blocks its devices hold.
Same logits as a plain load, and a lower peak RSS per process (printed; the README quotes it)."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from porch_jax.models import ModelConfig, init_model, save_pretrained

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
WORKER = Path(__file__).with_name("sliced_load_worker.py")
REPO = Path(__file__).resolve().parents[2]
# ~150 MB of f32 weights: large against the ~300 MB a JAX process starts with, small enough to write fast.
CONFIG = ModelConfig(
    model_type="llama",
    vocab_size=8192,
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=3,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=128,
    tie_word_embeddings=False,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_"))}
    return env | {"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}


def test_two_processes_read_only_their_blocks(tmp_path):
    folder = save_pretrained(init_model(CONFIG, seed=0), tmp_path / "model")
    weights_mb = (folder / "model.safetensors").stat().st_size / 2**20
    plain = subprocess.run(
        ["timeout", "200", sys.executable, str(WORKER), str(folder), str(tmp_path / "plain.json"), "plain"],
        env=_env(),
        capture_output=True,
        text=True,
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    address = f"127.0.0.1:{_free_port()}"
    procs = [
        subprocess.Popen(
            ["timeout", "200", sys.executable, str(WORKER), str(folder), str(tmp_path / f"sliced{i}.json"), "sliced"]
            + [address, str(i)],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for p in procs:
        _, err = p.communicate()
        assert p.returncode == 0, err[-3000:]
    base = json.loads((tmp_path / "plain.json").read_text())
    sliced = [json.loads((tmp_path / f"sliced{i}.json").read_text()) for i in range(2)]
    for s in sliced:
        np.testing.assert_allclose(np.asarray(s["logits"]), np.asarray(base["logits"]), atol=1e-4)

    def growth(r):
        return r["rss_after_load_mb"] - r["rss_before_mb"]

    peaks = ", ".join(f"{s['rss_after_load_mb']:.0f}" for s in sliced)
    growths = ", ".join(f"{growth(s):.0f}" for s in sliced)
    print(
        f"weights {weights_mb:.0f} MB; RSS growth while loading: plain {growth(base):.0f} MB, sliced per process "
        f"{growths} MB (peak RSS plain {base['rss_after_load_mb']:.0f} MB, sliced {peaks} MB)"
    )
    # Each process holds half of every matrix (a (1, 2, 2) mesh over 4 devices, 2 per process).
    assert all(growth(s) < 0.75 * growth(base) for s in sliced)
