"""SFT on a (data 2, fsdp 2, tensor 2) mesh of 8 fake CPU devices follows the 1-device loss curve, and so do
2 accumulation steps of 4 rows."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import tiny_data

STEPS = 20


def _run(tmp_path, mesh, *, steps=STEPS, accum_steps=1):
    config = tiny_data.config(tmp_path / f"run{'x'.join(map(str, mesh))}", steps=steps, mesh=mesh)
    config.batch.update(micro_batch=8 // accum_steps, accum_steps=accum_steps)
    trainer = tiny_data.trainer(config, tiny_data.model(), tiny_data.method_rows(config))
    # One (T, K) shape per length bucket that holds rows: K is the bucket's longest target (PackedSource).
    return trainer, trainer.run(), len(trainer.source.groups)


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


def test_two_accumulation_steps_of_4_rows_train_like_one_batch_of_8(tmp_path, single):
    """The step's 8 rows are drawn by (seed, step) whatever the layout, and accumulation is exact: 2 x 4 rows give
    the losses and gradient norms of 1 x 8."""
    _, ref, _ = single
    _, got, _ = _run(tmp_path, (1, 1, 1), steps=5, accum_steps=2)
    for key in ("loss", "grad_norm"):
        want = np.array([m[key] for m in ref.history[:5]])
        np.testing.assert_allclose([m[key] for m in got.history], want, rtol=1e-5, err_msg=key)


def test_progress_line_reports_rate_and_eta(single):
    trainer, result, _ = single
    last = result.history[-1]
    assert last["tokens_per_s"] > 0 and last["steps_per_s"] > 0
    lines = [line for line in trainer.stream.getvalue().splitlines() if line.startswith("step ")]
    assert lines[-1].startswith(f"step {STEPS}/{STEPS} (100%)") and "tok/s" in lines[-1] and "ETA" in lines[-1]
