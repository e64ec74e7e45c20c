"""Orbax checkpoints of a run: train state, data-iterator position and config, per step.

Saves are asynchronous (training continues while the arrays are written) and keep the newest
`keep` steps. A restore targets abstract arrays carrying the *current* mesh's shardings, so a
run saved on one mesh shape resumes on another. A step that fails to restore (truncated or
corrupt files) is reported by name, moved aside (never deleted: it is evidence) and the previous
kept step is tried, so a crash during a save costs at most the steps since the one before it.
Orbax's INFO lines (~40 per save) are kept out of absl's log (`quiet_orbax`); PORCH_JAX_ORBAX_LOGS=1 keeps them.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Self

import jax
import orbax.checkpoint as ocp
from flax import nnx

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint step that cannot be restored; the message names the step and directory."""


def _not_orbax_info(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or f"{os.sep}orbax{os.sep}" not in record.pathname


def quiet_orbax() -> None:
    """Drops orbax's records below WARNING from absl's handler, where they would bury a run's own progress lines
    (a MACA experiment saves ~50 checkpoints); its warnings and errors still show. Idempotent."""
    from absl import logging as absl_logging

    handler = absl_logging.get_absl_handler()
    if os.environ.get("PORCH_JAX_ORBAX_LOGS") != "1" and _not_orbax_info not in handler.filters:
        handler.addFilter(_not_orbax_info)


class Checkpointer:
    def __init__(self, directory: str | Path, *, keep: int = 3, async_save: bool = True):
        quiet_orbax()
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=async_save, create=True, cleanup_tmp_directories=True
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def steps(self) -> list[int]:
        """Finished (committed) steps, oldest first."""
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: Any, data_state: dict[str, Any], config: dict[str, Any]) -> None:
        """Starts writing step `step` (returns before the write finishes when asynchronous)."""
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(data_state),
            config=ocp.args.JsonSave(config),
        )
        self.manager.save(step, args=args, force=True)

    def config(self, step: int) -> dict[str, Any]:
        """The config saved with `step` (what the run was), without reading its arrays."""
        return self.manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
        """(state on abstract_state's shardings, data-iterator state) of `step`; CheckpointError if unreadable."""
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore())
        try:
            restored = self.manager.restore(step, args=args)
            state, data = restored["state"], restored["data"]
            if not isinstance(data, dict):
                raise TypeError(f"data-iterator state is {type(data).__name__}, not a JSON object")
        except Exception as e:  # orbax/tensorstore raise many kinds for damaged files
            raise CheckpointError(
                f"checkpoint step {step} in {self.directory} is truncated or corrupt: {type(e).__name__}: {str(e)[:300]}"
            ) from e
        return state, data

    def restore_latest(self, abstract_state: Any) -> tuple[int, Any, dict[str, Any]] | None:
        """Restores the newest readable step, moving unreadable newer ones aside; None if there is none."""
        for step in reversed(self.steps()):
            try:
                state, data = self.restore(step, abstract_state)
            except CheckpointError as e:
                moved = self._quarantine(step)
                older = [s for s in self.steps() if s < step]
                log.error(
                    "%s; moved it to %s; %s",
                    e,
                    moved,
                    f"restarting from step {older[-1]}" if older else "no older step",
                )
                continue
            log.info("restored step %d from %s", step, self.directory)
            return step, state, data
        return None

    def _quarantine(self, step: int) -> Path:
        """Moves a damaged step directory out of orbax's view (so the step can be saved again)."""
        source = self.directory / str(step)
        target = self.directory / f"corrupt-{step}-{int(time.time())}"
        if jax.process_index() == 0 and source.exists():
            source.rename(target)
        _sync(f"quarantine-{step}")
        self.manager.reload()
        return target

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are committed."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sync(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def export_hf(graphdef: nnx.GraphDef, params: nnx.State, path: str | Path, tokenizer=None) -> Path:
    """Writes params as a Hugging Face safetensors folder that transformers loads and a running vLLM server can take
    as a weight push (``export_for_serving``: a tied model's output head as its own tensor)."""
    from porch_jax.serving.weights import export_for_serving

    return export_for_serving(nnx.merge(graphdef, params), path, tokenizer=tokenizer)
