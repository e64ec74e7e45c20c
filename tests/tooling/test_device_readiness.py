"""Ready for the first accelerator, proven on CPU: bench_mfu's FLOP count, the ahead-of-time memory analysis at a
scaled-down shape, and scripts/device_check.sh's CPU form (what a GPU or TPU host runs, at the tiny shape)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import aot_memory, bench_mfu  # noqa: E402
from benchmarks.train_steps import TINY  # noqa: E402


def tiny_forward_flops(seq: int, scored: int) -> float:
    """TINY's forward FLOPs over one sequence, written out by hand: 2 layers of (q, k, v, o) projections, a SwiGLU
    MLP and causal attention, and the LM head at the scored positions."""
    h, i, v, heads, kv, d = 64, 128, 512, 4, 2, 16
    projections = h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * i
    attention = 2 * 2 * heads * d * seq * (seq + 1) / 2
    return 2 * (2 * projections * seq + attention) + 2 * h * v * scored


@pytest.mark.slow
def test_bench_mfu_counts_the_tiny_shapes_model_flops_and_xla_agrees():
    assert (TINY["hidden_size"], TINY["num_hidden_layers"], TINY["vocab_size"]) == (64, 2, 512)
    seq, action = 64, 16
    results = bench_mfu.main(
        ["--shape", "tiny", "--dtype", "f32", "--rows", "1", "--seq", str(seq), "--action", str(action), "--steps", "1",
         "--warmup", "0"]
    )  # fmt: skip
    by_method = {r["method"]: r for r in results}
    rows = by_method["sft"]["rows"]  # one per device: 8 fake CPU devices in the tests
    assert rows == 8 and by_method["sft"]["devices"] == 8
    sft = 3 * tiny_forward_flops(seq, seq - 1)
    opod = 3 * tiny_forward_flops(seq, seq - 1) + 3 * tiny_forward_flops(seq, action) + tiny_forward_flops(seq, action)
    assert by_method["sft"]["model_flops_per_step"] == pytest.approx(rows * sft, rel=1e-12)
    assert by_method["opod"]["model_flops_per_step"] == pytest.approx(rows * opod, rel=1e-12)
    assert by_method["opod"]["tokens_per_step"] == 2 * by_method["sft"]["tokens_per_step"] == 2 * rows * seq
    for r in results:
        # XLA counts what the model FLOPs leave out (the whole attention matrix, softmax, norms, AdamW): a little more.
        assert 1.0 < r["xla_flops_per_step"] / r["model_flops_per_step"] < 1.5, r
        assert r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1 and "CPU" in r["peak_source"]


@pytest.mark.slow
def test_the_memory_analysis_of_a_scaled_down_config_on_eight_simulated_devices(tmp_path):
    """The 9B table's code at a tiny shape on the tests' 8 CPU devices, (1, 8, 1) as the 9B config's mesh. Eight
    compilations (2 methods x remat or not x 1 and 2 rows per device); 64 tokens keep each short, and OPOD's peak at
    one row (~3 MB) still exceeds the tight budget."""
    results = aot_memory.main(
        ["--shape", "tiny", "--mesh", "1,8,1", "--rows", "1", "--seq", "64", "--action", "16", "--search", "2",
         "--budgets", "roomy=1,tight=0.002", "--json", str(tmp_path / "m.json"), "--md", str(tmp_path / "m.md")]
    )  # fmt: skip
    assert {(r["method"], r["remat"]) for r in results} == {(m, r) for m in ("sft", "opod") for r in (True, False)}
    params = tiny_parameters()
    for r in results:
        m = r["memory"]
        assert m["peak"] == m["arguments"] + m["outputs"] - m["aliased"] + m["temporaries"]
        # The donated train state (f32 parameters and two AdamW moments) is an argument and an aliased output; at
        # most one device's share of it plus what stays replicated (norms), never all 8 shares.
        assert 12 * params / 8 <= m["aliased"] <= m["arguments"] < 12 * params, m
        assert m["temporaries"] > 0 and r["largest_rows_per_device"]["roomy"] == 2  # the whole search fits 1 GB
    by = {(r["method"], r["remat"]): r["memory"] for r in results}
    assert by[("opod", False)]["arguments"] > by[("sft", False)]["arguments"]  # the teacher's parameters
    for method in ("sft", "opod"):  # remat changes what is recomputed, not the state
        assert by[(method, True)]["arguments"] == by[(method, False)]["arguments"]
    tight = {(r["method"], r["remat"]): r["largest_rows_per_device"]["tight"] for r in results}
    assert all(0 <= n <= 2 for n in tight.values()) and tight[("opod", False)] == 0, tight
    saved = json.loads((tmp_path / "m.json").read_text())
    assert len(saved["results"]) == 4 and "| opod | True |" in (tmp_path / "m.md").read_text()


def tiny_parameters() -> int:
    import jax
    import numpy as np
    from flax import nnx

    from porch_jax.models import ModelConfig, init_model

    model = nnx.eval_shape(lambda: init_model(ModelConfig.from_hf(TINY)))
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def _device_check(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """scripts/device_check.sh as a host runs it (no fake device count), its parts sharing one compilation cache:
    the memory analysis's 2-row search compiles the very programs the MFU part timed, and loads them."""
    clean = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "DEVICE_CHECK_CPU")}
    clean["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "jax_cache")
    return subprocess.run(
        ["bash", "scripts/device_check.sh"],
        cwd=ROOT,
        env={**clean, "OUT": str(tmp_path / "out"), **env},
        capture_output=True,
        text=True,
        timeout=420,  # a hang guard, not a speed check: ~45 s on 2 quiet cores, minutes on busy shared ones
    )


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_the_device_checks_cpu_form_runs_every_part_and_writes_its_report(tmp_path):
    t0 = time.monotonic()
    done = _device_check(tmp_path, DEVICE_CHECK_CPU="1")
    wall = time.monotonic() - t0
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "device_check.json").read_text())
    assert report["cpu_form"] and report["machine"]["backend"] == "cpu"
    assert set(report["parts"]) == {"mfu", "decode", "memory_device", "memory_cpu"}
    assert all(p["ok"] for p in report["parts"].values()), report["parts"]
    assert report["parts"]["decode"]["result"]["tokens_per_s"] > 0
    table = (tmp_path / "out" / "device_check.md").read_text()
    assert "## mfu" in table and "## decode" in table and "## memory_device" in table
    print(f"\ndevice check, CPU form: {wall:.0f} s")


def test_without_an_accelerator_the_device_check_says_so_in_one_line(tmp_path):
    done = _device_check(tmp_path, JAX_PLATFORMS="cpu")
    assert done.returncode != 0
    last = (done.stdout + done.stderr).strip().splitlines()[-1]
    assert last.startswith("device_check: no GPU or TPU here") and "DEVICE_CHECK_CPU=1" in last
    assert "Traceback" not in done.stdout + done.stderr
