"""The training loop: one `Trainer` for every method, with the method and the batch source plugged in.

    method = methods.make_method(MethodConfig(name="opod", layout="packed", opd_weight=1.0))
    source = sources.CombinedViews(PackedSource(rwr_rows, ..., view="rwr"), OpdSource(opd_rows, ...))
    Trainer(TrainConfig(steps=100, method=..., optimizer=...), model, method, source, workdir,
            tokenizer=tok, view="dsl").run()

Interfaces:
- `methods.Method` (registered in `methods.METHODS` by name, built from a `MethodConfig`): the
  loss parts a batch feeds (each a pure loss of losses.py returning (sum, count)), their
  coefficients, whether a frozen copy of the initial weights is needed (OPD's teacher, GRPO's
  reference) and the records layout's views.
- `sources.BatchSource`: `(step, student) -> (global batch [accum, micro, ...], host metrics)`,
  `state()` / `restore()` (the data position, saved in each checkpoint); `on_policy` sources read
  the current student, which the trainer keeps in step with the state.
- `step.TrainStep`: the jitted generic step (exact gradient accumulation over accum).

The trainer owns the mesh, the train state (float32 master weights, AdamW), the frozen copy,
Orbax checkpoints (resumed from the newest readable one, with the source's position), metrics
(WORKDIR/metrics.jsonl, progress line with rate and ETA, optional TensorBoard), the source's row
counts (how many rows each source kept, cut and dropped against its largest bucket: a line when
each run starts and WORKDIR/rows.json), the finite guard
(`NonFiniteError` names the step before a NaN/inf state can be saved), the source's own `check_step`
(a served sampler's logprob-gap bound: after the step is logged, before its state is exported or saved) and exports: the final
weights as a Hugging Face folder WORKDIR/export with the tokenizer, and with `export_every` the candidates
WORKDIR/exports/step_N of checkpoint selection; after each, the experiment's `on_export` hook writes what its
policy folders carry (the OPOD experiment: envs.views.write_policy_file).

The model need not be a causal LM: a module without an HF config (MACA's action scorer) trains
the same way; it is exported only when it has one (`export`), and its checkpoints record no model
config. `identity` (what a run is, e.g. MACA's variant, seed and task set) is saved with every
checkpoint, and a workdir holding a checkpoint of another identity is refused, naming what
differs. `on_step` sees each step's metrics before its checkpoint (MACA's per-iteration rows,
probe and progress line) and may add metrics to its row. Without a workdir nothing is kept on disk.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import jax
from flax import nnx

from porch_jax import faults
from porch_jax.train import checkpoint as ckpt_lib
from porch_jax.train import mesh as mesh_lib
from porch_jax.train import metrics as metrics_lib
from porch_jax.train import optim
from porch_jax.train import step as step_lib
from porch_jax.train.config import TrainConfig
from porch_jax.train.methods import Method
from porch_jax.train.overlong import ROWS_FILE
from porch_jax.train.sources import BatchSource
from porch_jax.typed_config import refuse_other_run, to_dict


@dataclasses.dataclass
class TrainResult:
    state: step_lib.TrainState
    history: list[dict[str, float]]  # per step run in this process (resumed steps excluded)
    start_step: int
    num_traces: int


class Trainer:
    """Trains `model` (its weights are the initial, e.g. SFT, parameters) with `method` on `source`'s
    batches into `workdir`; a rerun with the same workdir resumes. `on_export(folder, step)`: called on process 0
    after each HF export is written (the experiment writes what its policy folders carry, e.g. the view file; the
    step is None for an export outside the run's steps). `record`: JSON-able facts saved with every checkpoint's
    config beside what launch/export.py needs (e.g. the policy's view). `export`: write the HF folders (None: when
    the model has an HF config). `identity`: JSON-able facts a resumed checkpoint must match. `on_step(step, metrics)`: called
    after each step, before its checkpoint; what it returns joins the step's metrics. `stream` None: no
    lines. `workdir` None: no checkpoints, metrics file or exports."""

    def __init__(
        self,
        config: TrainConfig,
        model: nnx.Module,
        method: Method,
        source: BatchSource,
        workdir: str | Path | None,
        *,
        tokenizer: Any = None,
        on_export: Callable[[Path, int | None], None] | None = None,
        record: Mapping[str, Any] | None = None,
        stream: TextIO | None = sys.stdout,
        export: bool | None = None,
        identity: Mapping[str, Any] | None = None,
        on_step: Callable[[int, dict[str, float]], Mapping[str, float] | None] | None = None,
        validation: Sequence[Mapping[str, Any]] = (),
        validate_every: int = 0,
    ):
        missing = [(p.name, v) for p in method.parts for v in p.views if v not in source.views]
        if missing:
            part, view = missing[0]
            raise ValueError(
                f"method {method.name!r}: its part {part!r} reads view {view!r}, which the batch source "
                f"({type(source).__name__}) does not yield (it yields {', '.join(map(repr, source.views)) or 'none'})"
            )
        self.config, self.method, self.source, self.tokenizer = config, method, source, tokenizer
        self.on_export, self.record = on_export, json.loads(json.dumps(dict(record or {})))
        self.workdir, self.stream = None if workdir is None else Path(workdir), stream
        self.identity = None if identity is None else json.loads(json.dumps(dict(identity)))
        self.on_step = on_step
        self.validation, self.validate_every = list(validation), validate_every
        if self.validation and validate_every <= 0:
            raise ValueError(f"validation batches need validate_every > 0, got {validate_every}")
        has_hf = hasattr(getattr(model, "config", None), "to_hf")
        self.exports = (has_hf if export is None else export) and self.workdir is not None
        if self.exports and not has_hf:
            raise ValueError("export=True needs a model with an HF config (model.config.to_hf())")
        self.mesh = mesh_lib.make_mesh(config.mesh)
        self.schedule = optim.learning_rate_schedule(config.optimizer, config.optimizer.total_steps or config.steps)
        tx = optim.make_optimizer(config.optimizer, config.optimizer.total_steps or config.steps)
        self.graphdef, self.state, shardings = step_lib.init_train_state(model, tx, self.mesh)
        self.step_fn = step_lib.TrainStep(
            method, self.graphdef, tx, self.schedule, mesh=self.mesh, state_shardings=shardings
        )
        # The frozen teacher/reference is the initial model, copied because the state is donated.
        self.frozen = jax.tree.map(lambda x: x.copy(), self.state["params"]) if method.frozen else None
        ck = config.checkpoint
        self.checkpointer = (
            None
            if self.workdir is None
            else ckpt_lib.Checkpointer(self.workdir / "checkpoints", keep=ck.keep, async_save=ck.async_save)
        )
        self.start_step = 0
        self.abstract_state = step_lib.abstract_train_state(model, tx, self.mesh)
        if self.checkpointer is not None:
            self._check_identity()
            restored = self.checkpointer.restore_latest(self.abstract_state)
            if restored is not None:
                self.start_step, self.state, data_state = restored
                source.restore(data_state)
        self.student = nnx.merge(self.graphdef, self.state["params"])
        self._model_hf = model.config.to_hf() if has_hf else None

    def validation_loss(self) -> float:
        """The method's loss over every validation batch at the current weights (each part's sums and counts added
        over the batches first, so it is their mean, not a mean of batch means)."""
        totals: dict[str, Any] = {}
        for batch in self.validation:
            parts = self.step_fn.parts(self.state["params"], batch, self.frozen)
            totals = parts if not totals else jax.tree.map(lambda a, b: a + b, totals, parts)
        totals = jax.device_get(totals)
        return float(self.method.loss(totals, {k: c for k, (_, c) in totals.items()}))

    def _check_identity(self) -> None:
        """Refuses a workdir whose newest checkpoint records another identity (typed_config.refuse_other_run)."""
        steps = self.checkpointer.steps()
        if self.identity is None or not steps:
            return
        saved = self.checkpointer.config(steps[-1]).get("identity") or {}
        refuse_other_run(self.checkpointer.directory, f"checkpoint {steps[-1]}", saved, self.identity)

    @property
    def export_dir(self) -> Path | None:
        return None if self.workdir is None else self.workdir / "export"

    def candidate_dir(self, step: int) -> Path:
        return self.workdir / "exports" / f"step_{step}"

    def run(self) -> TrainResult:
        """Steps start_step+1..steps; returns the final state and this run's metrics."""
        cfg = self.config
        total, every, export_every = cfg.steps, cfg.checkpoint.every, cfg.export_every
        primary = jax.process_index() == 0
        log_path = None if self.workdir is None or not primary else self.workdir / "metrics.jsonl"
        if log_path is not None:
            self.workdir.mkdir(parents=True, exist_ok=True)
            _truncate_log(log_path, self.start_step)
        tb = self.workdir / "tensorboard" if cfg.log.tensorboard and self.workdir is not None else None
        logger = metrics_lib.MetricsLogger(tb, total, every=cfg.log.every, stream=self.stream)
        if self.start_step:
            logger.text(f"[{self.workdir.name}] resumed from step {self.start_step} ({self.checkpointer.directory})")
        self._report_rows(logger, primary)
        saved = [] if self.checkpointer is None else self.checkpointer.steps()
        history, last_good = [], saved[-1] if saved else None
        # What launch/export.py needs to rebuild the state from a checkpoint alone.
        config_json = self.record | {"train": to_dict(cfg), "model": self._model_hf}
        if self.identity is not None:
            config_json["identity"] = self.identity
        if self.validation and self.start_step == 0 and log_path is not None:  # the curve starts at the initial weights
            with open(log_path, "a") as f:
                f.write(json.dumps({"step": 0, "val_loss": self.validation_loss()}) + "\n")
        try:
            for step in range(self.start_step + 1, total + 1):
                if self.source.on_policy:
                    nnx.update(self.student, self.state["params"])
                batch, host_metrics = self.source(step, self.student)
                args = (self.frozen,) if self.frozen is not None else ()
                self.state, metrics = self.step_fn(self.state, batch, *args)
                metrics = {k: float(v) for k, v in jax.device_get(metrics).items()} | host_metrics
                metrics_lib.check_finite(step, metrics, last_good)
                if self.validation and (step % self.validate_every == 0 or step == total):
                    metrics["val_loss"] = self.validation_loss()
                if self.on_step is not None:
                    metrics |= self.on_step(step, metrics) or {}
                history.append(logger.log(step, metrics))
                if log_path is not None:
                    with open(log_path, "a") as f:
                        f.write(json.dumps({"step": step, **history[-1]}) + "\n")
                self.source.check_step(step, metrics)  # the served sampler's gap bound: logged, its state never saved
                if self.exports and export_every and step % export_every == 0 and step < total:  # the last: final
                    self.export(self.candidate_dir(step), step=step)
                if self.checkpointer is not None and (step % every == 0 or step == total):
                    self.checkpointer.save(step, self.state, self.source.state(), config_json)
                    last_good = step
                if self.workdir is not None:
                    faults.point(f"{self.workdir.name}.step")  # a fault test's kill -9 (porch_jax/faults.py)
            if self.checkpointer is not None:
                self.checkpointer.wait()
        finally:
            if self.checkpointer is not None:
                self.checkpointer.close()
            logger.close()
        if self.exports:
            path = self.export(step=total)
            logger.text(f"exported Hugging Face folder to {path}")
        return TrainResult(self.state, history, self.start_step, self.step_fn.num_traces)

    def _report_rows(self, logger: metrics_lib.MetricsLogger, primary: bool) -> None:
        """The source's row counts (`row_counts`, where it has any): one line, and WORKDIR/rows.json."""
        counts = self.source.row_counts
        if not counts:
            return
        logger.text("rows: " + "; ".join(f"{name} {c.describe()}" for name, c in counts.items()))
        if primary and self.workdir is not None:
            rows = {name: c.to_json() for name, c in counts.items()}
            (self.workdir / ROWS_FILE).write_text(json.dumps(rows, indent=1) + "\n")

    def export(self, path: str | Path | None = None, *, step: int | None = None) -> Path:
        """The current weights as an HF folder with the tokenizer, then `on_export(folder, step)` on process 0."""
        out = ckpt_lib.export_hf(self.graphdef, self.state["params"], path or self.export_dir, self.tokenizer)
        if self.on_export is not None and jax.process_index() == 0:
            self.on_export(out, step)
        return out


def _truncate_log(path: Path, step: int) -> None:
    """Drop logged steps after the checkpoint a run resumes from (they will be run again)."""
    if path.exists():
        keep = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        path.write_text("".join(line + "\n" for line in keep))
