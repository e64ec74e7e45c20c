"""MACA training (Algorithm 1, lines 8-20): token-aware GRPO on the orchestration policy under the structural
prior that prior.py learns (lines 3-7), and the Table 3 variants that remove parts of either.

GRPO here: each iteration samples tasks, rolls out a group of K = 8 episodes per task, pays each episode
R = sum_t r_t (Eq. 12: accuracy once, minus beta * tokens per step), normalises R within the group (Eq. 9)
and minimises the clipped surrogate (Eq. 10) over the episodes' decisions. Each decision is one "token" of
`grpo_loss`: its log-prob is log pi_theta(a_t | s_t) under the Eq. 11 mask.

Choices the paper leaves open, and why:
- The KL to pi_mix = (pi_ref + pi_prior) / 2 (pi_ref: the policy's frozen initial parameters, for the
  head a uniform policy over the allowed set; variants without GraphSpec take pi_prior = pi_ref) can be
  charged in the return (Eq. 12, `kl_in_reward`), as a loss term at every decision (`kl_in_loss`, the way
  GRPO applies its KL penalty, Shao et al. 2024), or both. In the return, KL_t must be the one-sample
  estimate at the action taken, log pi(a_t | s_t) - log pi_mix(a_t | s_t) (`kl_sample`; its expectation
  is the exact KL, and summed over t it estimates KL between the trajectory distributions), not the exact
  per-state KL: the exact KL does not depend on a_t, so as a reward it cannot say "take what the prior
  favours"; it only charges every extra step, and the group ranking then learns to STOP after the first
  call (synthetic pool, lambda 0.7: 1.7 calls, expected accuracy 0.53, against 2.4 calls and 0.72 with the
  sample estimate). The experiment config uses Eq. 12 with the sample estimate and no loss KL (the paper's
  Eq. 10 alpha-KL to pi_ref has no given value; alpha = 0 here).
- Eq. 9's epsilon is 0.1, not ~0: when all K outcomes of a group agree, the returns differ only by
  beta * tokens, and a tiny epsilon would blow those differences up to unit advantages (teaching "stop
  early" whatever beta is). 0.1 keeps them at the scale of beta's cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from ml_collections import ConfigDict

from porch_jax.maca.graphspec import (
    DEFAULT_GAMMA,
    GraphSpec,
    edge_prior,
    gate,
)
from porch_jax.maca.lm_policy import ActionPolicy, policy_log_probs
from porch_jax.maca.orchestrator import (
    AgentWorld,
    Episode,
    OrchestrationTask,
    RolloutConfig,
    State,
    pad_rows,
    rollout,
)
from porch_jax.maca.policy import (
    PRIOR_KL_WEIGHT,
    TOKEN_COST_WEIGHT,
    kl_to_mix,
    mix_log_probs,
    step_rewards,
    trajectory_return,
)
from porch_jax.maca.prior import prior_probs
from porch_jax.progress import ProgressLine
from porch_jax.train import optim
from porch_jax.train.checkpoint import Checkpointer
from porch_jax.train.losses import group_advantages, grpo_loss, safe_mean
from porch_jax.train.mesh import abstract_like

PRIOR_KINDS = ("full", "no_relevance", "no_edges", "none")


# ---------------------------------------------------------------------------------------------------
# Variants (Table 3) and the GraphSpec each one acts under.
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Variant:
    """prior: what GraphSpec keeps ("full"; "no_relevance": Z_prior removed, q = z = 1; "no_edges": P_prior's
    plausibility removed, p = 1; "none": no GraphSpec). mask: Eq. 11's hard constraint. learn: False acts by
    executing the structure GraphSpec commits to, with no policy (the structure-centric "w/o pi_theta",
    `PriorPolicy`)."""

    name: str
    prior: str = "full"
    mask: bool = True
    prior_kl_weight: float = PRIOR_KL_WEIGHT
    learn: bool = True

    def __post_init__(self) -> None:
        if self.prior not in PRIOR_KINDS:
            raise ValueError(f"prior must be one of {PRIOR_KINDS}, got {self.prior!r}")
        if self.prior == "none" and not self.learn:
            raise ValueError("a variant without GraphSpec and without a policy has nothing to act by")


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("maca"),
        Variant("no_z_prior", prior="no_relevance"),
        Variant("no_p_prior", prior="no_edges"),
        Variant("no_graphspec", prior="none", mask=False),
        Variant("no_policy", learn=False),
        Variant("grpo", prior="none", mask=False, prior_kl_weight=0.0),  # unconstrained GRPO: no mask, no prior KL
    )
}


def graphspecs(q: np.ndarray, p: np.ndarray, prior: str, gamma: float = DEFAULT_GAMMA) -> list[GraphSpec] | None:
    """GraphSpec per task (Eq. 4 and 7) from relevance q [M, N] and edge probabilities p [M, N, N] (or
    [M, N + 1, N + 1] with the START node last, see edges.py). Without P_prior every edge, START's
    included, has p = 1, so pi_prior opens by relevance alone."""
    if prior == "none":
        return None
    n = q.shape[1]
    if prior == "no_relevance":
        q = np.ones_like(q)
    if prior == "no_edges":
        p = np.broadcast_to(~np.eye(p.shape[-1], dtype=bool), p.shape).astype(np.float32)
    z, pp = np.asarray(gate(jnp.asarray(q), gamma)), np.asarray(edge_prior(jnp.asarray(p[:, :n, :n]), jnp.asarray(q)))
    start = p[:, n, :n] * q if p.shape[-1] == n + 1 else [None] * len(q)
    return [
        GraphSpec(relevance=q[m], participation=z[m], edge_prior=pp[m], start_prior=start[m]) for m in range(len(q))
    ]


# ---------------------------------------------------------------------------------------------------
# The GRPO objective (pure).
# ---------------------------------------------------------------------------------------------------


def maca_loss(
    log_probs: jax.Array,
    actions: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    valid: jax.Array,
    mix: jax.Array,
    *,
    clip_eps: float,
    prior_kl_weight: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Eq. 10 over decisions [D] plus lambda * KL(pi_theta || pi_mix) (see the module docstring).

    log_probs [D, A] (Eq. 11), actions/old_logp/advantages/valid [D], mix [D, A] = log pi_mix.
    """
    logp = jnp.take_along_axis(log_probs, actions[:, None], axis=-1)
    total, count, metrics = grpo_loss(logp, old_logp[:, None], None, advantages, valid[:, None], clip_eps=clip_eps)
    pg = safe_mean(total, count)
    kl = safe_mean(jnp.sum(jnp.where(valid, kl_to_mix(log_probs, mix), 0.0)), count)
    return pg + prior_kl_weight * kl, {"pg": pg, "kl_mix": kl, "clip_fraction": metrics["clip_fraction"]}


@functools.partial(jax.jit, static_argnames=("groups", "token_cost_weight", "prior_kl_weight", "token_unit", "eps"))
def group_targets(
    old: jax.Array,
    ref: jax.Array,
    prior: jax.Array,
    valid: jax.Array,
    episode: jax.Array,
    step: jax.Array,
    tokens: jax.Array,
    correct: jax.Array,
    step_mask: jax.Array,
    *,
    groups: int,
    token_cost_weight: float,
    prior_kl_weight: float,
    token_unit: float,
    eps: float,
    actions: jax.Array | None = None,
) -> dict[str, jax.Array]:
    """From the decisions' rollout log-probs, pi_ref log-probs and pi_prior ([R, A]; rows flagged by valid [R],
    placed at (episode, step)) and the episodes' step tokens [E, T], outcomes [E] and step masks: log pi_mix,
    KL_t per decision, R per episode (Eq. 8, 12; lambda weights the KL in the return) and the advantages
    (Eq. 9, episodes grouped in `groups` consecutive runs) per episode and per decision."""
    mix = mix_log_probs(ref, prior)
    if actions is None:  # the exact KL of each state's distribution
        kl = jnp.where(valid, kl_to_mix(old, mix), 0.0)
    else:  # the one-sample estimate at the taken action, log pi(a_t | s_t) - log pi_mix(a_t | s_t)

        def taken(x):
            return jnp.take_along_axis(x, actions[:, None], axis=-1)[:, 0]

        kl = jnp.where(valid, taken(old) - taken(mix), 0.0)
    kl_steps = jnp.zeros(tokens.shape, jnp.float32).at[episode, step].add(kl)
    rewards = step_rewards(
        correct,
        tokens,
        kl_steps,
        step_mask,
        token_cost_weight=token_cost_weight,
        prior_kl_weight=prior_kl_weight,
        token_unit=token_unit,
    )
    returns = trajectory_return(rewards)
    advantages = group_advantages(returns.reshape(groups, -1), eps=eps).reshape(-1)
    return {
        "mix": mix,
        "kl": kl,
        "returns": returns,
        "advantages": advantages,
        "decision_advantages": advantages[episode],
    }


# ---------------------------------------------------------------------------------------------------
# The trainer.
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    iterations: int = 60
    tasks_per_iteration: int = 8
    group_size: int = 8  # G (paper, App. D.3)
    learning_rate: float = 3e-3  # the paper's 1e-5 is for an 8B model; these policies start from scratch
    warmup_steps: int = 0
    final_lr_ratio: float = 1.0  # cosine decay to learning_rate * this at the last update (1: constant)
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    clip_eps: float = 0.2
    epochs: int = 1  # updates per batch of rollouts (ratios stay 1 at the first)
    token_cost_weight: float = TOKEN_COST_WEIGHT
    token_unit: float = 1000.0
    kl_in_reward: bool = False  # True: also charge lambda * KL_t in the return (Eq. 12 literally)
    kl_in_loss: bool = True  # lambda * KL(pi_theta || pi_mix) as a loss term at every decision
    kl_sample: bool = False  # in the return: KL_t as log pi(a_t) - log pi_mix(a_t) at the taken action
    advantage_eps: float = 0.1  # Eq. 9's epsilon (see group_targets)
    stop_floor: float = 0.05
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)


def make_optimizer(cfg: GRPOConfig) -> optax.GradientTransformation:
    """The trainers' AdamW; its schedule counts updates, `epochs` per iteration."""
    return _optimizer(
        cfg.learning_rate,
        cfg.warmup_steps,
        max(cfg.iterations * cfg.epochs, 1),
        cfg.final_lr_ratio,
        cfg.weight_decay,
        cfg.max_grad_norm,
    )


@functools.cache
def _optimizer(
    learning_rate: float,
    warmup_steps: int,
    total_steps: int,
    final_lr_ratio: float,
    weight_decay: float,
    max_grad_norm: float,
) -> optax.GradientTransformation:
    # cached: the same transformation object lets runs with equal settings share compiled update steps
    return optim.make_optimizer(
        ConfigDict(
            {
                "learning_rate": learning_rate,
                "warmup_steps": warmup_steps,
                "total_steps": total_steps,
                "final_lr_ratio": final_lr_ratio,
                "weight_decay": weight_decay,
                "b1": 0.9,
                "b2": 0.999,
                "eps": 1e-8,
                "max_grad_norm": max_grad_norm,
            }
        )
    )


@dataclasses.dataclass
class TrainResult:
    params: nnx.State
    opt_state: optax.OptState
    history: list[dict[str, float]]


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _update(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    clip_eps: float,
    prior_kl_weight: float,
    params: nnx.State,
    opt_state: optax.OptState,
    inputs: Mapping[str, jax.Array],
    masks: jax.Array,
    actions: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    valid: jax.Array,
    mix: jax.Array,
):
    def loss_fn(p):
        return maca_loss(
            policy_log_probs(graphdef, p, inputs, masks),
            actions,
            old_logp,
            advantages,
            valid,
            mix,
            clip_eps=clip_eps,
            prior_kl_weight=prior_kl_weight,
        )

    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, {"loss": loss, **metrics}


@dataclasses.dataclass(frozen=True)
class Decisions:
    """An iteration's decisions, in episode order, and its episodes' per-step tokens [E, T] and step masks."""

    states: list[State]
    masks: np.ndarray
    log_probs: np.ndarray
    actions: np.ndarray
    episode: np.ndarray
    step: np.ndarray
    tokens: np.ndarray
    step_mask: np.ndarray


def _decisions(episodes: Sequence[Episode], max_steps: int) -> Decisions:
    steps = [(i, t, s) for i, e in enumerate(episodes) for t, s in enumerate(e.steps)]
    tokens = np.zeros((len(episodes), max_steps + 1), np.float32)  # at most max_steps calls and a STOP
    for i, t, s in steps:
        tokens[i, t] = s.tokens
    step_mask = np.arange(max_steps + 1)[None, :] < np.array([len(e.steps) for e in episodes])[:, None]
    return Decisions(
        states=[s.state for _, _, s in steps],
        masks=np.stack([s.mask for _, _, s in steps]),
        log_probs=np.stack([s.log_probs for _, _, s in steps]),
        actions=np.array([s.action for _, _, s in steps], np.int32),
        episode=np.array([i for i, _, _ in steps], np.int32),
        step=np.array([t for _, t, _ in steps], np.int32),
        tokens=tokens,
        step_mask=step_mask,
    )


def train_grpo(
    policy: ActionPolicy,
    tasks: Sequence[OrchestrationTask],
    world: AgentWorld,
    specs: Mapping[str, GraphSpec] | None,
    variant: Variant,
    cfg: GRPOConfig,
    *,
    seed: int = 0,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int = 0,
    probe: Callable[[], Mapping[str, float]] | None = None,
    probe_every: int = 0,
    progress: Callable[[str], None] | None = None,
    progress_every_s: float = 30.0,
) -> TrainResult:
    """Trains `policy` in place (its `params` end at the trained values); one history row per iteration.
    `specs` maps task ids to the variant's GraphSpec (None for variants without one). `probe` (e.g. a
    held-out evaluation of `policy`) runs after every `probe_every`-th iteration and after the last; its
    metrics join that iteration's row as `heldout_<metric>` (`seconds`, the iteration's wall time, leaves the probe
    out). It must not touch the training state: the trained parameters are the same with or without it.

    With `checkpoint_dir` the state (parameters, optimizer, pi_ref, the sampler's RNG and the history) is
    saved after every `checkpoint_every`-th iteration and after the last, and a call that finds a checkpoint
    there resumes from it: a run interrupted and called again ends exactly as one that was not (the agents'
    randomness comes from the same RNG; a real backend's replies may differ), and a finished one only
    restores. The checkpoint must come from the same task set, variant and config; it records them.

    `progress` gets a line (iteration, return, accuracy, tokens, rate, ETA) at most every `progress_every_s`
    seconds and after the last iteration: against served agents an iteration can take minutes."""
    if not variant.learn:
        raise ValueError(f"variant {variant.name!r} has no policy to train")
    rng = np.random.default_rng(seed)
    tx = make_optimizer(cfg)
    ref_params = jax.tree.map(jnp.copy, policy.params)
    opt_state = tx.init(policy.params)
    history: list[dict[str, float]] = []
    identity = {
        "variant": dataclasses.asdict(variant),
        "seed": seed,
        "iterations": cfg.iterations,
        "tasks": len(tasks),
        "first_task": tasks[0].task_id if tasks else None,
    }
    update = functools.partial(
        _update, policy.graphdef, tx, cfg.clip_eps, variant.prior_kl_weight if cfg.kl_in_loss else 0.0
    )
    saver = (
        contextlib.nullcontext() if checkpoint_dir is None else Checkpointer(checkpoint_dir, keep=2, async_save=False)
    )
    with saver as ckpt:
        start = 0
        resumed = (
            None
            if ckpt is None
            else _resume(ckpt, {"params": policy.params, "opt_state": opt_state, "ref_params": ref_params}, identity)
        )
        if resumed is not None:
            start, state, data = resumed
            policy.params, opt_state, ref_params = state["params"], state["opt_state"], state["ref_params"]
            rng.bit_generator.state = data["rng"]
            history = list(data["history"])
        line = (
            None if progress is None else ProgressLine(cfg.iterations, progress, every_s=progress_every_s, done=start)
        )
        for it in range(start, cfg.iterations):
            began = time.perf_counter()
            opt_state, row = _iteration(policy, opt_state, ref_params, update, tasks, world, specs, variant, cfg, rng)
            history.append({"iteration": it, **row, "seconds": time.perf_counter() - began})
            last = it + 1 == cfg.iterations
            if line is not None:
                line(
                    it + 1,
                    f"{variant.name} seed {seed}: iteration {it + 1}/{cfg.iterations} return {row['return']:.3f} "
                    f"accuracy {row['accuracy']:.3f} tokens {row['cost']:.0f}",
                )
            if probe is not None and probe_every > 0 and ((it + 1) % probe_every == 0 or last):
                history[-1].update({f"heldout_{k}": float(v) for k, v in probe().items()})
            if ckpt is not None and ((checkpoint_every > 0 and (it + 1) % checkpoint_every == 0) or last):
                ckpt.save(
                    it + 1,
                    {"params": policy.params, "opt_state": opt_state, "ref_params": ref_params},
                    {"iteration": it + 1, "rng": rng.bit_generator.state, "history": history},
                    identity,
                )
    return TrainResult(policy.params, opt_state, history)


def _iteration(
    policy: ActionPolicy,
    opt_state: optax.OptState,
    ref_params: nnx.State,
    update: Callable,
    tasks: Sequence[OrchestrationTask],
    world: AgentWorld,
    specs: Mapping[str, GraphSpec] | None,
    variant: Variant,
    cfg: GRPOConfig,
    rng: np.random.Generator,
) -> tuple[optax.OptState, dict[str, float]]:
    """One GRPO iteration (updates `policy.params` in place): groups of rollouts, Eq. 12's returns, Eq. 9's
    advantages, `cfg.epochs` updates. Returns the optimizer state and the iteration's metrics."""
    rollout_cfg = dataclasses.replace(cfg.rollout, greedy=False)
    picked = rng.choice(len(tasks), size=min(cfg.tasks_per_iteration, len(tasks)), replace=False)
    batch_tasks = [tasks[i] for i in picked for _ in range(cfg.group_size)]
    spec_list = None if specs is None else [specs[t.task_id] for t in batch_tasks]
    episodes = asyncio.run(rollout(batch_tasks, policy, world, spec_list, rollout_cfg, rng))
    batch = _decisions(episodes, rollout_cfg.max_steps)
    inputs, masks = policy.inputs(batch.states, batch.masks)
    rows = len(masks)
    old = np.where(masks, 0.0, -np.inf).astype(np.float32)  # padding rows: all mass on STOP, as their masks
    old[: len(batch.states)] = batch.log_probs
    ref = policy.scored(inputs, masks, ref_params)
    prior = np.exp(ref) if specs is None else prior_probs(batch.states, masks, specs, cfg.stop_floor)
    valid = np.arange(rows) < len(batch.states)
    targets = group_targets(
        old,
        ref,
        prior,
        valid,
        pad_rows(batch.episode, rows),
        pad_rows(batch.step, rows),
        batch.tokens,
        np.array([e.correct for e in episodes], np.float32),
        batch.step_mask,
        groups=len(picked),
        token_cost_weight=cfg.token_cost_weight,
        token_unit=cfg.token_unit,
        eps=cfg.advantage_eps,
        prior_kl_weight=variant.prior_kl_weight if cfg.kl_in_reward else 0.0,
        actions=pad_rows(batch.actions, rows) if cfg.kl_sample else None,
    )
    actions = pad_rows(batch.actions, rows)
    old_logp = np.take_along_axis(old, actions[:, None], axis=-1)[:, 0]
    with policy.placement():
        for _ in range(cfg.epochs):
            policy.params, opt_state, metrics = update(
                policy.params,
                opt_state,
                inputs,
                masks,
                actions,
                old_logp,
                targets["decision_advantages"],
                valid,
                targets["mix"],
            )
    returns, kl = np.asarray(targets["returns"]), np.asarray(targets["kl"])[valid]
    return opt_state, {
        "return": float(returns.mean()),
        "accuracy": float(np.mean([e.correct for e in episodes])),
        "cost": float(np.mean([e.cost for e in episodes])),
        "steps": float(np.mean([len(e.path) for e in episodes])),
        "kl_mix_rollout": float(kl.mean()),
        **{k: float(v) for k, v in jax.device_get(metrics).items()},
    }


def _resume(
    ckpt: Checkpointer, target: dict[str, Any], identity: dict[str, Any]
) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
    """(iteration, state shaped like `target`, data) of `ckpt`'s newest readable step; None when there is none.
    A checkpoint of another run (its recorded identity differs) is refused, naming what differs."""
    steps = ckpt.steps()
    if not steps:
        return None
    saved = ckpt.config(steps[-1])
    differ = sorted(k for k in identity if json.loads(json.dumps(identity[k])) != saved.get(k))
    if differ:
        raise ValueError(
            f"{ckpt.directory} holds a checkpoint of another run ({', '.join(differ)} differ: saved "
            f"{ {k: saved.get(k) for k in differ} }); use another checkpoint directory or delete it"
        )
    restored = ckpt.restore_latest(abstract_like(target))
    if restored is not None:
        logging.info(
            "GRPO (%s) resumes from iteration %d of %s", identity["variant"]["name"], restored[0], ckpt.directory
        )
    return restored


def restore_params(directory: str | Path, policy: ActionPolicy, tx: optax.GradientTransformation) -> nnx.State:
    """The latest checkpointed parameters, shaped like `policy.params`."""
    target = {"params": policy.params, "opt_state": tx.init(policy.params), "ref_params": policy.params}
    ckpt = Checkpointer(directory, async_save=False)
    try:
        restored = ckpt.restore_latest(abstract_like(target))
    finally:
        ckpt.close()
    if restored is None:
        raise FileNotFoundError(f"no checkpoint in {directory}")
    return restored[1]["params"]
