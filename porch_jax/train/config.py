"""The trainer's typed settings (frozen dataclasses, built once at a launcher by porch_jax.typed_config).

A launcher's experiment schema holds these sections; nothing past the launcher reads a ConfigDict.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from porch_jax.typed_config import check, resumable

# What a row over the largest bucket does (train/overlong.py): left out, cut from the right, or an error naming it.
Overlong = Literal["drop", "cut", "error"]

__all__ = [
    "CheckpointConfig",
    "ModelInit",
    "GroupSourceConfig",
    "LogConfig",
    "MethodConfig",
    "OpdSourceConfig",
    "OptimizerConfig",
    "Overlong",
    "SamplerConfig",
    "SamplingConfig",
    "TrainConfig",
]


@dataclasses.dataclass(frozen=True)
class MethodConfig:
    """Attributes:
    name: a key of `METHODS`.
    opd_weight: lambda of OPOD, the weight of the OPD part against the RWR part.
    clip_eps / clip_eps_high: GRPO's ratio clip (high: None is clip_eps).
    kl_coef: GRPO's k3 KL to the frozen reference (> 0 keeps a frozen copy of the initial weights).
    pg_aggregation: GRPO: "token" (mean over the batch's tokens) or "sequence" (per sequence first).
    chunk_size: tokens per fused LM-head chunk (None: automatic).
    target_kl_weight: maca_grpo: the weight of KL(pi || the batch's target distribution) (MACA: lambda to pi_mix).
    """

    name: Literal["sft", "rwr", "opod", "opd", "grpo", "dagrpo", "maca_grpo"] = "sft"
    opd_weight: float = 1.0
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    kl_coef: float = 0.0
    pg_aggregation: Literal["token", "sequence"] = "token"
    chunk_size: int | None = None
    target_kl_weight: float = 0.0


@dataclasses.dataclass(frozen=True)
class ModelInit:
    """The model a run starts from. init_from: a Hugging Face folder (a pretrained model, or make_tiny_model's);
    empty: a fresh model built from `hf` (config.json fields), `vocab_size` (0: the tokenizer's, where the launcher
    knows one) and `seed`. compute_dtype: "bfloat16" runs matmuls in bf16 with float32 master weights; remat
    recomputes each layer's activations in the backward pass (memory for compute)."""

    init_from: str = ""
    hf: dict[str, Any] = dataclasses.field(default_factory=dict)
    vocab_size: int = 0
    seed: int = 0
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    remat: bool = False

    def __post_init__(self):
        check(self.vocab_size >= 0, "vocab_size", f"must be >= 0, got {self.vocab_size}")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with linear warmup and cosine decay (optim.py).

    Attributes:
    learning_rate: the peak rate, reached after warmup_steps.
    final_lr_ratio: the rate at the end of the schedule, as a share of the peak.
    total_steps: the schedule's length; None: the run's steps.
    max_grad_norm: global-norm clip (0: none).
    """

    learning_rate: float = 3e-4
    warmup_steps: int = 0
    final_lr_ratio: float = 0.1
    total_steps: int | None = None
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    max_grad_norm: float = 1.0

    def __post_init__(self):
        check(self.learning_rate > 0, "learning_rate", f"must be > 0, got {self.learning_rate}")
        check(self.warmup_steps >= 0, "warmup_steps", f"must be >= 0, got {self.warmup_steps}")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpoints in WORKDIR/checkpoints: every `every` steps and at the end, the newest `keep` kept."""

    every: int = 50
    keep: int = 3
    async_save: bool = True

    def __post_init__(self):
        check(self.every > 0, "every", f"must be > 0, got {self.every}")
        check(self.keep > 0, "keep", f"must be > 0, got {self.keep}")


@dataclasses.dataclass(frozen=True)
class LogConfig:
    """A progress line every `every` steps; WORKDIR/metrics.jsonl gets every step (and TensorBoard, if asked)."""

    every: int = 10
    tensorboard: bool = False


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """Which sampler draws the student's on-policy samples (train/served_sampler.py holds the served one and its rules).

    Attributes:
    kind: "embedded" (the JAX sampler on the trainer's own weights) or "vllm" (a vLLM server the current student is
        pushed into, without a restart).
    push_every: "vllm": the student is exported and pushed at a step's sampling when the server's weights are this
        many updates behind (and at the first step of every run), so at most push_every - 1 behind when it samples.
    max_logprob_gap: "vllm": the bound on a push step's `logprob_gap` (mean |trainer - sampler| logprob of the
        sampled tokens, the server then holding the trainer's weights); above it the run stops (LogprobGapError).
    push_timeout_s: "vllm": a push (pause, reload, cache reset, resume) ends within about this or stops the run.
    request_timeout_s: "vllm": one sampling request ends within this or stops the run.
    push_parity_tol: "vllm": after each push, the server's and the student's prompt logprobs of a probe (the step's
        first prompt) may differ by at most this (max over tokens), else the run stops (WeightSyncError); None: no
        probe, the gap bound alone checks the push.
    concurrency: "vllm": sampling requests in flight.
    """

    kind: Literal["embedded", "vllm"] = "embedded"
    push_every: int = 1
    max_logprob_gap: float = 0.01
    push_timeout_s: float = resumable(300.0)
    request_timeout_s: float = resumable(300.0)
    push_parity_tol: float | None = 1e-3
    concurrency: int = resumable(16)

    def __post_init__(self):
        check(self.push_every > 0, "push_every", f"must be > 0, got {self.push_every}")
        check(self.max_logprob_gap > 0, "max_logprob_gap", f"must be > 0, got {self.max_logprob_gap}")
        check(self.push_timeout_s > 0, "push_timeout_s", f"must be > 0, got {self.push_timeout_s}")
        check(self.request_timeout_s > 0, "request_timeout_s", f"must be > 0, got {self.request_timeout_s}")
        tol = self.push_parity_tol
        check(tol is None or tol > 0, "push_parity_tol", f"must be > 0 or None (no probe), got {tol}")
        check(self.concurrency > 0, "concurrency", f"must be > 0, got {self.concurrency}")


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """The student's on-policy samples (OPD actions, GRPO groups): a fresh, reproducible draw per step, by the
    sampler `sampler` names."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    sampler: SamplerConfig = SamplerConfig()


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """One training run.

    Attributes:
    steps: optimizer steps.
    method: the loss (methods.py).
    export_every: > 0: also export WORKDIR/exports/step_N every that many steps before the last (the
        candidates of checkpoint selection); the final export is WORKDIR/export.
    mesh: (data, fsdp, tensor) device mesh; product = device count.
    """

    steps: int
    optimizer: OptimizerConfig = OptimizerConfig()
    method: MethodConfig = MethodConfig()
    checkpoint: CheckpointConfig = resumable(CheckpointConfig())
    log: LogConfig = resumable(LogConfig())
    export_every: int = 0
    mesh: tuple[int, ...] = resumable((1, 1, 1))

    def __post_init__(self):
        check(self.steps > 0, "steps", f"must be > 0, got {self.steps}")
        check(self.export_every >= 0, "export_every", f"must be >= 0, got {self.export_every}")


@dataclasses.dataclass(frozen=True)
class OpdSourceConfig:
    """OPD's on-policy batch (sources.OpdSource): rows per step and the student's sampling of their actions."""

    batch: int
    sampling: SamplingConfig

    def __post_init__(self):
        check(self.batch > 0, "batch", f"must be > 0, got {self.batch}")


@dataclasses.dataclass(frozen=True)
class GroupSourceConfig:
    """GRPO's groups (sources.GroupSource): contexts per step, samples per context and their sampling."""

    contexts_per_step: int
    group_size: int
    sampling: SamplingConfig

    def __post_init__(self):
        check(self.contexts_per_step > 0, "contexts_per_step", f"must be > 0, got {self.contexts_per_step}")
        check(self.group_size > 1, "group_size", f"must be > 1 (group advantages), got {self.group_size}")
