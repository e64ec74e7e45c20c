"""MACA training (Algorithm 1, lines 8-20): token-aware GRPO on the orchestration policy under the structural
prior that prior.py learns (lines 3-7), and the Table 3 variants that remove parts of either.

GRPO here: each iteration samples tasks, rolls out a group of K = 8 episodes per task, pays each episode
R = sum_t r_t (Eq. 12: accuracy once, minus beta * tokens per step), normalises R within the group (Eq. 9)
and minimises the clipped surrogate (Eq. 10) over the episodes' decisions. Each decision is one "token" of
`grpo_loss`: its log-prob is log pi_theta(a_t | s_t) under the Eq. 11 mask.

The loop is the project's one trainer (porch_jax/train/trainer.py): `train_grpo` runs method "maca_grpo"
(train/methods.py: parts "pg", Eq. 10, and "kl_mix", lambda * KL to pi_mix, over the scorer module's Eq. 11
log-probs; tests/maca/oracles.py's `maca_loss`, the tests' oracle, is the same objective as one pure function)
on `GroupRollouts`, the on-policy batch source that rolls out each iteration's groups and yields its batch for
`epochs` trainer steps. Checkpoints, resume, the finite guard and the learning-rate schedule are the trainer's;
the history rows, the probe and the progress line are the source's and `train_grpo`'s.

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
import dataclasses
import functools
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

from porch_jax.maca.graphspec import (
    DEFAULT_GAMMA,
    GraphSpec,
    edge_prior,
    gate,
)
from porch_jax.maca.lm_policy import ActionPolicy
from porch_jax.maca.orchestrator import (
    AgentWorld,
    Episode,
    OrchestrationTask,
    State,
    pad_rows,
    rollout,
)
from porch_jax.maca.policy import (
    kl_to_mix,
    mix_log_probs,
    step_rewards,
    trajectory_return,
)
from porch_jax.maca.prior import prior_probs
from porch_jax.maca.settings import GRPOConfig, Variant
from porch_jax.progress import ProgressLine
from porch_jax.train import optim
from porch_jax.train.checkpoint import Checkpointer
from porch_jax.train.config import CheckpointConfig, MethodConfig, OptimizerConfig, TrainConfig
from porch_jax.train.losses import group_advantages
from porch_jax.train.mesh import abstract_like
from porch_jax.train.methods import make_method
from porch_jax.train.sources import BatchSource
from porch_jax.train.trainer import Trainer
from porch_jax.train.views import ActionsView

# ---------------------------------------------------------------------------------------------------
# Variants (Table 3) and the GraphSpec each one acts under.
# ---------------------------------------------------------------------------------------------------


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
# The GRPO targets (pure): log pi_mix, KL_t, returns and advantages.
# ---------------------------------------------------------------------------------------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GroupDecisions:
    """An iteration's decisions as `group_targets` reads them. Decision rows [R] (valid flags the real
    ones; the rest pad to the policy's batch bucket): rollout log-probs `old`, pi_ref log-probs `ref` and
    pi_prior `prior` [R, A], the taken `actions` and where each sits, (`episode`, `step`). Episodes [E]
    (groups of `group_size` consecutive ones): step `tokens` and `step_mask` [E, T], outcomes `correct`."""

    old: jax.Array
    ref: jax.Array
    prior: jax.Array
    valid: jax.Array
    actions: jax.Array
    episode: jax.Array
    step: jax.Array
    tokens: jax.Array
    step_mask: jax.Array
    correct: jax.Array


@functools.partial(jax.jit, static_argnames=("cfg", "prior_kl_weight"))
def group_targets(d: GroupDecisions, cfg: GRPOConfig, prior_kl_weight: float) -> dict[str, jax.Array]:
    """log pi_mix, KL_t per decision, R per episode (Eq. 8, 12; `prior_kl_weight`, lambda, weights the KL in
    the return, 0: not charged) and the advantages (Eq. 9 within each group of cfg.group_size episodes) per
    episode and per decision. KL_t is the exact KL of each state's distribution, or with cfg.kl_sample the
    one-sample estimate at the taken action, log pi(a_t | s_t) - log pi_mix(a_t | s_t)."""
    mix = mix_log_probs(d.ref, d.prior)
    if cfg.kl_sample:

        def taken(x):
            return jnp.take_along_axis(x, d.actions[:, None], axis=-1)[:, 0]

        kl = jnp.where(d.valid, taken(d.old) - taken(mix), 0.0)
    else:
        kl = jnp.where(d.valid, kl_to_mix(d.old, mix), 0.0)
    kl_steps = jnp.zeros(d.tokens.shape, jnp.float32).at[d.episode, d.step].add(kl)
    rewards = step_rewards(
        d.correct,
        d.tokens,
        kl_steps,
        d.step_mask,
        token_cost_weight=cfg.token_cost_weight,
        prior_kl_weight=prior_kl_weight,
        token_unit=cfg.token_unit,
    )
    returns = trajectory_return(rewards)
    advantages = group_advantages(returns.reshape(-1, cfg.group_size), eps=cfg.advantage_eps).reshape(-1)
    return {
        "mix": mix,
        "kl": kl,
        "returns": returns,
        "advantages": advantages,
        "decision_advantages": advantages[d.episode],
    }


# ---------------------------------------------------------------------------------------------------
# Training through the one trainer: the rollout source, the settings and `train_grpo`.
# ---------------------------------------------------------------------------------------------------


def optimizer_config(cfg: GRPOConfig) -> OptimizerConfig:
    """cfg.optimizer with its schedule's length: updates, `epochs` per iteration (the one trainer's steps)."""
    return dataclasses.replace(cfg.optimizer, total_steps=max(cfg.iterations * cfg.epochs, 1))


def make_optimizer(cfg: GRPOConfig) -> optax.GradientTransformation:
    """The optimizer `train_grpo`'s trainer builds from `optimizer_config`."""
    return optim.make_optimizer(optimizer_config(cfg))


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


class GroupRollouts(BatchSource):
    """The one trainer's batch source for MACA's GRPO (on-policy, discrete actions: train/methods.py).

    Each iteration it samples `tasks_per_iteration` tasks with its NumPy RNG, rolls out a group of
    `group_size` episodes per task with the current student, computes the group targets (pi_ref from the
    frozen initial policy, pi_prior from GraphSpec, Eq. 12's returns and Eq. 9's advantages) and yields the
    update batch for `epochs` consecutive trainer steps. `finish` closes an iteration with the step's
    metrics into a history row; `state()` (the RNG and the history) is what a checkpoint needs to resume
    exactly."""

    on_policy = True
    view = "decisions"
    views = (view,)

    def __init__(
        self,
        policy: ActionPolicy,
        tasks: Sequence[OrchestrationTask],
        world: AgentWorld,
        specs: Mapping[str, GraphSpec] | None,
        variant: Variant,
        cfg: GRPOConfig,
        seed: int,
    ):
        self.policy, self.tasks, self.world, self.specs, self.variant, self.cfg = (
            policy,
            tasks,
            world,
            specs,
            variant,
            cfg,
        )
        self.rng = np.random.default_rng(seed)
        self.ref_params = jax.tree.map(jnp.copy, policy.params)
        self.history: list[dict[str, float]] = []
        self._batch: dict[str, Any] | None = None
        self._row: dict[str, float] = {}
        self._began = 0.0

    def __call__(self, step: int, student: nnx.Module) -> tuple[dict[str, Any], dict[str, float]]:
        if (step - 1) % self.cfg.epochs == 0:  # the first epoch of an iteration
            self._began = time.perf_counter()
            self.policy.params = nnx.state(student)
            self._batch, self._row = self.rollout()
        elif self._batch is None:
            raise RuntimeError(f"step {step} is inside an iteration this source did not roll out")
        return self._batch, dict(self._row)

    def rollout(self) -> tuple[dict[str, Any], dict[str, float]]:
        """One iteration's groups of rollouts and the batch of their decisions, with the rollout's metrics."""
        cfg, policy, specs = self.cfg, self.policy, self.specs
        rollout_cfg = dataclasses.replace(cfg.rollout, greedy=False)
        picked = self.rng.choice(len(self.tasks), size=min(cfg.tasks_per_iteration, len(self.tasks)), replace=False)
        batch_tasks = [self.tasks[i] for i in picked for _ in range(cfg.group_size)]
        spec_list = None if specs is None else [specs[t.task_id] for t in batch_tasks]
        episodes = asyncio.run(rollout(batch_tasks, policy, self.world, spec_list, rollout_cfg, self.rng))
        batch = _decisions(episodes, rollout_cfg.max_steps)
        inputs, masks = policy.inputs(batch.states, batch.masks)
        rows = len(masks)
        old = np.where(masks, 0.0, -np.inf).astype(np.float32)  # padding rows: all mass on STOP, as their masks
        old[: len(batch.states)] = batch.log_probs
        ref = policy.scored(inputs, masks, self.ref_params)
        prior = np.exp(ref) if specs is None else prior_probs(batch.states, masks, specs, cfg.stop_floor)
        valid = np.arange(rows) < len(batch.states)
        actions = pad_rows(batch.actions, rows)
        decisions = GroupDecisions(
            old=old,
            ref=ref,
            prior=prior,
            valid=valid,
            actions=actions,
            episode=pad_rows(batch.episode, rows),
            step=pad_rows(batch.step, rows),
            tokens=batch.tokens,
            step_mask=batch.step_mask,
            correct=np.array([e.correct for e in episodes], np.float32),
        )
        targets = group_targets(decisions, cfg, self.variant.prior_kl_weight if cfg.kl_in_reward else 0.0)
        view = ActionsView(
            inputs=inputs,
            masks=masks,
            actions=actions,
            old_logp=np.take_along_axis(old, actions[:, None], axis=-1)[:, 0],
            advantage=targets["decision_advantages"],
            valid=valid,
            target=targets["mix"],
        )
        returns, kl = np.asarray(targets["returns"]), np.asarray(targets["kl"])[valid]
        row = {
            "return": float(returns.mean()),
            "accuracy": float(np.mean([e.correct for e in episodes])),
            "cost": float(np.mean([e.cost for e in episodes])),
            "steps": float(np.mean([len(e.path) for e in episodes])),
            "kl_mix_rollout": float(kl.mean()),
        }
        return {self.view: jax.tree.map(lambda x: jnp.asarray(x)[None], view)}, row  # [accum 1, rows, ...]

    def finish(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """The iteration's history row: its rollout metrics, the last update's and its wall time."""
        row = {"iteration": len(self.history), **self._row}
        row |= {k: float(metrics[k]) for k in ("loss", "pg", "kl_mix", "clip_fraction")}
        row["seconds"] = time.perf_counter() - self._began
        self.history.append(row)
        return row

    def state(self) -> dict[str, Any]:
        return {"iteration": len(self.history), "rng": self.rng.bit_generator.state, "history": self.history}

    def restore(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.history = list(state["history"])


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
) -> list[dict[str, float]]:
    """Trains `policy` in place (its `params` end at the trained values) and returns the history, one row per
    iteration.
    `specs` maps task ids to the variant's GraphSpec (None for variants without one). `probe` (e.g. a
    held-out evaluation of `policy`) runs after every `probe_every`-th iteration and after the last; its
    metrics join that iteration's row as `heldout_<metric>` (`seconds`, the iteration's wall time, leaves the probe
    out). It must not touch the training state: the trained parameters are the same with or without it.

    The loop is the one trainer's (porch_jax/train/trainer.py): method "maca_grpo" on `GroupRollouts`,
    `epochs` trainer steps per iteration. With `checkpoint_dir` (the trainer's workdir: checkpoints under
    its checkpoints/) the state (parameters, optimizer, the sampler's RNG and the history) is saved after
    every `checkpoint_every`-th iteration and after the last, and a call that finds a checkpoint there
    resumes from it: a run interrupted and called again ends exactly as one that was not (the agents'
    randomness comes from the same RNG; a real backend's replies may differ), and a finished one only
    restores. pi_ref is the policy's parameters as passed in (the same initial parameters on every call).
    The checkpoint must come from the same task set, variant, seed and iteration count; it records them.

    `progress` gets a line (iteration, return, accuracy, tokens, rate, ETA) at most every `progress_every_s`
    seconds and after the last iteration: against served agents an iteration can take minutes."""
    if not variant.learn:
        raise ValueError(f"variant {variant.name!r} has no policy to train")
    identity = {
        "variant": dataclasses.asdict(variant),
        "seed": seed,
        "iterations": cfg.iterations,
        "tasks": len(tasks),
        "first_task": tasks[0].task_id if tasks else None,
    }
    epochs, steps = cfg.epochs, cfg.iterations * cfg.epochs
    lam = variant.prior_kl_weight if cfg.kl_in_loss else 0.0
    train_cfg = TrainConfig(
        steps=steps,
        optimizer=optimizer_config(cfg),
        method=MethodConfig(name="maca_grpo", clip_eps=cfg.clip_eps, target_kl_weight=lam),
        checkpoint=CheckpointConfig(
            every=checkpoint_every * epochs if checkpoint_every > 0 else steps, keep=2, async_save=False
        ),
        mesh=(1, 1, 1) if policy.mesh is None else tuple(policy.mesh.devices.shape),
    )
    source = GroupRollouts(policy, tasks, world, specs, variant, cfg, seed)
    trainer = Trainer(
        train_cfg,
        nnx.merge(policy.graphdef, policy.params),
        make_method(train_cfg.method),
        source,
        checkpoint_dir,
        stream=None,
        identity=identity,
        on_step=lambda step, metrics: finish(step, metrics),
    )
    start = trainer.start_step // epochs
    if start:
        logging.info("GRPO (%s) resumes from iteration %d of %s", variant.name, start, trainer.checkpointer.directory)
    line = None if progress is None else ProgressLine(cfg.iterations, progress, every_s=progress_every_s, done=start)

    def finish(step: int, metrics: dict[str, float]) -> None:
        if step % epochs:
            return
        it = step // epochs
        row = source.finish(metrics)
        if line is not None:
            line(
                it,
                f"{variant.name} seed {seed}: iteration {it}/{cfg.iterations} return {row['return']:.3f} "
                f"accuracy {row['accuracy']:.3f} tokens {row['cost']:.0f}",
            )
        if probe is not None and probe_every > 0 and (it % probe_every == 0 or it == cfg.iterations):
            policy.params = trainer.state["params"]
            row.update({f"heldout_{k}": float(v) for k, v in probe().items()})

    trainer.run()
    policy.params = trainer.state["params"]
    return source.history


def restore_params(directory: str | Path, policy: ActionPolicy, tx: optax.GradientTransformation) -> nnx.State:
    """The latest parameters `train_grpo(checkpoint_dir=directory)` saved, shaped like `policy.params`."""
    params = policy.params
    target = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}
    ckpt = Checkpointer(Path(directory) / "checkpoints", async_save=False)
    try:
        restored = ckpt.restore_latest(abstract_like(target))
    finally:
        ckpt.close()
    if restored is None:
        raise FileNotFoundError(f"no checkpoint in {directory}")
    return restored[1]["params"]
