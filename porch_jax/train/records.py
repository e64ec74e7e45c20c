"""The typed schema of a records run (launch/train.py: data.py examples, one decision per row) and
its Trainer: model, data, batch layout, on-policy OPD sampling and the TrainConfig.

    experiments/sft_tiny.py -> ConfigDict -> RecordsConfig (typed_config.from_dict, at the launcher)
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from porch_jax.train.config import ModelInit, Overlong, SamplingConfig, TrainConfig
from porch_jax.typed_config import check, claim_run_dir, resumable

if TYPE_CHECKING:  # the schema above is read while flags parse, without JAX; the trainer's modules load on use
    from collections.abc import Callable

    from flax import nnx

    from porch_jax.train import data as data_lib
    from porch_jax.train.trainer import Trainer


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Attributes:
    trajectories: EpisodeRecord JSONL (TrajectoryStore). tokenizer: default model.init_from.
    hints: OPOD: JSONL of {episode_id, index, attributable, hint} from the attribution step.
    groups: GRPO: JSONL of {key, context, samples: [{token_ids, logprobs, reward}]}.
    buckets / target_buckets: padded sequence lengths T and target lengths K (one compilation each).
    target_reserve: room for resampled targets (on-policy OPD raises it to opd.max_new_tokens).
    overlong: a decision over the largest (T, K) with its context: "error" (a DataError naming the episode, the
        decision and the lengths, before the first step), "drop" (left out) or "cut" (its target cut from the right,
        its prompt never; a GRPO sample refuses: porch_jax/train/overlong.py). The counts go to WORKDIR/rows.json.
    """

    trajectories: str = ""
    tokenizer: str = ""
    hints: str = ""
    groups: str = ""
    buckets: tuple[int, ...] = (256, 512, 1024)
    target_buckets: tuple[int, ...] = (64, 128, 256)
    target_reserve: int = 0
    overlong: Overlong = "error"
    pad_id: int = 0
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class BatchConfig:
    """Global batch = micro_batch * accum_steps rows; micro-batch rows are sharded over (data, fsdp)."""

    micro_batch: int = 8
    accum_steps: int = 1

    def __post_init__(self):
        check(self.micro_batch > 0, "micro_batch", f"must be > 0, got {self.micro_batch}")
        check(self.accum_steps > 0, "accum_steps", f"must be > 0, got {self.accum_steps}")


@dataclasses.dataclass(frozen=True)
class OpdConfig:
    """OPOD's on-policy OPD: the student samples each OPD row's action (off: the recorded actions are distilled).
    max_len: the sampler's cache length (prompt + action)."""

    on_policy: bool = True
    sampling: SamplingConfig = SamplingConfig()
    max_len: int = 2048


@dataclasses.dataclass(frozen=True)
class RecordsConfig:
    workdir: str = resumable()
    train: TrainConfig
    model: ModelInit = ModelInit()  # vocab_size 0: the tokenizer's
    data: DataConfig = DataConfig()
    batch: BatchConfig = BatchConfig()
    opd: OpdConfig = OpdConfig()

    def __post_init__(self):
        check(self.train.method.layout == "records", "train.method.layout", "launch/train.py trains records")
        check(self.train.method.name != "dagrpo", "train.method.name", "dagrpo runs in the OPOD experiment")
        check(
            not (self.data.overlong == "cut" and self.train.method.name == "grpo"),
            "data.overlong",
            "'cut' cannot cut a GRPO sample (its advantage is the whole sample's reward, which a cut prefix would take "
            "credit for); use 'drop' or 'error'",
        )


def claim_workdir(cfg: RecordsConfig) -> None:
    """Records `cfg` as WORKDIR/config.json, or refuses a workdir that records another config (but for its
    `resumable` fields: the workdir, checkpoint and log cadence, the mesh, the served sampler's transport), naming
    the keys that differ: a rerun resumes from the newest checkpoint, which must be this config's run."""
    claim_run_dir(cfg.workdir, cfg, defaults={"model": {"vocab_size": 0}})  # a key newer than some workdirs


def records_trainer(
    cfg: RecordsConfig,
    model: nnx.Module,
    examples: Sequence[data_lib.Example],
    *,
    tokenizer: Any = None,
    pad_id: int | None = None,
    stream: TextIO = sys.stdout,
    server: Any = None,
    on_export: Callable[[Path, int | None], None] | None = None,
) -> Trainer:
    """The Trainer of a records run: `examples` through a RecordSource laid out as the method reads them. `server`:
    the started VLLMServer a "vllm" sampler (opd.sampling.sampler) samples on, its pushes under WORKDIR/served_weights.
    `on_export`: the Trainer's hook after each export (launch/train.py marks the folder with its view)."""
    from porch_jax.train import data as data_lib
    from porch_jax.train import mesh as mesh_lib
    from porch_jax.train.methods import make_method
    from porch_jax.train.served_sampler import served_action_sampler
    from porch_jax.train.sources import ActionSampler, RecordSource
    from porch_jax.train.trainer import Trainer

    method = make_method(cfg.train.method)
    on_policy = method.name == "opod" and cfg.opd.on_policy
    mesh = mesh_lib.make_mesh(cfg.train.mesh)
    sampler = None
    if on_policy:
        export_dir = Path(cfg.workdir) / "served_weights"
        sampler = served_action_sampler(cfg.opd.sampling, tokenizer, server=server, export_dir=export_dir)
        sampler = sampler or ActionSampler(tokenizer, cfg.opd.sampling, mesh, max_len=cfg.opd.max_len)
    reserve = max(cfg.data.target_reserve, cfg.opd.sampling.max_new_tokens) if on_policy else cfg.data.target_reserve
    source = RecordSource(
        examples,
        views=method.views,
        scalars=method.scalars,
        buckets=data_lib.Buckets(cfg.data.buckets, cfg.data.target_buckets),
        micro_batch=cfg.batch.micro_batch,
        accum_steps=cfg.batch.accum_steps,
        pad_id=cfg.data.pad_id if pad_id is None else pad_id,
        seed=cfg.data.seed,
        mesh=mesh,
        target_reserve=reserve,
        sampler=sampler,
        overlong=cfg.data.overlong,
    )
    return Trainer(
        cfg.train, model, method, source, cfg.workdir, tokenizer=tokenizer, stream=stream, on_export=on_export
    )
