"""The typed schema of an OPOD experiment file (experiments/quickstart.py), checked at launch/pipeline.py.

Every key of the training sections is typed here, so an unknown key or a bad value is a flags error
naming it; the task sections (suite, expert_rollouts, rollouts, eval, selection.tasks) are plain data
that the suite builder checks when it reads them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from porch_jax.typed_config import check


@dataclasses.dataclass(frozen=True)
class OpdSection:
    """OPD's on-policy batch: rows per step and the student's sampling of their actions."""

    batch: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0


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
    view: Literal["full", "compact", "dsl"]
    max_new_tokens: int
    buckets: tuple[int, ...]
    max_len: int


@dataclasses.dataclass(frozen=True)
class SelectionSection:
    enabled: bool
    tasks: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    run_dir: str
    seed: int
    methods: tuple[Literal["sft", "rwr", "opod", "opd_empty", "dagrpo"], ...]
    suite: dict[str, Any]
    expert_rollouts: dict[str, Any]
    rollouts: dict[str, Any]
    eval: dict[str, Any]
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
