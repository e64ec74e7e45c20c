"""The training loop: mesh, state, data, step, checkpoints, metrics, on-policy hook, export.

One `Trainer` serves every method. It resumes from the newest readable checkpoint in its workdir
(state, optimizer and data position), saves every `checkpoint.every` steps asynchronously, stops
with `NonFiniteError` (naming the step) before a NaN/inf state can be saved, and exports the final
parameters as a Hugging Face folder when asked.

OPD is on-policy: before each OPOD step an `OnPolicyHook` may replace the OPD targets of this
process's rows with actions the current student samples (`SamplerHook` does it with
porch_jax.models.sampler); without a hook the recorded actions are distilled (off-policy).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, TextIO

import jax
from flax import nnx
from ml_collections import ConfigDict

from porch_jax.train import checkpoint as ckpt_lib
from porch_jax.train import data as data_lib
from porch_jax.train import mesh as mesh_lib
from porch_jax.train import metrics as metrics_lib
from porch_jax.train import optim
from porch_jax.train import step as step_lib

log = logging.getLogger(__name__)


class OnPolicyHook(Protocol):
    """Edits this process's rows of a batch before it is collated, given the current student."""

    def __call__(self, host: data_lib.HostBatch, student: nnx.Module, step: int) -> data_lib.HostBatch: ...


class SamplerHook:
    """OPD's on-policy sampling: the student samples an action for each OPD row under its own
    (hint-free) context; student and teacher then score that action. Sampler log-probabilities
    travel with the target, so the step reports their gap to the trainer's (weight-sync check).

    Single-process only: the embedded sampler jits over the process's own prompts, which a
    multi-host mesh would need as global arrays (a vLLM-backed hook is the multi-host route)."""

    def __init__(
        self,
        tokenizer,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
        max_len: int = 2048,
    ):
        if jax.process_count() > 1:
            raise NotImplementedError("SamplerHook samples with the embedded JAX sampler, which runs in one process")
        self.tokenizer, self.max_len = tokenizer, max_len
        self.max_new_tokens, self.temperature, self.top_p, self.seed = max_new_tokens, temperature, top_p, seed
        self._sampler = None

    def __call__(self, host: data_lib.HostBatch, student: nnx.Module, step: int) -> data_lib.HostBatch:
        from porch_jax.models.sampler import Sampler, SamplingParams

        if self._sampler is None or self._sampler.model is not student:
            self._sampler = Sampler(student, self.tokenizer, max_len=self.max_len)
        slots = [
            (i, j)
            for i, micro in enumerate(host.rows)
            for j, ex in enumerate(micro)
            if ex is not None and "student" in ex.views
        ]
        if not slots:
            return host
        params = SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed + step * 1_000_003,  # a fresh, reproducible draw per step (resume included)
        )
        prompts = [list(host.rows[i][j].views["student"].prompt) for i, j in slots]
        rows = [list(micro) for micro in host.rows]
        for (i, j), c in zip(slots, self._sampler.generate(prompts, params)):
            rows[i][j] = data_lib.with_opd_target(rows[i][j], c.token_ids, c.logprobs)
        return dataclasses.replace(host, rows=rows)


@dataclasses.dataclass
class TrainResult:
    state: step_lib.TrainState
    history: list[dict[str, float]]  # per step run in this process (resumed steps excluded)
    start_step: int
    num_traces: int


def loss_config(cfg: ConfigDict) -> step_lib.LossConfig:
    return step_lib.LossConfig(
        **{f.name: cfg[f.name] for f in dataclasses.fields(step_lib.LossConfig) if f.name in cfg}
    )


class Trainer:
    """Trains `model` (its weights are the initial, e.g. SFT, parameters) on `examples`."""

    def __init__(
        self,
        config: ConfigDict,
        model: nnx.Module,
        examples: Sequence[data_lib.Example],
        *,
        tokenizer=None,
        on_policy: OnPolicyHook | None = None,
        stream: TextIO = sys.stdout,
    ):
        self.config, self.tokenizer, self.on_policy = config, tokenizer, on_policy
        self.workdir = Path(config.workdir)
        self.mesh = mesh_lib.make_mesh(config.mesh.shape)
        self.schedule = optim.learning_rate_schedule(config.train)
        self.tx = optim.make_optimizer(config.train)
        self.graphdef, self.state, self.shardings = step_lib.init_train_state(model, self.tx, self.mesh)
        self.abstract_state = step_lib.abstract_train_state(model, self.tx, self.mesh)
        self.step_fn = step_lib.TrainStep(
            config.method,
            self.graphdef,
            self.tx,
            self.schedule,
            loss_config(config.loss),
            mesh=self.mesh,
            state_shardings=self.shardings,
        )
        spec = self.step_fn.spec
        # The frozen teacher/reference is the initial model, copied because the state is donated.
        self.frozen = jax.tree.map(lambda x: x.copy(), self.state["params"]) if spec.frozen else None
        self.checkpointer = ckpt_lib.Checkpointer(
            self.workdir / "checkpoints", keep=config.checkpoint.keep, async_save=config.checkpoint.async_save
        )
        data_state = data_lib.IteratorState(seed=int(config.data.seed))
        self.start_step = 0
        restored = self.checkpointer.restore_latest(self.abstract_state)
        if restored is not None:
            self.start_step, self.state, saved = restored
            data_state = data_lib.IteratorState.from_json(saved)
        self.batches = data_lib.BatchIterator(
            examples,
            buckets=data_lib.Buckets(tuple(config.data.buckets), tuple(config.data.target_buckets)),
            micro_batch=config.train.micro_batch,
            accum_steps=config.train.accum_steps,
            views=spec.views,
            scalars=spec.scalars,
            pad_id=int(config.data.pad_id),
            batch_sharding=jax.sharding.NamedSharding(self.mesh, mesh_lib.batch_spec(mesh=self.mesh)),
            state=data_state,
            target_reserve=int(config.data.target_reserve),
        )
        tb = self.workdir / "tensorboard" if config.log.tensorboard else None
        self.metrics = metrics_lib.MetricsLogger(tb, config.train.steps, every=config.log.every, stream=stream)
        self._student = nnx.merge(self.graphdef, self.state["params"]) if on_policy is not None else None

    def _host_batch(self, step: int) -> data_lib.HostBatch:
        host = self.batches.next_host_batch()
        if self.on_policy is not None:
            nnx.update(self._student, self.state["params"])
            host = self.on_policy(host, self._student, step)
        return host

    def run(self) -> TrainResult:
        """Trains up to config.train.steps; returns the final state and this run's metrics."""
        total, every = int(self.config.train.steps), int(self.config.checkpoint.every)
        saved = self.checkpointer.steps()
        last_good = saved[-1] if saved else None
        if self.start_step:
            self.metrics.text(f"resumed from step {self.start_step} ({self.checkpointer.directory})")
        history = []
        config_json = json.loads(self.config.to_json())
        try:
            for step in range(self.start_step + 1, total + 1):
                batch = self.batches.to_global(self._host_batch(step))
                args = (self.frozen,) if self.frozen is not None else ()
                self.state, metrics = self.step_fn(self.state, batch, *args)
                metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
                metrics_lib.check_finite(step, metrics, last_good)
                history.append(self.metrics.log(step, metrics))
                if step % every == 0 or step == total:
                    self.checkpointer.save(step, self.state, self.batches.state.to_json(), config_json)
                    last_good = step
            self.checkpointer.wait()
            if self.config.export.dir:
                path = ckpt_lib.export_hf(self.graphdef, self.state["params"], self.config.export.dir, self.tokenizer)
                self.metrics.text(f"exported Hugging Face folder to {path}")
        finally:
            self.checkpointer.close()
            self.metrics.close()
        return TrainResult(self.state, history, self.start_step, self.step_fn.num_traces)
