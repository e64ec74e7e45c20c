"""The typed views a batch holds: one pytree dataclass per kind of row, the fields its loss parts read.

A batch is {view name: view}, the names the roles a method's parts read ("policy", "rwr", "student",
"teacher", MACA's "decisions"); every field is laid out [accum, micro, ...] on the step's mesh (host
arrays [rows, ...] before `sources.place`). The classes are registered pytrees, so `jax.tree.map`, jit
and sharding see their arrays, and a part that reads a field its view does not have fails when the
step is traced, naming the field.

    TokenView    a token row with target spans (packing.seq_batch): SFT, RWR
    SampledView  + the sampler's log-probabilities of one sampled action (packing.scored_batch): OPD
    GroupView    + each row's group advantage: GRPO, DA-GRPO
    ActionsView  decisions over a discrete action set, not token rows (MACA's routing)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

Array = Any  # a numpy array on the host, a jax.Array in the step


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TokenView:
    """tokens/mask [B, T]: the sequence and its real tokens; index/targets/target_mask [B, K]: the column whose
    hidden state predicts each target token, its id, whether it is real; weight [B, K]: its decision's weight over
    the decision's length; count [B]: each row's decisions with a non-zero weight."""

    tokens: Array
    mask: Array
    index: Array
    targets: Array
    target_mask: Array
    weight: Array
    count: Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SampledView(TokenView):
    """A token view of one sampled action per row: logprobs [B, K], the sampler's log-probability of each target
    token where `sampled` [B, K] says it has one (a recorded action may stop short of an appended eos)."""

    logprobs: Array
    sampled: Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GroupView(SampledView):
    """A sampled view whose rows are members of GRPO groups: advantage [B], each row's group-normalised reward."""

    advantage: Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ActionsView:
    """Decisions over a discrete action set [D, A] (MACA): the scorer's `inputs` (any pytree), the `masks` of
    allowed actions, the taken `actions` [D], their sampler log-probabilities `old_logp` [D], `advantage` [D],
    `valid` [D] (padding rows false) and the KL part's `target` log-probabilities [D, A]."""

    inputs: Any
    masks: Array
    actions: Array
    old_logp: Array
    advantage: Array
    valid: Array
    target: Array


View = TokenView | ActionsView
Batch = dict[str, View]
