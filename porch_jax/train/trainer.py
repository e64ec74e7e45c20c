"""The training loop: one `Trainer` for every method, with the method and the batch source plugged in.

    method = methods.make_method(MethodConfig(name="opod", layout="packed", opd_weight=1.0))
    source = sources.Joined(PackedSource(rwr_rows, ..., view="rwr"), OpdSource(opd_rows, ...))
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
(WORKDIR/metrics.jsonl, progress line with rate and ETA, optional TensorBoard), the finite guard
(`NonFiniteError` names the step before a NaN/inf state can be saved) and exports: the final
weights as a Hugging Face folder WORKDIR/export with the tokenizer and POLICY_FILE (the policy's
view and step), and with `export_every` the candidates WORKDIR/exports/step_N of checkpoint
selection (`selection_candidates`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, TextIO

import jax
from flax import nnx

from porch_jax.envs.views import POLICY_FILE
from porch_jax.train import checkpoint as ckpt_lib
from porch_jax.train import mesh as mesh_lib
from porch_jax.train import metrics as metrics_lib
from porch_jax.train import optim
from porch_jax.train import step as step_lib
from porch_jax.train.config import TrainConfig
from porch_jax.train.methods import Method
from porch_jax.train.sources import BatchSource
from porch_jax.typed_config import to_dict


@dataclasses.dataclass
class TrainResult:
    state: step_lib.TrainState
    history: list[dict[str, float]]  # per step run in this process (resumed steps excluded)
    start_step: int
    num_traces: int


class Trainer:
    """Trains `model` (its weights are the initial, e.g. SFT, parameters) with `method` on `source`'s
    batches into `workdir`; a rerun with the same workdir resumes. `view`: the context view the policy
    reads (written next to each export)."""

    def __init__(
        self,
        config: TrainConfig,
        model: nnx.Module,
        method: Method,
        source: BatchSource,
        workdir: str | Path,
        *,
        tokenizer: Any = None,
        view: str = "full",
        stream: TextIO = sys.stdout,
    ):
        self.config, self.method, self.source, self.tokenizer, self.view = config, method, source, tokenizer, view
        self.workdir, self.stream = Path(workdir), stream
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
        self.checkpointer = ckpt_lib.Checkpointer(self.workdir / "checkpoints", keep=ck.keep, async_save=ck.async_save)
        self.start_step = 0
        self.abstract_state = step_lib.abstract_train_state(model, tx, self.mesh)
        restored = self.checkpointer.restore_latest(self.abstract_state)
        if restored is not None:
            self.start_step, self.state, data_state = restored
            source.restore(data_state)
        self.student = nnx.merge(self.graphdef, self.state["params"])
        self._model_hf = model.config.to_hf()

    @property
    def export_dir(self) -> Path:
        return self.workdir / "export"

    def candidate_dir(self, step: int) -> Path:
        return self.workdir / "exports" / f"step_{step}"

    def run(self) -> TrainResult:
        """Steps start_step+1..steps; returns the final state and this run's metrics."""
        cfg = self.config
        total, every, export_every = cfg.steps, cfg.checkpoint.every, cfg.export_every
        log_path = self.workdir / "metrics.jsonl"
        primary = jax.process_index() == 0
        if primary:
            self.workdir.mkdir(parents=True, exist_ok=True)
            _truncate_log(log_path, self.start_step)
        tb = self.workdir / "tensorboard" if cfg.log.tensorboard else None
        logger = metrics_lib.MetricsLogger(tb, total, every=cfg.log.every, stream=self.stream)
        if self.start_step:
            logger.text(f"[{self.workdir.name}] resumed from step {self.start_step} ({self.checkpointer.directory})")
        saved = self.checkpointer.steps()
        history, last_good = [], saved[-1] if saved else None
        # What launch/export.py needs to rebuild the state from a checkpoint alone.
        config_json = {"train": to_dict(cfg), "view": self.view, "model": self._model_hf}
        try:
            for step in range(self.start_step + 1, total + 1):
                if self.source.on_policy:
                    nnx.update(self.student, self.state["params"])
                batch, host_metrics = self.source(step, self.student)
                args = (self.frozen,) if self.frozen is not None else ()
                self.state, metrics = self.step_fn(self.state, batch, *args)
                metrics = {k: float(v) for k, v in jax.device_get(metrics).items()} | host_metrics
                metrics_lib.check_finite(step, metrics, last_good)
                history.append(logger.log(step, metrics))
                if primary:
                    with open(log_path, "a") as f:
                        f.write(json.dumps({"step": step, **history[-1]}) + "\n")
                if export_every and step % export_every == 0 and step < total:  # the last is the final export
                    self.export(self.candidate_dir(step), step=step)
                if step % every == 0 or step == total:
                    self.checkpointer.save(step, self.state, self.source.state(), config_json)
                    last_good = step
            self.checkpointer.wait()
        finally:
            self.checkpointer.close()
            logger.close()
        path = self.export(step=total)
        logger.text(f"exported Hugging Face folder to {path}")
        return TrainResult(self.state, history, self.start_step, self.step_fn.num_traces)

    def export(self, path: str | Path | None = None, *, step: int | None = None) -> Path:
        """The current weights as an HF folder with the tokenizer and the policy's view (and the step)."""
        out = ckpt_lib.export_hf(self.graphdef, self.state["params"], path or self.export_dir, self.tokenizer)
        if jax.process_index() == 0:
            (out / POLICY_FILE).write_text(json.dumps({"view": self.view} | ({} if step is None else {"step": step})))
        return out


def selection_candidates(export: str | Path) -> dict[int, Path]:
    """A run's checkpoint-selection candidates by step: its ``exports/step_N`` folders (``export_every``) and,
    when there are any, the final ``export`` folder under the step its POLICY_FILE records."""
    export = Path(export)
    folder = export.parent / "exports"
    found = {int(p.name.split("_", 1)[1]): p for p in folder.glob("step_*") if (p / POLICY_FILE).is_file()}
    final = json.loads((export / POLICY_FILE).read_text()).get("step") if (export / POLICY_FILE).is_file() else None
    if found and final is not None:
        found[int(final)] = export
    return dict(sorted(found.items()))


def _truncate_log(path: Path, step: int) -> None:
    """Drop logged steps after the checkpoint a run resumes from (they will be run again)."""
    if path.exists():
        keep = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        path.write_text("".join(line + "\n" for line in keep))
