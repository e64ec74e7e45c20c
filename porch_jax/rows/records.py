"""A records run (launch/train.py): its typed schema, its rows and its Trainer.

    experiments/sft_tiny.py -> ConfigDict -> RecordsConfig (typed_config.from_dict, at the launcher)
    record files -> MethodRows (the method's rows, in the one row format) -> records_trainer -> Trainer

Each recorded decision is a one-span row (packing.SeqRow): its prompt, then its target tokens as one span of
weight 1, so every method averages within each decision, then over decisions, as the OPOD experiment's packed rows
do. SFT trains every valid decision ("policy"); RWR the decisions of successful episodes; OPOD those ("rwr") plus an
OPD row (student prompt s, teacher prompt s ⊕ H) per decision the attribution flagged, whose action the current
student samples; GRPO replays recorded groups (`RecordedGroups`: the recorded samples, their log-probabilities and
rewards). Batches are drawn by (data.seed, step), so a resumed run sees the same ones.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from porch_jax.train.config import ModelInit, OpdSourceConfig, Overlong, SamplingConfig, TrainConfig
from porch_jax.typed_config import check, claim_run_dir, resumable

if TYPE_CHECKING:  # the schema above is read while flags parse, without JAX; the trainer's modules load on use
    from collections.abc import Callable

    from flax import nnx

    from porch_jax.train.packing import OpdRow, RecordedGroup, SeqRow
    from porch_jax.train.trainer import Trainer


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Attributes:
    trajectories: EpisodeRecord JSONL (TrajectoryStore). tokenizer: default model.init_from.
    hints: OPOD: JSONL of {episode_id, index, attributable, hint} from the attribution step.
    groups: GRPO: JSONL of {key, context, samples: [{token_ids, logprobs, reward}]}, every group one size.
    buckets: padded row lengths T (one compilation each): a decision's prompt and target; for OPD rows and GRPO
        groups, the prompt, the sampled action's room added.
    overlong: a row over the largest bucket: "error" (a DataError naming the episode and decision, or the group,
        before the first step), "drop" (left out) or "cut" (a decision's target cut from the right; prompts and
        GRPO samples never: porch_jax/train/overlong.py). The counts go to WORKDIR/rows.json.
    seed: the draw of each step's rows.
    """

    trajectories: str = ""
    tokenizer: str = ""
    hints: str = ""
    groups: str = ""
    buckets: tuple[int, ...] = (256, 512, 1024)
    overlong: Overlong = "error"
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class BatchConfig:
    """Global batch = micro_batch * accum_steps rows (GRPO: that many samples, whole groups); micro-batch rows are
    sharded over (data, fsdp). OPOD's OPD rows per step are `opd.batch`, split over the same accumulation steps."""

    micro_batch: int = 8
    accum_steps: int = 1

    def __post_init__(self):
        check(self.micro_batch > 0, "micro_batch", f"must be > 0, got {self.micro_batch}")
        check(self.accum_steps > 0, "accum_steps", f"must be > 0, got {self.accum_steps}")

    @property
    def rows(self) -> int:
        return self.micro_batch * self.accum_steps


@dataclasses.dataclass(frozen=True)
class RecordsConfig:
    """A records run: where it writes (`workdir`), what it trains (`train`, from `model`), on which records (`data`),
    in which batches (`batch`) and, for OPOD, how many OPD rows a step and how the student samples their actions
    (`opd`)."""

    workdir: str = resumable()
    train: TrainConfig
    model: ModelInit = ModelInit()  # vocab_size 0: the tokenizer's
    data: DataConfig = DataConfig()
    batch: BatchConfig = BatchConfig()
    opd: OpdSourceConfig = OpdSourceConfig(batch=8, sampling=SamplingConfig())

    def __post_init__(self):
        name = self.train.method.name
        check(
            name in ("sft", "rwr", "opod", "grpo"),
            "train.method.name",
            f"launch/train.py trains sft, rwr, opod and grpo on records, not {name!r} (dagrpo runs in the OPOD "
            "experiment, maca_grpo in MACA's)",
        )
        check(
            self.opd.batch % self.batch.accum_steps == 0,
            "opd.batch",
            f"{self.opd.batch} OPD rows do not split into {self.batch.accum_steps} accumulation steps",
        )


def claim_workdir(cfg: RecordsConfig) -> None:
    """Records `cfg` as WORKDIR/config.json, or refuses a workdir that records another config (but for its
    `resumable` fields: the workdir, checkpoint and log cadence, the mesh, the served sampler's transport), naming
    the keys that differ: a rerun resumes from the newest checkpoint, which must be this config's run."""
    claim_run_dir(cfg.workdir, cfg)


# ------------------------------------------------------------------------------------------------ rows


@dataclasses.dataclass(frozen=True)
class MethodRows:
    """A records run's rows: `decisions` (one-span rows: SFT's and RWR's "policy", OPOD's "rwr"), `opd` (OPOD's
    flagged decisions) and `groups` (GRPO's)."""

    decisions: Sequence[SeqRow] = ()
    opd: Sequence[OpdRow] = ()
    groups: Sequence[RecordedGroup] = ()


def decision_rows(episodes: Iterable, tokenizer, *, tools: Sequence[Mapping] | None = None) -> list[SeqRow]:
    """Every valid decision of `episodes` (successful or not: expert imitation) as a one-span row."""
    from porch_jax.rows.decisions import decision_prompt, decision_target, template_kwargs, valid_decisions
    from porch_jax.train.packing import SeqRow, Span

    rows = []
    for ep, d in valid_decisions(episodes):
        prompt = decision_prompt(tokenizer, ep.episode_id, d, tools, template_kwargs(ep))
        target = decision_target(tokenizer, d)
        rows.append(SeqRow(tuple(prompt + target), (Span(len(prompt), len(target)),), (ep.episode_id, d.index)))
    return rows


def opd_rows(
    episodes: Iterable,
    tokenizer,
    hints: Mapping[tuple[str, int], str],
    *,
    tools: Sequence[Mapping] | None = None,
) -> list[OpdRow]:
    """An OPD row per decision the attribution flagged (it has a hint): the student reads s, the teacher s ⊕ H
    (the attribution's `teacher_context`); the action is the current student's sample."""
    from porch_jax.attribution.grm import teacher_context
    from porch_jax.protocol.render import prompt_ids
    from porch_jax.rows.decisions import decision_prompt, template_kwargs, valid_decisions
    from porch_jax.train.packing import OpdRow

    rows = []
    for ep, d in valid_decisions(episodes):
        hint = hints.get((ep.episode_id, d.index))
        if hint:
            student = decision_prompt(tokenizer, ep.episode_id, d, tools, template_kwargs(ep))
            teacher = prompt_ids(tokenizer, teacher_context(d.context, hint), tools, **template_kwargs(ep))
            rows.append(OpdRow((ep.episode_id, d.index), tuple(student), tuple(teacher)))
    return rows


def recorded_groups(
    groups: Iterable[Mapping[str, Any]], tokenizer, *, tools: Sequence[Mapping] | None = None
) -> list[RecordedGroup]:
    """GRPO groups from rows {key, context, samples: [{token_ids, logprobs, reward}]}; a row without one of those
    fields is a DataError naming the group."""
    from porch_jax.protocol.render import prompt_ids
    from porch_jax.train.packing import DataError, RecordedGroup, RecordedSample

    out = []
    for i, g in enumerate(groups):
        try:
            samples = tuple(
                RecordedSample(
                    tuple(int(t) for t in s["token_ids"]), tuple(float(x) for x in s["logprobs"]), float(s["reward"])
                )
                for s in g["samples"]
            )
            out.append(RecordedGroup(g["key"], tuple(prompt_ids(tokenizer, g["context"], tools)), samples))
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(
                f"GRPO group {g.get('key', f'#{i}')!r}: {type(e).__name__} {e} (a group holds key, "
                "context and samples of {token_ids, logprobs, reward})"
            ) from None
    return out


def method_rows(
    cfg: RecordsConfig,
    tokenizer,
    *,
    episodes: Iterable = (),
    hints: Mapping[tuple[str, int], str] | None = None,
    groups: Iterable[Mapping[str, Any]] = (),
) -> MethodRows:
    """The rows `cfg`'s method trains on, from its episodes (and OPOD's hints) or GRPO's recorded groups."""
    name = cfg.train.method.name
    if name == "grpo":
        return MethodRows(groups=recorded_groups(groups, tokenizer))
    episodes = list(episodes)
    if name == "sft":
        return MethodRows(decisions=decision_rows(episodes, tokenizer))
    successful = decision_rows([ep for ep in episodes if ep.outcome.success], tokenizer)
    if name == "rwr":
        return MethodRows(decisions=successful)
    return MethodRows(decisions=successful, opd=opd_rows(episodes, tokenizer, hints or {}))


# ---------------------------------------------------------------------------------------------- trainer


def records_trainer(
    cfg: RecordsConfig,
    model: nnx.Module,
    rows: MethodRows,
    *,
    tokenizer: Any = None,
    stream: TextIO = sys.stdout,
    server: Any = None,
    on_export: Callable[[Path, int | None], None] | None = None,
) -> Trainer:
    """The Trainer of a records run on `rows`: SFT/RWR through a PackedSource ("policy"), OPOD through RWR rows
    ("rwr") beside on-policy OPD rows (OPD alone without successful episodes, RWR alone without flagged decisions:
    `method_for_views`), GRPO through RecordedGroups. `server`: the started VLLMServer a "vllm" sampler
    (opd.sampling.sampler) samples on, its pushes under WORKDIR/served_weights. `on_export`: the Trainer's hook after
    each export (launch/train.py marks the folder with its view)."""
    from porch_jax.train import mesh as mesh_lib
    from porch_jax.train import sources
    from porch_jax.train.methods import make_method, method_for_views
    from porch_jax.train.served_sampler import served_action_sampler
    from porch_jax.train.trainer import Trainer

    mesh = mesh_lib.make_mesh(cfg.train.mesh)
    d, b, name = cfg.data, cfg.batch, cfg.train.method.name
    args = dict(buckets=d.buckets, mesh=mesh, overlong=d.overlong, accum_steps=b.accum_steps)
    if name == "grpo":
        size = len(rows.groups[0].samples) if rows.groups else 1
        check(b.rows % size == 0, "batch", f"{b.rows} rows a step do not hold whole GRPO groups of {size} samples")
        source = sources.RecordedGroups(rows.groups, b.rows // size, seed=d.seed, **args)
    elif name in ("sft", "rwr"):
        source = sources.PackedSource(rows.decisions, b.rows, seed=d.seed, **args)
    else:
        parts = []
        if rows.decisions:
            parts.append(sources.PackedSource(rows.decisions, b.rows, seed=d.seed, view="rwr", **args))
        if rows.opd:
            export_dir = Path(cfg.workdir) / "served_weights"
            sampler = served_action_sampler(cfg.opd.sampling, tokenizer, server=server, export_dir=export_dir)
            parts.append(
                sources.OpdSource(rows.opd, tokenizer, cfg.opd.sampling, cfg.opd.batch, sampler=sampler, **args)
            )
        if not parts:
            raise ValueError("OPOD has no rows: no successful episode and no flagged decision")
        source = parts[0] if len(parts) == 1 else sources.CombinedViews(*parts)
    train = dataclasses.replace(cfg.train, method=method_for_views(cfg.train.method, source.views))
    return Trainer(
        train,
        model,
        make_method(train.method),
        source,
        cfg.workdir,
        tokenizer=tokenizer,
        stream=stream,
        on_export=on_export,
    )
