"""The typed schema of an OPOD experiment file (experiments/quickstart.py), built and checked once at
launch/pipeline.py; porch_jax/opod/experiment.py reads only these attributes.

Every key is typed here or in the suite's own dataclasses (porch_jax/eval/suite.py: SuiteConfig, TaskSet,
EvalConfig), so an unknown key or a bad value anywhere is a flags error naming it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from porch_jax.eval.suite import EvalConfig, SuiteConfig, TaskSet
from porch_jax.train.config import SamplerConfig
from porch_jax.train.overlong import Overlong
from porch_jax.typed_config import check

# Seed set k (`with_seed_set`): every seed + SEED_SET_STRIDE * k, the SFT rollouts' task seeds
# + ROLLOUT_SEED_STRIDE * k.
SEED_SET_STRIDE, ROLLOUT_SEED_STRIDE = 10, 1_000


@dataclasses.dataclass(frozen=True)
class OpdSection:
    """OPD's on-policy batch: rows per step and the student's sampling of their actions. sampler: the embedded JAX
    sampler or a vLLM server the student is pushed into (train/config.SamplerConfig; train/served_sampler.py)."""

    batch: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    sampler: SamplerConfig = SamplerConfig()


@dataclasses.dataclass(frozen=True)
class GroupSection:
    """DA-GRPO's groups: expert contexts per step and samples per context."""

    contexts_per_step: int
    group_size: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class MethodSection:
    """One method's run. lr_grid: the rates it is trained at (selection picks one; must hold learning_rate).
    hint_rows / empty_hint_rows: SFT only. opd_weight / opd: OPOD only. clip_eps / group: DA-GRPO only."""

    steps: int
    batch: int
    learning_rate: float
    warmup_steps: int
    seed: int
    export_every: int = 0
    lr_grid: tuple[float, ...] | None = None
    hint_rows: float = 0.0
    empty_hint_rows: bool = False
    opd_weight: float = 1.0
    opd: OpdSection | None = None
    clip_eps: float = 0.2
    group: GroupSection | None = None

    def __post_init__(self):
        check(self.steps > 0, "steps", f"must be > 0, got {self.steps}")
        check(self.learning_rate > 0, "learning_rate", f"must be > 0, got {self.learning_rate}")


@dataclasses.dataclass(frozen=True)
class OptimizerSection:
    learning_rate: float
    warmup_steps: int
    final_lr_ratio: float
    weight_decay: float
    b1: float
    b2: float
    eps: float
    max_grad_norm: float
    checkpoint_every: int
    log_every: int


@dataclasses.dataclass(frozen=True)
class ModelSection:
    seed: int
    vocab_size: int
    hf: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class PolicySection:
    """The policy's view, its sampling length, the padded prompt lengths (one compilation each) and the sampler's
    cache (prompt + action).

    overlong: a training row over the largest bucket (every method's batch source): "drop" (left out), "cut" (a
    packed SFT/RWR row keeps its first tokens; an OPD row or DA-GRPO context, whose over-long part is a prompt, is
    dropped: porch_jax/train/overlong.py) or "error". Each training run's counts go to its RUN/<name>/rows.json.
    """

    view: Literal["full", "compact", "dsl"]
    max_new_tokens: int
    buckets: tuple[int, ...]
    max_len: int
    overlong: Overlong = "drop"


@dataclasses.dataclass(frozen=True)
class RolloutSet(TaskSet):
    """The SFT policy's rollouts: a task set and its sampling temperature."""

    temperature: float = 1.0


@dataclasses.dataclass(frozen=True)
class SelectionSection:
    """Checkpoint selection on validation tasks (experiment.select_checkpoints)."""

    enabled: bool
    tasks: TaskSet


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    run_dir: str
    seed: int
    methods: tuple[Literal["sft", "rwr", "opod", "opd_empty", "dagrpo"], ...]
    suite: SuiteConfig
    expert_rollouts: TaskSet
    rollouts: RolloutSet
    eval: EvalConfig
    selection: SelectionSection
    model: ModelSection
    policy: PolicySection
    optimizer: OptimizerSection
    sft: MethodSection
    rwr: MethodSection
    opod: MethodSection
    opd_empty: MethodSection
    dagrpo: MethodSection
    seed_sets: tuple[int, ...] = ()

    def __post_init__(self):
        check(len(set(self.seed_sets)) == len(self.seed_sets), "seed_sets", f"repeats a set: {self.seed_sets}")
        check(all(k >= 0 for k in self.seed_sets), "seed_sets", f"are numbered from 0, got {self.seed_sets}")
        for name in self.methods:
            sec = self.method(name)
            grid = sec.lr_grid or (sec.learning_rate,)
            check(
                sec.learning_rate in grid,
                f"{name}.lr_grid",
                f"{grid} must include its learning_rate {sec.learning_rate}",
            )
            check(
                len(grid) == 1 or self.selection.enabled,
                f"{name}.lr_grid",
                "more than one rate needs checkpoint selection (selection.enabled) to choose among them",
            )
            if name in ("opod", "opd_empty"):
                check(sec.opd is not None, f"{name}.opd", "missing: the on-policy OPD batch of this method")
            if name == "dagrpo":
                check(sec.group is not None, "dagrpo.group", "missing: DA-GRPO's contexts and group size")

    def method(self, name: str) -> MethodSection:
        """The section of method `name` (sft, rwr, opod, opd_empty, dagrpo)."""
        return getattr(self, name)


def _shift_seeds(node: Any, by: int) -> Any:
    """`node` (a dataclass tree) with every int field named `seed` raised by `by`."""
    if not dataclasses.is_dataclass(node):
        return node
    changes = {}
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if f.name == "seed" and isinstance(value, int) and not isinstance(value, bool):
            changes[f.name] = value + by
        elif dataclasses.is_dataclass(value):
            changes[f.name] = _shift_seeds(value, by)
    return dataclasses.replace(node, **changes)


def with_seed_set(cfg: ExperimentConfig, k: int) -> ExperimentConfig:
    """The config of seed set `k`, run in RUN_DIR/seed_set_k: every `seed` field + 10k (initial weights, batch
    order, OPD and GRPO samples, rollout and evaluation sampling) and the SFT rollouts' task seeds + 1,000k. The
    expert data, validation and held-out tasks stay the same, so every set is compared on the same tasks; set 0
    is the config as written (experiments/quickstart.py writes the same sets as `:seed_set=k`)."""
    if k < 0:
        raise ValueError(f"seed sets are numbered from 0, got {k}")
    rollouts = dataclasses.replace(cfg.rollouts, seed_start=cfg.rollouts.seed_start + ROLLOUT_SEED_STRIDE * k)
    others = {
        "expert_rollouts": cfg.expert_rollouts,
        "eval.tasks": cfg.eval.tasks,
        "selection.tasks": cfg.selection.tasks,
    }
    for name, tasks in others.items():
        if rollouts.seed_start < tasks.seeds.stop and tasks.seed_start < rollouts.seeds.stop:
            raise ValueError(
                f"seed set {k}: the SFT rollouts' task seeds {rollouts.seeds[0]}-{rollouts.seeds[-1]} "
                f"overlap {name} ({tasks.seeds[0]}-{tasks.seeds[-1]})"
            )
    shifted = _shift_seeds(cfg, SEED_SET_STRIDE * k)
    return dataclasses.replace(
        shifted, rollouts=rollouts, run_dir=str(Path(cfg.run_dir) / f"seed_set_{k}"), seed_sets=()
    )
