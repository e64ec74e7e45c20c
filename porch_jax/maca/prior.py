"""MACA's structural prior (Algorithm 1, lines 3-7) and pi_prior as a policy: relevance scores (Eq. 4), the
Bernoulli edge policy's rounds over executed walks (Eq. 5) and the edge MLP fitted on their successes (Eq. 6),
saved and restored with Orbax; pi_prior's action distribution per state (the KL target of Eq. 12); and the
structure GraphSpec commits to, executed without a learned policy (`PriorPolicy`, Table 3's w/o pi_theta).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import heapq
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from porch_jax.maca.edges import (
    EdgeMLP,
    EdgePolicy,
    SuccessBuffer,
    prior_learning_round,
    train_edge_mlp,
    with_start_node,
)
from porch_jax.maca.graphspec import (
    BudgetTemperature,
    GraphSpec,
    gate,
    relevance,
)
from porch_jax.maca.orchestrator import (
    AgentWorld,
    OrchestrationTask,
    State,
    pad_rows,
    run_path,
)
from porch_jax.maca.policy import prior_action_probs, structural_mask
from porch_jax.maca.settings import STRUCTURES, PriorConfig
from porch_jax.maca.synthetic import walk
from porch_jax.progress import ProgressLine
from porch_jax.train.checkpoint import Checkpointer
from porch_jax.train.mesh import abstract_like

# ---------------------------------------------------------------------------------------------------
# Structural prior learning (Algorithm 1, lines 3-7).
# ---------------------------------------------------------------------------------------------------


def relevance_scores(
    context_embs: np.ndarray, agent_embs: np.ndarray, budgets: Sequence[int], temperature: BudgetTemperature
) -> np.ndarray:
    """q [M, N] (Eq. 4 before the gate) for e(x, b) [M, d]."""
    return np.stack(
        [
            np.asarray(relevance(jnp.asarray(c), jnp.asarray(agent_embs), temperature(b)))
            for c, b in zip(context_embs, budgets, strict=False)
        ]
    )


def learn_edge_mlp(
    world: AgentWorld,
    tasks: Sequence[OrchestrationTask],
    context_embs: np.ndarray,
    agent_embs: np.ndarray,
    q: np.ndarray,
    cfg: PriorConfig,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> tuple[EdgeMLP | None, dict[str, Any]]:
    """Samples structures from the Bernoulli edge policy (Eq. 5) among each task's gate-passing agents,
    executes a walk on each through `world`, and fits the edge MLP (Eq. 6) on the successful walks.
    The MLP reads e(x, b), the same embedding as the relevance score (one encoding per task). When no walk
    succeeds there is nothing to fit: it warns and returns None (`edge_probs` then makes every edge plausible)
    rather than stop a run whose agent calls are already spent. `progress` gets a line (walks done, successes,
    rate, ETA) at most every 30 s: against served agents this stage makes rounds x tasks x samples walks."""
    rng = np.random.default_rng(seed)
    walks = {"done": 0, "ok": 0}
    line = None if progress is None else ProgressLine(cfg.rounds * len(tasks) * cfg.samples, progress, unit="walks")
    allowed = np.asarray(gate(jnp.asarray(q), cfg.gamma)) > 0
    n = agent_embs.shape[0]
    init_logit = 0.0
    if cfg.init_out_degree is not None:  # sparse structures: a walk's end then says where success stopped
        sigma = min(cfg.init_out_degree / max(allowed.sum(1).mean() - 1, 1.0), 0.5)
        init_logit = float(np.log(sigma / (1 - sigma)))
    groups = sorted({t.family for t in tasks}) if cfg.per_family else [None]
    if cfg.phi_start:  # START is node N of pi_phi; edges into it are sampled too, never walked (only R_s acts on them)
        allowed = np.concatenate([allowed, np.ones((len(allowed), 1), bool)], axis=1)
    policies = {
        g: EdgePolicy.create(
            n + int(cfg.phi_start),
            sparsity_weight=cfg.sparsity * n,
            learning_rate=cfg.edge_learning_rate,
            init_logit=init_logit,
        )
        for g in groups
    }
    buffer = SuccessBuffer()
    key = jax.random.key(seed)
    success = []
    for r in range(cfg.rounds):
        keep = cfg.buffer_rounds is None or r >= cfg.rounds - cfg.buffer_rounds
        hits, count = 0.0, 0
        for g in groups:
            idx = [m for m, t in enumerate(tasks) if g is None or t.family == g]

            def report(r: int = r) -> None:
                if line is not None:
                    line(
                        walks["done"],
                        f"prior learning, round {r + 1}/{cfg.rounds}: walk {walks['done']}/{line.total}, "
                        f"{walks['ok']} succeeded",
                    )

            async def run_one(m: int, path: list[int]) -> tuple[list[int], bool, int]:
                correct, tokens = await run_path(world, tasks[m], path, rng)
                walks["done"] += 1
                walks["ok"] += int(correct)
                report()
                return path, correct, tokens

            def execute(k: int, graph: np.ndarray, idx=idx) -> tuple[list[int], bool, int]:
                m = idx[k]
                return asyncio.run(run_one(m, walk(graph, allowed[m, :n], rng, max_steps=cfg.walk_steps)))

            def execute_batch(pairs, idx=idx) -> list[tuple[list[int], bool, int]]:
                paths = [
                    (idx[k], walk(graph, allowed[idx[k], :n], rng, max_steps=cfg.walk_steps)) for k, graph in pairs
                ]

                async def every() -> list[tuple[list[int], bool, int]]:
                    return list(await asyncio.gather(*(run_one(m, path) for m, path in paths)))

                return asyncio.run(every())

            key, sub = jax.random.split(key)
            rate = prior_learning_round(
                policies[g],
                sub,
                context_embs[idx],
                allowed[idx],
                execute,
                buffer,
                samples=cfg.samples,
                credit=cfg.credit,
                keep=keep,
                keep_cheapest=cfg.keep_cheapest,
                execute_batch=execute_batch if cfg.batched else None,
            )
            hits, count = hits + rate * len(idx), count + len(idx)
        success.append(hits / count)
    stats = {"walk_success": success, "buffer": len(buffer), "with_start": cfg.with_start}
    if not len(buffer):  # nothing to learn interactions from: P_prior is left uninformative (`edge_probs`)
        logging.warning(
            "no prior-learning walk succeeded (%d rounds x %d samples over %d tasks): P_prior is "
            "uninformative, every edge p = 1, as in w/o P_prior",
            cfg.rounds,
            cfg.samples,
            len(tasks),
        )
        return None, stats | {"fallback": "no successful walk: every edge p = 1 (as w/o P_prior)"}
    mlp = EdgeMLP(agent_embs.shape[1], cfg.mlp_hidden, rngs=nnx.Rngs(seed))
    losses = train_edge_mlp(
        mlp,
        buffer,
        agent_embs,
        steps=cfg.mlp_steps,
        batch_size=cfg.mlp_batch,
        learning_rate=cfg.mlp_learning_rate,
        seed=seed,
        with_start=cfg.with_start,
    )
    return mlp, stats | {"mlp_loss": [losses[0], losses[-1]]}


def save_edge_mlp(directory: str | Path, mlp: EdgeMLP | None, stats: dict[str, Any]) -> None:
    """Orbax checkpoint of a learned prior: Eq. 6's MLP (or that there is none, `learn_edge_mlp`'s fallback)
    and its statistics, so a resumed run does not repeat prior learning's agent calls."""
    state = nnx.state(mlp) if mlp is not None else {"none": jnp.zeros(())}
    with Checkpointer(directory, keep=1, async_save=False) as ckpt:
        ckpt.save(0, state, {"stats": stats}, {"mlp": mlp is not None})


def restore_edge_mlp(
    directory: str | Path, embed_dim: int, hidden: int
) -> tuple[EdgeMLP | None, dict[str, Any]] | None:
    """(MLP or None, statistics) saved by `save_edge_mlp`; None when the directory holds none."""
    with Checkpointer(directory, keep=1, async_save=False) as ckpt:
        if not ckpt.steps():
            return None
        mlp = EdgeMLP(embed_dim, hidden, rngs=nnx.Rngs(0)) if ckpt.config(ckpt.steps()[-1])["mlp"] else None
        restored = ckpt.restore_latest(abstract_like(nnx.state(mlp) if mlp is not None else {"none": jnp.zeros(())}))
    if restored is None:
        return None
    _, state, data = restored
    if mlp is not None:
        nnx.update(mlp, state)
    return mlp, data["stats"]


def edge_probs(
    mlp: EdgeMLP | None, agent_embs: np.ndarray, context_embs: np.ndarray, *, with_start: bool = False
) -> np.ndarray:
    """p [M, N, N] from Eq. 6, self-loops zeroed (an agent does not hand off to itself; Eq. 5 samples none);
    [M, N + 1, N + 1] `with_start`, START last, with nothing entering it. `mlp` None (no successful walk to
    learn from, `learn_edge_mlp`): every allowed edge p = 1."""
    embs = with_start_node(agent_embs) if with_start else np.asarray(agent_embs)
    if mlp is None:
        p = np.ones((len(context_embs), len(embs), len(embs)), np.float32)
    else:
        p = np.asarray(jax.nn.sigmoid(mlp.pair_logits(jnp.asarray(embs), jnp.asarray(context_embs))))
    allowed = ~np.eye(len(embs), dtype=bool)
    if with_start:
        allowed[:, -1] = False
    return p * allowed


# ---------------------------------------------------------------------------------------------------
# pi_prior as a policy, and as the KL target.
# ---------------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames="stop_floor")
def _prior_probs(z, p, prev, mask, start, visited, stop_floor: float):
    def one(z, p, prev, mask, start, visited):
        return prior_action_probs(z, p, prev, mask, start=start, visited=visited, stop_floor=stop_floor)

    return jax.vmap(one)(z, p, prev, mask, start, visited)


def prior_probs(
    states: Sequence[State], masks: np.ndarray, specs: Mapping[str, GraphSpec], stop_floor: float
) -> np.ndarray:
    """pi_prior [R, A] of each state under its task's GraphSpec, restricted to masks [R, A] (R >= len(states):
    rows past the states are padding and put all mass on STOP)."""
    rows = len(masks)
    spec = [specs[s.task.task_id] for s in states]
    z = pad_rows(np.stack([g.participation for g in spec]), rows)
    p = pad_rows(np.stack([g.edge_prior for g in spec]), rows)
    start = pad_rows(np.stack([g.participation if g.start_prior is None else g.start_prior for g in spec]), rows)
    visited = np.zeros(z.shape, bool)
    for r, s in enumerate(states):
        visited[r, list(s.history)] = True
    prev = np.full(rows, -1, np.int32)
    prev[: len(states)] = [s.prev for s in states]
    return np.asarray(_prior_probs(z, p, prev, masks, start.astype(np.float32), visited, float(stop_floor)))


def committed_next(
    spec: GraphSpec, history: Sequence[int], allowed: np.ndarray | None = None, edge_threshold: float = 0.0
) -> int:
    """The next agent of the structure GraphSpec commits to for a task (N = STOP), given the agents called
    so far: the first call is the START row's strongest retained agent (z_j if GraphSpec has no START row),
    each later one the strongest edge P_prior[prev, j] > edge_threshold from the agent called last to a
    retained agent not yet called; STOP when no such agent remains. `allowed` (bool [N] or [N + 1]) further
    restricts the agents (Eq. 11's H for the state). Ties go to the lower index, so it is deterministic."""
    n = len(spec.participation)
    candidates = spec.retained.copy()
    if allowed is not None:
        candidates &= np.asarray(allowed, bool)[:n]
    candidates[list(history)] = False
    if history:
        weights = np.asarray(spec.edge_prior[history[-1]], np.float64)
        candidates &= weights > edge_threshold
    else:
        weights = np.asarray(spec.participation if spec.start_prior is None else spec.start_prior, np.float64)
    if not candidates.any():
        return n
    return int(np.argmax(np.where(candidates, weights, -np.inf)))


def most_probable_path(
    spec: GraphSpec, *, max_steps: int, edge_threshold: float = 0.0, stop_floor: float = 0.05
) -> tuple[int, ...]:
    """The agent sequence pi_prior makes most probable for a task, STOP included: argmax over paths of
    prod_t pi_prior(a_t | s_t), where a path ends at STOP or after `max_steps` calls (the rollout's limit,
    no STOP factor then), each state restricted to Eq. 11's H (`structural_mask`) and to agents not yet called.
    pi_prior depends on a state only through (agent called last, agents called), so this is Dijkstra on
    -log pi_prior over those states: exact, and at most sum_k C(N, k) k states. Ties go to the lexicographically
    smaller path."""
    n = len(spec.participation)
    start = spec.participation if spec.start_prior is None else spec.start_prior
    z, p = jnp.asarray(spec.participation, jnp.float32), jnp.asarray(spec.edge_prior, jnp.float32)

    def probs(path: tuple[int, ...]) -> np.ndarray:
        prev = jnp.asarray(path[-1] if path else -1)
        mask = structural_mask(z, p, prev, edge_threshold=edge_threshold)
        visited = np.zeros(n, bool)
        visited[list(path)] = True
        return np.asarray(
            prior_action_probs(
                z,
                p,
                prev,
                mask,
                start=jnp.asarray(start, jnp.float32),
                visited=jnp.asarray(visited),
                stop_floor=stop_floor,
            )
        )

    heap: list[tuple[float, tuple[int, ...], bool]] = [(0.0, (), False)]
    expanded: set[tuple[int, frozenset[int]]] = set()
    while heap:
        cost, path, done = heapq.heappop(heap)
        if done:
            return path
        key = (path[-1] if path else -1, frozenset(path))
        if key in expanded:
            continue
        expanded.add(key)
        if len(path) >= max_steps:
            heapq.heappush(heap, (cost, path, True))
            continue
        pr = probs(path)
        for a in np.flatnonzero(pr > 0):
            step = cost - float(np.log(pr[a]))
            heapq.heappush(heap, (step, path, True) if a == n else (step, (*path, int(a)), False))
    return ()


@dataclasses.dataclass(frozen=True)
class PriorPolicy:
    """The "w/o pi_theta" ablation, the structure-centric system ("the system commits to a query-conditioned
    interaction structure prior to execution", MACA Sec. 1): no learned policy decides whether to go on; it
    executes the structure GraphSpec infers for the task. That structure is the agents the gate of Eq. 4
    retains (z_j > 0) connected by P_prior's edges above the mask's threshold (Eq. 11's H), and it is run in
    the order of the prior's edges (`committed_next`): open with the START row's choice, then repeatedly
    call the strongest edge from the agent called last to a retained agent not yet called, until no retained
    agent with an edge above the threshold remains (or the rollout's max_steps / budget ends the episode),
    then STOP. Deterministic: log-probs are 0 at that action and -inf elsewhere, so greedy and sampled
    rollouts agree. (An earlier version acted greedily on pi_prior's mode, whose STOP mass after a row's
    favourite edge ends most walks after ~2 calls: a stopping rule the committed structure does not have.)

    `structure="most_probable"` commits instead to the path pi_prior makes most probable, STOP included
    (`most_probable_path`, exact), and executes it. On the synthetic pool that path is short (the prior's
    STOP mass after a solver or checker is large), so it scores below the greedy reading
    (docs/results/maca_synthetic.md)."""

    specs: Mapping[str, GraphSpec]
    edge_threshold: float = 0.0
    structure: str = "greedy"
    max_steps: int = 6  # most_probable: the rollout's limit on calls
    stop_floor: float = 0.05  # most_probable: pi_prior's
    _paths: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.structure not in STRUCTURES:
            raise ValueError(f"structure must be one of {STRUCTURES}, got {self.structure!r}")

    def path(self, task_id: str) -> tuple[int, ...]:
        """The most probable path of a task (computed once)."""
        if task_id not in self._paths:
            self._paths[task_id] = most_probable_path(
                self.specs[task_id],
                max_steps=self.max_steps,
                edge_threshold=self.edge_threshold,
                stop_floor=self.stop_floor,
            )
        return self._paths[task_id]

    def __call__(self, states: Sequence[State], masks: np.ndarray) -> np.ndarray:
        masks = np.asarray(masks, bool)
        out = np.full(masks.shape, -np.inf, np.float32)
        n = masks.shape[1] - 1
        for r, s in enumerate(states):
            if self.structure == "greedy":
                a = committed_next(self.specs[s.task.task_id], s.history, masks[r], self.edge_threshold)
            else:
                path, t = self.path(s.task.task_id), len(s.history)
                a = path[t] if t < len(path) and path[:t] == s.history and masks[r, path[t]] else n
            out[r, a] = 0.0
        return out
