"""Checkpoints: restore onto another mesh shape, fall back past a damaged step, never keep a NaN state."""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
import tiny_data

from porch_jax.rows.records import MethodRows
from porch_jax.train import checkpoint as C
from porch_jax.train import mesh as mesh_lib
from porch_jax.train import optim
from porch_jax.train import step as S
from porch_jax.train.metrics import NonFiniteError
from porch_jax.train.trainer import Trainer


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    return tiny_data.method_rows(tiny_data.config(tmp_path_factory.mktemp("sft")))


def _trainer(workdir: Path, rows: MethodRows, *, steps: int, mesh) -> Trainer:
    return tiny_data.trainer(tiny_data.config(workdir, steps=steps, mesh=mesh), tiny_data.model(), rows)


@pytest.fixture(scope="module")
def run_222(tmp_path_factory, rows):
    """10 steps on (2, 2, 2), checkpoints at steps 5 and 10."""
    workdir = tmp_path_factory.mktemp("run222")
    result = _trainer(workdir, rows, steps=10, mesh=(2, 2, 2)).run()
    return workdir, jax.tree.map(np.asarray, result.state)


def _steps(ckpt: Path) -> list[int]:
    with C.Checkpointer(ckpt) as checkpointer:
        return checkpointer.steps()


def _copy(workdir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(workdir, tmp_path / "run"))


def test_restore_onto_a_different_mesh_and_continue(run_222, rows, tmp_path):
    workdir, final = run_222
    trainer = _trainer(_copy(workdir, tmp_path), rows, steps=12, mesh=(8, 1, 1))
    assert trainer.start_step == 10
    kernel = trainer.state["params"]["layers"][0]["mlp"]["gate_proj"][...]
    assert kernel.sharding.mesh.shape == {"data": 8, "fsdp": 1, "tensor": 1}
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, trainer.state), final)
    result = trainer.run()
    assert (
        len(result.history) == 2
        and int(result.state["step"]) == 12
        and all(np.isfinite(h["loss"]) for h in result.history)
    )


# A restore that fails part-way leaves tensorstore callbacks aimed at orbax's closed event loop;
# they surface as an "Event loop is closed" unraisable warning when collected.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_damaged_step_is_reported_set_aside_and_the_previous_step_resumes(run_222, rows, tmp_path, caplog):
    workdir = _copy(run_222[0], tmp_path)
    ckpt = workdir / "checkpoints"
    assert _steps(ckpt) == [5, 10]
    data_files = [f for f in (ckpt / "10" / "state").rglob("*") if f.is_file() and f.parent.name == "d"]
    assert data_files
    for f in data_files:  # truncate every array chunk file of step 10
        f.write_bytes(f.read_bytes()[:7])

    config = tiny_data.config(workdir, steps=6)
    abstract = S.abstract_train_state(
        tiny_data.model(), optim.make_optimizer(tiny_data.typed(config).train.optimizer), mesh_lib.make_mesh((1, 1, 1))
    )
    with (
        C.Checkpointer(ckpt) as checkpointer,
        pytest.raises(C.CheckpointError, match=r"step 10 .* truncated or corrupt"),
    ):
        checkpointer.restore(10, abstract)

    with caplog.at_level(logging.ERROR, logger="porch_jax.train.checkpoint"):
        trainer = _trainer(workdir, rows, steps=6, mesh=(1, 1, 1))
    assert trainer.start_step == 5
    assert "checkpoint step 10" in caplog.text and "restarting from step 5" in caplog.text
    assert [p.name for p in ckpt.iterdir() if p.name.startswith("corrupt-10-")]
    result = trainer.run()
    assert int(result.state["step"]) == 6 and _steps(ckpt) == [5, 6]


def test_nan_stops_with_the_step_and_keeps_the_last_good_checkpoint(rows, tmp_path):
    _trainer(tmp_path, rows, steps=4, mesh=(1, 1, 1)).run()  # checkpoints at 4 (every 5, and the last step)
    ckpt = tmp_path / "checkpoints"
    assert _steps(ckpt) == [4]
    poisoned = MethodRows(
        decisions=[
            dataclasses.replace(r, spans=tuple(dataclasses.replace(s, weight=float("nan")) for s in r.spans))
            for r in rows.decisions
        ]
    )
    trainer = _trainer(tmp_path, poisoned, steps=8, mesh=(1, 1, 1))
    with pytest.raises(NonFiniteError, match=r"at step 5: .*last good checkpoint: step 4"):
        trainer.run()
    with C.Checkpointer(ckpt) as checkpointer:
        assert checkpointer.steps() == [4]
        state, _ = checkpointer.restore(4, trainer.abstract_state)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state))


def test_orbax_info_lines_stay_out_of_the_log_and_its_warnings_do_not(tmp_path):
    """A Checkpointer filters orbax's INFO records from absl's handler (a MACA run saves ~50 checkpoints, ~40
    lines each); orbax's warnings and everyone else's INFO pass."""
    import logging

    from absl import logging as absl_logging

    from porch_jax.train.checkpoint import Checkpointer

    Checkpointer(tmp_path / "c", async_save=False).close()
    handler = absl_logging.get_absl_handler()

    def record(path, level):
        return logging.LogRecord("absl", level, path, 1, "message", None, None)

    orbax_file = "/site-packages/orbax/checkpoint/checkpoint_manager.py"
    assert not handler.filter(record(orbax_file, logging.INFO))
    assert handler.filter(record(orbax_file, logging.WARNING))
    assert handler.filter(record("/work/porch_jax/maca/train.py", logging.INFO))
