"""SFT on a (data 2, fsdp 2, tensor 2) mesh of 8 fake CPU devices follows the 1-device loss curve."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import tiny_data

from porch_jax.train import data as D

STEPS = 20


def _run(tmp_path, mesh):
    examples = D.sft_examples(tiny_data.episodes(12), tiny_data.tokenizer())
    config = tiny_data.config(tmp_path / f"run{'x'.join(map(str, mesh))}", steps=STEPS, mesh=mesh)
    trainer = tiny_data.trainer(config, tiny_data.model(), examples)
    buckets = {D.Buckets(tuple(config.data.buckets), tuple(config.data.target_buckets)).of([e]) for e in examples}
    return trainer, trainer.run(), len(buckets)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("single"), (1, 1, 1))


def test_sharded_sft_matches_single_device_loss_curve(tmp_path, single):
    _, ref, num_buckets = single
    trainer, got, _ = _run(tmp_path, (2, 2, 2))
    want = np.array([m["loss"] for m in ref.history])
    have = np.array([m["loss"] for m in got.history])
    assert len(have) == len(want) == STEPS
    np.testing.assert_allclose(have, want, atol=1e-4, rtol=0)
    assert want[-1] < want[0] - 1.0  # it learns, so matching curves mean something
    # One compilation per (T, K) bucket, however many steps ran.
    assert num_buckets == 2 and got.num_traces == ref.num_traces == num_buckets
    assert trainer.step_fn._jitted._cache_size() == num_buckets
    # Parameters really are split over the mesh (fsdp and tensor), not replicated.
    kernel = got.state["params"]["layers"][0]["mlp"]["gate_proj"][...]
    assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
    assert kernel.addressable_shards[0].data.shape == (kernel.shape[0] // 2, kernel.shape[1] // 2)
    for a, b in zip(jax.tree.leaves(got.state["params"]), jax.tree.leaves(ref.state["params"]), strict=False):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4)


def test_progress_line_reports_rate_and_eta(single):
    trainer, result, _ = single
    last = result.history[-1]
    assert last["tokens_per_s"] > 0 and last["steps_per_s"] > 0
    lines = [line for line in trainer.stream.getvalue().splitlines() if line.startswith("step ")]
    assert lines[-1].startswith(f"step {STEPS}/{STEPS} (100%)") and "tok/s" in lines[-1] and "ETA" in lines[-1]
