"""Orchestration policies pi_theta(a | s) over A = pool + {STOP}, as parametric scorers l(a | s) that Eq. 11
masks and normalises over the allowed set (so an invalid action is never chosen).

- `LMScorer`: our JAX causal LM reads the rendered state and scores each allowed action by the summed
  log-probabilities of its name's tokens as the continuation. The state is encoded once with a KV cache
  and every (state, allowed action) pair continues from it, so the prompt is not re-read per action.
  A from-scratch LM gives every token about 1/V, so summed log-probs alone would rank actions by name
  length; `uniform_offset` adds len(name) * log V (a constant per action: it moves the starting point to
  about uniform over the allowed set and leaves every gradient unchanged). Turn it off for a pretrained LM.
- `router_policy`: a pretrained instruction LM as a router, untrained: each state is rendered as Table 11's
  router prompt listing the agents H allows (`orchestrator.render_router_state`) in the model's chat template,
  and each allowed name is scored as the assistant's reply (MACA's w/o pi_theta, `analysis.Study.make_router`).
- `HeadScorer`: a small MLP over state features (the task's sentence embedding, the last agent, the
  agents called, the remaining budget): the same policy interface, fast enough for CPU sweeps.

`ActionPolicy` holds a scorer's parameters and is the rollout's `ActionScorer`; `policy_log_probs` is the
same distribution as a pure function of the parameters (pi_ref's scores). GRPO trains the scorer module
itself in the one trainer (porch_jax/train/trainer.py), whose "actions" parts call it on a batch's inputs
and normalise under the same masks (train/methods.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from porch_jax.maca.orchestrator import STOP, State, bucket, render_router_state, render_state
from porch_jax.maca.policy import masked_log_probs
from porch_jax.maca.pools import AgentPool
from porch_jax.models import KVCache, ModelConfig, init_model
from porch_jax.models.sharding import data_sharding, shard_model
from porch_jax.train.mesh import replicated

Inputs = dict[str, np.ndarray]
Encoder = Callable[[Sequence[State], np.ndarray], Inputs]  # (states, masks padded to the batch bucket)
Render = Callable[[State, np.ndarray], str]  # (state, its allowed set bool [A]) -> the text the LM reads


def pad_masks(masks: np.ndarray, rows: int) -> np.ndarray:
    """Masks padded to `rows`; padding rows allow only STOP, so their softmax stays finite."""
    out = np.zeros((rows, masks.shape[1]), bool)
    out[:, -1] = True
    out[: len(masks)] = masks
    return out


def policy_log_probs(
    graphdef: nnx.GraphDef, params: nnx.State, inputs: Mapping[str, jax.Array], mask: jax.Array
) -> jax.Array:
    """Eq. 11: log pi_masked(a | s) [B, A] of a scorer's parameters, pure (rollouts' and pi_ref's scores)."""
    return masked_log_probs(nnx.merge(graphdef, params)(inputs), mask)


_log_probs = jax.jit(policy_log_probs, static_argnums=0)


class ActionPolicy:
    """A scorer module plus the host-side encoder of its inputs. Batches are padded to powers of two of
    at least `min_rows` rows: every new shape costs a compilation, which for an LM is seconds. With `max_rows`,
    a call scores its states in chunks of at most that many rows (the memory an LM's per-action KV cache takes
    grows with the rows scored at once); `inputs` and `scored` (the trainer's path) never chunk.

    With a `mesh` (train.mesh.make_mesh: data, fsdp, tensor) the parameters are placed by the model's logical
    axes, as the trainers place them (an LM's matrices over fsdp and tensor; a module without annotations,
    the head, replicated), each batch's rows go over the data-parallel axes where they divide, and scoring runs
    under the mesh; GRPO's trainer builds a mesh of the same shape for its updates, so the same code trains a
    policy too large for one device."""

    def __init__(
        self,
        module: nnx.Module,
        encode: Encoder,
        *,
        min_rows: int = 8,
        max_rows: int | None = None,
        mesh: Mesh | None = None,
    ):
        if max_rows is not None and max_rows < 1:
            raise ValueError(f"max_rows must be >= 1 or None, got {max_rows}")
        if mesh is not None:
            shard_model(module, mesh)
        self.graphdef, self.params = nnx.split(module)
        self.encode = encode
        self.min_rows = min_rows
        self.max_rows = max_rows
        self.mesh = mesh

    def placement(self) -> contextlib.AbstractContextManager:
        """The context scoring and updates run in: the mesh, where there is one."""
        return jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()

    def inputs(self, states: Sequence[State], masks: np.ndarray) -> tuple[Inputs, np.ndarray]:
        """Encoded inputs and masks, both padded to the batch bucket of len(states)."""
        padded = pad_masks(masks, bucket(len(states), self.min_rows))
        encoded = self.encode(states, padded)
        if self.mesh is not None:  # rows over the data-parallel axes (where they divide); the rest replicated
            rows = len(padded)
            by_row = data_sharding(self.mesh, rows=rows)
            encoded = {
                k: jax.device_put(v, by_row if v.shape[:1] == (rows,) else replicated(self.mesh))
                for k, v in encoded.items()
            }
        return encoded, padded

    def scored(self, inputs: Inputs, masks: np.ndarray, params: nnx.State | None = None) -> jax.Array:
        """Eq. 11 log-probs of encoded inputs (compiled once per padded shape), by default at `self.params`."""
        with self.placement():
            return _log_probs(self.graphdef, self.params if params is None else params, inputs, masks)

    def __call__(self, states: Sequence[State], masks: np.ndarray) -> np.ndarray:
        if self.max_rows is None or len(states) <= self.max_rows:
            inputs, padded = self.inputs(states, masks)
            return np.asarray(self.scored(inputs, padded))[: len(states)]
        step = self.max_rows
        return np.concatenate([self(states[i : i + step], masks[i : i + step]) for i in range(0, len(states), step)])


# ---------------------------------------------------------------------------------------------------
# The LM policy.
# ---------------------------------------------------------------------------------------------------


class LMScorer(nnx.Module):
    """l(a | s) = sum of log p_LM(name_a tokens | rendered s) (+ the encoder's per-action offset)."""

    def __init__(self, lm: nnx.Module):
        self.lm = lm

    def __call__(self, inputs: Mapping[str, jax.Array]) -> jax.Array:
        prefix, prefix_mask = inputs["prefix"], inputs["prefix_mask"]
        ids, ids_mask = inputs["action_ids"][inputs["pair_action"]], inputs["action_mask"][inputs["pair_action"]]
        rows, t = prefix.shape
        cache = KVCache.init(self.lm.config, rows, t + ids.shape[1])
        hidden, cache = self.lm.hidden_states(prefix, attention_mask=prefix_mask, cache=cache, cache_index=0)
        head = self.lm.lm_head_kernel()
        first = jax.nn.log_softmax(hidden[:, -1] @ head, axis=-1)  # next-token log-probs after each state
        s = inputs["pair_state"]
        pair_cache = KVCache(k=cache.k[:, s], v=cache.v[:, s], mask=cache.mask[s])
        cont, _ = self.lm.hidden_states(ids, attention_mask=ids_mask, cache=pair_cache, cache_index=t)
        rest = jax.nn.log_softmax(cont[:, :-1] @ head, axis=-1)
        rest = jnp.take_along_axis(rest, ids[:, 1:, None], axis=-1)[..., 0]
        score = first[s, ids[:, 0]] + jnp.sum(jnp.where(ids_mask[:, 1:], rest, 0.0), axis=-1)
        score = score + inputs["offset"][inputs["pair_action"]]
        target = jnp.where(inputs["pair_valid"], s, rows)  # padding pairs fall off the end and are dropped
        scores = jnp.zeros((rows, inputs["action_ids"].shape[0]), jnp.float32)
        return scores.at[target, inputs["pair_action"]].set(score, mode="drop")


@dataclasses.dataclass
class LMEncoder:
    """Renders states as text and lists the allowed (state, action) pairs the LM scorer continues. `render`
    (default: `render_state`, the compact text) turns a state and its allowed set into the prompt; each action's
    continuation is `action_prefix` + its name."""

    tokenizer: Any
    names: Sequence[str]
    vocab_size: int
    max_task_words: int | None = None
    uniform_offset: bool = True
    length_multiple: int = 64  # prompt lengths are padded up to a multiple of this
    min_pairs: int = 256  # (state, action) pairs are padded to a power of two at least this
    render: Render | None = None
    action_prefix: str = " "

    def __post_init__(self) -> None:
        ids = [self.tokenizer.encode(self.action_prefix + a, add_special_tokens=False) for a in (*self.names, STOP)]
        width = max(map(len, ids))
        self.action_ids = np.zeros((len(ids), width), np.int32)
        self.action_mask = np.zeros((len(ids), width), bool)
        for a, row in enumerate(ids):
            self.action_ids[a, : len(row)] = row
            self.action_mask[a, : len(row)] = True
        lengths = self.action_mask.sum(-1).astype(np.float32)
        self.offset = lengths * math.log(self.vocab_size) if self.uniform_offset else np.zeros_like(lengths)
        self.pad_id = self.tokenizer.pad_token_id or 0

    def __call__(self, states: Sequence[State], masks: np.ndarray) -> Inputs:
        if self.render is None:
            texts = [render_state(s, self.names, max_task_words=self.max_task_words) for s in states]
        else:
            texts = [self.render(s, m) for s, m in zip(states, masks, strict=False)]
        encoded = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        rows = len(masks)
        t = -(-max(map(len, encoded)) // self.length_multiple) * self.length_multiple
        prefix = np.full((rows, t), self.pad_id, np.int32)
        prefix_mask = np.zeros((rows, t), bool)
        prefix_mask[:, -1] = True  # padding rows hold one token so their attention has a key
        for r, ids in enumerate(encoded):  # left padding: every row ends at the same slot
            prefix[r, t - len(ids) :] = ids
            prefix_mask[r, t - len(ids) :] = True
        state_idx, action_idx = np.nonzero(masks)
        pairs = bucket(len(state_idx), self.min_pairs)
        pad = pairs - len(state_idx)
        return {
            "prefix": prefix,
            "prefix_mask": prefix_mask,
            "action_ids": self.action_ids,
            "action_mask": self.action_mask,
            "offset": self.offset,
            "pair_state": np.concatenate([state_idx, np.zeros(pad, np.int64)]).astype(np.int32),
            "pair_action": np.concatenate([action_idx, np.zeros(pad, np.int64)]).astype(np.int32),
            "pair_valid": np.arange(pairs) < len(state_idx),
        }


def tiny_lm(seed: int = 0, vocab_size: int = 1024, **overrides: Any) -> tuple[nnx.Module, Any]:
    """A tiny random Qwen3 and its tokenizer, built in-process (what `make_tiny_model` writes to disk)."""
    from porch_jax.models.tiny import _HF_CONFIGS, build_tokenizer

    tokenizer = build_tokenizer(vocab_size)
    hf = _HF_CONFIGS["qwen3"](tokenizer)
    hf.update(overrides)
    return init_model(ModelConfig.from_hf(hf), seed=seed), tokenizer


def lm_policy(
    lm: nnx.Module,
    tokenizer: Any,
    names: Sequence[str],
    *,
    max_task_words: int | None = None,
    uniform_offset: bool = True,
    min_rows: int = 32,
    mesh: Mesh | None = None,
) -> ActionPolicy:
    encoder = LMEncoder(tokenizer, names, lm.config.vocab_size, max_task_words, uniform_offset)
    return ActionPolicy(LMScorer(lm), encoder, min_rows=min_rows, mesh=mesh)


@dataclasses.dataclass(frozen=True)
class ChatRouterRender:
    """`render_router_state` as the user turn of the tokenizer's chat template, the assistant's turn opened: the
    agent's name is the reply's first tokens."""

    tokenizer: Any
    pool: AgentPool
    max_task_words: int | None = None

    def __post_init__(self) -> None:
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                "the pretrained LM router needs a tokenizer with a chat template (an instruction model's folder); "
                f"{type(self.tokenizer).__name__} has none"
            )

    def __call__(self, state: State, allowed: np.ndarray) -> str:
        text = render_router_state(state, self.pool, allowed, max_task_words=self.max_task_words)
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )


def router_policy(
    lm: nnx.Module,
    tokenizer: Any,
    pool: AgentPool,
    *,
    max_task_words: int | None = None,
    max_rows: int = 8,
    min_pairs: int = 64,
    length_multiple: int = 128,
    mesh: Mesh | None = None,
) -> ActionPolicy:
    """A pretrained chat LM routing inside Eq. 11's mask, untrained: l(a | s) = log p_LM(name_a | router prompt
    of s), the name right after the opened assistant turn, no per-action offset. States are scored `max_rows`
    at a time (padded to that many rows, so few shapes compile), their allowed pairs padded to a power of two of
    at least `min_pairs`, prompts to a multiple of `length_multiple` tokens."""
    render = ChatRouterRender(tokenizer, pool, max_task_words)
    encoder = LMEncoder(
        tokenizer,
        pool.names,
        lm.config.vocab_size,
        max_task_words,
        uniform_offset=False,
        length_multiple=length_multiple,
        min_pairs=min_pairs,
        render=render,
        action_prefix="",
    )
    return ActionPolicy(LMScorer(lm), encoder, min_rows=max_rows, max_rows=max_rows, mesh=mesh)


# ---------------------------------------------------------------------------------------------------
# The small head.
# ---------------------------------------------------------------------------------------------------


class HeadScorer(nnx.Module):
    """An MLP from state features to l(a | s); the output layer starts at zero (a uniform policy)."""

    def __init__(self, in_dim: int, n_actions: int, hidden: int = 128, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(in_dim, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, n_actions, kernel_init=nnx.initializers.zeros, rngs=rngs)

    def __call__(self, inputs: Mapping[str, jax.Array]) -> jax.Array:
        return self.out(jnp.tanh(self.hidden(inputs["features"])))


@dataclasses.dataclass
class FeatureEncoder:
    """[e(x, b), one-hot last agent (or none), agents called, remaining budget fraction, steps taken]."""

    embeddings: Mapping[str, np.ndarray]  # task_id -> e(x, b)
    n_agents: int
    max_steps: int

    @property
    def dim(self) -> int:
        return len(next(iter(self.embeddings.values()))) + 2 * self.n_agents + 3

    def __call__(self, states: Sequence[State], masks: np.ndarray) -> Inputs:
        n = self.n_agents
        out = np.zeros((len(masks), self.dim), np.float32)
        for r, s in enumerate(states):
            e = self.embeddings[s.task.task_id]
            out[r, : len(e)] = e
            out[r, len(e) + s.prev + 1] = 1.0  # slot 0: no agent yet
            out[r, len(e) + n + 1 + np.asarray(s.history, int)] = 1.0
            out[r, -2] = max(s.remaining, 0) / s.task.budget
            out[r, -1] = len(s.history) / self.max_steps
        return {"features": out}


def head_policy(
    embeddings: Mapping[str, np.ndarray], n_agents: int, max_steps: int, *, hidden: int = 128, seed: int = 0
) -> ActionPolicy:
    encoder = FeatureEncoder(embeddings, n_agents, max_steps)
    return ActionPolicy(HeadScorer(encoder.dim, n_agents + 1, hidden, rngs=nnx.Rngs(seed)), encoder)
