"""Evaluation and analyses of MACA runs: held-out accuracy and token cost, the exact best achievable
accuracy of the synthetic pool, agent transition matrices (Fig. 5) and the top-2 transition mass with and
without the prior (Fig. 3), the Table 3 ablations, the gamma / lambda sensitivity sweeps (Fig. 7) and the
gate's agent-selection precision and recall against gamma (Fig. 8).
Tables are written as markdown and JSON, figures as PNG, into the run directory.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

from porch_jax.maca.graphspec import GraphSpec
from porch_jax.maca.lm_policy import ActionPolicy
from porch_jax.maca.orchestrator import (
    ActionScorer,
    AgentWorld,
    Episode,
    OrchestrationTask,
    RolloutConfig,
    rollout,
)
from porch_jax.maca.pools import AgentPool
from porch_jax.maca.prior import PriorPolicy
from porch_jax.maca.settings import NO_POLICY_READINGS
from porch_jax.maca.synthetic import SyntheticPool
from porch_jax.maca.train import GRPOConfig, Variant, graphspecs, make_optimizer, restore_params, train_grpo
from porch_jax.typed_config import write_atomic

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt

# ---------------------------------------------------------------------------------------------------
# Evaluation.
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Evaluation:
    name: str
    episodes: tuple[Episode, ...]
    summary: dict[str, float]


def summarize(episodes: Sequence[Episode], world: AgentWorld) -> dict[str, float]:
    """Accuracy (drawn outcomes), expected accuracy (exact, where the judge knows p), mean token cost and
    calls per task, and the invalid-action rate (chosen actions outside the allowed set: 0 by construction)."""
    steps = [s for e in episodes for s in e.steps]
    out = {
        "accuracy": float(np.mean([e.correct for e in episodes])),
        "avg_cost": float(np.mean([e.cost for e in episodes])),
        "avg_calls": float(np.mean([len(e.path) for e in episodes])),
        "invalid_action_rate": float(np.mean([not s.mask[s.action] for s in steps])) if steps else 0.0,
    }
    probability = getattr(world.judge, "probability", None)
    if probability is not None:
        out["expected_accuracy"] = float(np.mean([probability(e.task, e.path) for e in episodes]))
    return out


def evaluate(
    name: str,
    policy: ActionScorer,
    tasks: Sequence[OrchestrationTask],
    world: AgentWorld,
    specs: Mapping[str, GraphSpec] | None,
    rollout_cfg: RolloutConfig,
    *,
    seed: int = 0,
) -> Evaluation:
    """One episode per held-out task under `rollout_cfg` (greedy or sampled)."""
    spec_list = None if specs is None else [specs[t.task_id] for t in tasks]
    episodes = asyncio.run(rollout(tasks, policy, world, spec_list, rollout_cfg, np.random.default_rng(seed)))
    return Evaluation(name, tuple(episodes), summarize(episodes, world))


# ---------------------------------------------------------------------------------------------------
# The synthetic pool's best achievable accuracy, exactly.
# ---------------------------------------------------------------------------------------------------


def best_achievable(world: SyntheticPool, tasks: Sequence[OrchestrationTask], max_steps: int) -> np.ndarray:
    """Per task, the highest success probability of any agent sequence the rollout could run (at most
    `max_steps` calls, each started while tokens remain), knowing the task's hidden difficulty: an upper
    bound for any policy. Exhaustive search, once per (family, difficulty, budget) class; agents without
    a role in the family are skipped (they never raise p). The reward-optimal search with no token cost."""
    return reward_optimal(world, tasks, max_steps, token_cost_weight=0.0)[0]


def _class_best(
    world: SyntheticPool,
    sources: Sequence[Any],
    max_steps: int,
    token_cost_weight: float = 0.0,
    token_unit: float = 1000.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Depth-first search shared by tasks that differ only in prompt length T. A call's prompt is the task
    plus every earlier completion, so k calls spend k * T + G, G = sum over calls of the completions so far.
    Returns per task the success probability and tokens of the path with the highest p - weight * tokens / unit."""
    src, budget = sources[0], sources[0].budget
    prompt, useful, completions = _call_tokens(world, sources)
    completion = {i: int(c[0]) for i, c in completions.items()}  # one difficulty per class: the same for all
    score, found, tokens = np.full(len(sources), -np.inf), np.zeros(len(sources)), np.zeros(len(sources))
    stack: list[tuple[tuple[int, ...], int, int]] = [((), 0, 0)]  # (path, completions so far, G)
    while stack:
        path, history, spent = stack.pop()
        if path:
            before_last = (len(path) - 1) * prompt + spent - history  # what was spent when the last call started
            p, cost = world.success_probability(src, path), len(path) * prompt + spent
            better = (before_last < budget) & (p - token_cost_weight * cost / token_unit > score)
            score = np.where(better, p - token_cost_weight * cost / token_unit, score)
            found, tokens = np.where(better, p, found), np.where(better, cost, tokens)
        if len(path) < max_steps and (not path or len(path) * prompt.min() + spent < budget):
            stack.extend(((*path, a), history + completion[a], spent + history + completion[a]) for a in useful)
    return found, tokens


def reward_optimal(
    world: SyntheticPool,
    tasks: Sequence[OrchestrationTask],
    max_steps: int,
    *,
    token_cost_weight: float,
    token_unit: float = 1000.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Per task, (success probability, tokens) of the agent sequence with the highest Eq. 12 reward without the
    KL, p - token_cost_weight * tokens / token_unit, among the sequences the rollout could run: what a policy that
    maximises that reward and knew the hidden difficulty would score (no mask). Exhaustive search, once per
    (family, difficulty, budget) class."""
    classes: dict[tuple, list[int]] = {}
    for m, t in enumerate(tasks):
        classes.setdefault((t.source.family, t.source.hard, t.budget), []).append(m)
    acc, tokens = np.zeros(len(tasks)), np.zeros(len(tasks))
    for members in classes.values():
        acc[members], tokens[members] = _class_best(
            world, [tasks[m].source for m in members], max_steps, token_cost_weight, token_unit
        )
    return acc, tokens


def masked_optimum(
    world: SyntheticPool,
    tasks: Sequence[OrchestrationTask],
    specs: Mapping[str, GraphSpec],
    max_steps: int,
    constraint: Any,
    *,
    token_cost_weight: float = 0.0,
    token_unit: float = 1000.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Per task, (success probability, tokens) of the best agent sequence that Eq. 11's H of the task's GraphSpec
    allows (`constraint`: an orchestrator.Constraint; the rollout's budget rule), best by
    p - token_cost_weight * tokens / token_unit (0: the mask's cap on expected accuracy). Exhaustive per task."""
    from porch_jax.maca.policy import structural_mask  # the rule the rollout applies

    acc, tokens = np.zeros(len(tasks)), np.zeros(len(tasks))
    for m, task in enumerate(tasks):
        spec = specs[task.task_id]
        n = len(spec.participation)
        prev = np.arange(-1, n)
        allowed = np.asarray(
            structural_mask(
                spec.participation,
                spec.edge_prior,
                prev,
                edge_threshold=constraint.edge_threshold,
                conditional=constraint.conditional,
            )
        )[:, :n]  # row 0: the first call
        best, stack = -np.inf, [()]
        while stack:
            path = stack.pop()
            if path:
                out = world.run(task.source, path, _RNG)
                if sum(out.step_tokens[:-1]) >= task.budget:
                    continue  # the last call would not have started
                score = out.probability - token_cost_weight * out.cost / token_unit
                if score > best:
                    best, acc[m], tokens[m] = score, out.probability, out.cost
            if len(path) < max_steps:
                stack.extend((*path, int(j)) for j in np.flatnonzero(allowed[path[-1] + 1 if path else 0]))
    return acc, tokens


def committed_optimum(
    world: SyntheticPool,
    tasks: Sequence[OrchestrationTask],
    max_steps: int,
    *,
    token_cost_weight: float = 0.0,
    token_unit: float = 1000.0,
) -> tuple[np.ndarray, np.ndarray, dict[str, tuple[int, ...]]]:
    """The best structure a structure-centric system could commit to upfront (MACA Sec. 1): one agent sequence per
    task family, chosen knowing the family but not a task's hidden difficulty, best by the mean over the family's
    tasks of p - token_cost_weight * tokens / token_unit. Each task runs the prefix of it the rollout would run
    (a call starts while tokens remain, at most `max_steps` calls). This is also the ceiling of any policy that,
    like ours on the synthetic pool, sees the task's family but nothing of its difficulty: its agents' replies
    carry no signal, so the best it can do is one sequence per family. Returns per task (success probability,
    tokens) and each family's sequence. Exhaustive over sequences of agents with a role in the family."""
    acc, tokens, paths = np.zeros(len(tasks)), np.zeros(len(tasks)), {}
    for family in sorted({t.source.family for t in tasks}):
        members = [m for m, t in enumerate(tasks) if t.source.family == family]
        src = [tasks[m].source for m in members]
        hard = np.array([s.hard for s in src])
        reps = {h: next(s for s in src if s.hard == h) for h in set(hard.tolist())}  # p depends on difficulty only
        prompt, useful, completion = _call_tokens(world, src)
        budget = np.array([s.budget for s in src])
        best = (-np.inf, None, None, ())
        # DFS state: path, per task (calls run, tokens spent, completions so far), per difficulty p of each prefix
        stack: list[tuple[tuple[int, ...], np.ndarray, np.ndarray, np.ndarray, dict[bool, list[float]]]] = [
            ((), np.zeros(len(src), int), np.zeros(len(src)), np.zeros(len(src)), {h: [0.0] for h in reps})
        ]
        while stack:
            path, calls, spent, history, p = stack.pop()
            if path:
                p_run = np.array([p[h][c] for h, c in zip(hard, calls, strict=False)])
                score = float(np.mean(p_run - token_cost_weight * spent / token_unit))
                if score > best[0]:
                    best = (score, p_run, spent, path)
            if len(path) == max_steps:
                continue
            live = (calls == len(path)) & (spent < budget)  # tasks the rollout is still running this sequence on
            if not live.any():
                continue
            for a in useful:
                c = np.where(live, completion[a], 0)
                step = {h: [*p[h], world.success_probability(reps[h], (*path, a))] for h in reps}
                stack.append(
                    ((*path, a), calls + live, spent + np.where(live, prompt + history + c, 0), history + c, step)
                )
        _, acc[members], tokens[members], paths[family] = best
    return acc, tokens, paths


_RNG = np.random.default_rng(0)  # `run` draws an outcome too; only its token counts are used here


def _call_tokens(world: SyntheticPool, sources: Sequence[Any]) -> tuple[np.ndarray, list[int], dict[int, np.ndarray]]:
    """For tasks of one family: each task's prompt tokens T (a call's prompt is T plus the completions before it),
    the agents with a role in the family (the others never raise p, so no search needs them) and each such agent's
    completion tokens per task."""
    prompt = np.array([world.run(s, (0,), _RNG).prompt_tokens[0] for s in sources])
    useful = [i for i in range(len(world.pool)) if world.competence(i, sources[0].family).role != "none"]
    completion = {i: np.array([world.run(s, (i,), _RNG).completion_tokens[0] for s in sources]) for i in useful}
    return prompt, useful, completion


# ---------------------------------------------------------------------------------------------------
# Transitions.
# ---------------------------------------------------------------------------------------------------


def gate_sparsity(
    q: np.ndarray, tasks: Sequence[OrchestrationTask], pool: AgentPool, gammas: Sequence[float]
) -> list[dict[str, float]]:
    """MACA Fig. 8: how Eq. 4's gate at each gamma trades the retained set's precision (the share of retained
    agents in the task's domain: its family's or the auxiliary roles, which every benchmark config pairs with a
    family) against its recall (the share of the family's own agents retained). Only the relevance q
    [tasks, N] is involved: no training. Precision is averaged over the tasks that retain any agent;
    `full_recall` is the share of tasks that keep their family's whole set, `retained` the mean set size."""
    q = np.asarray(q)
    if q.shape != (len(tasks), len(pool)):
        raise ValueError(f"q has shape {q.shape}; expected (tasks, agents) = ({len(tasks)}, {len(pool)})")
    family = np.stack([pool.family_mask(t.family) for t in tasks])
    domain = np.stack([pool.family_mask((t.family, "auxiliary")) for t in tasks])
    rows = []
    for gamma in gammas:
        kept = q >= gamma
        useful, size = (kept & domain).sum(1), kept.sum(1)
        recall = (kept & family).sum(1) / np.maximum(family.sum(1), 1)
        rows.append(
            {
                "gamma": float(gamma),
                "precision": float(np.mean(useful[size > 0] / size[size > 0])) if size.any() else float("nan"),
                "recall": float(recall.mean()),
                "full_recall": float(np.mean(recall == 1.0)),
                "retained": float(size.mean()),
            }
        )
    return rows


def transition_matrix(episodes: Sequence[Episode], n_agents: int) -> np.ndarray:
    """Empirical P(next | current) [N + 1, N + 1]: rows START + agents, columns agents + STOP (an episode
    the budget ended has no STOP step). Rows never visited are zero."""
    counts = np.zeros((n_agents + 1, n_agents + 1))
    for e in episodes:
        for s in e.steps:
            counts[s.state.prev + 1, s.action] += 1
    totals = counts.sum(1, keepdims=True)
    return np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)


def top2_mass(episodes: Sequence[Episode]) -> float:
    """Mean over decisions of the two largest probabilities of pi(. | s_t): how concentrated routing is."""
    masses = [np.sort(np.exp(s.log_probs))[-2:].sum() for e in episodes for s in e.steps]
    return float(np.mean(masses)) if masses else 0.0


# ---------------------------------------------------------------------------------------------------
# Variants and sweeps.
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Study:
    """Everything a variant run needs: the world, task splits with their GraphSpec parts (q [M, N],
    p [M, N, N]), a policy factory, the GRPO settings and the evaluation rollout; for the "pretrained_lm"
    reading of w/o pi_theta also `make_router`, the factory of the pretrained LM router."""

    world: AgentWorld
    train_tasks: Sequence[OrchestrationTask]
    eval_tasks: Sequence[OrchestrationTask]
    q_train: np.ndarray
    p_train: np.ndarray
    q_eval: np.ndarray
    p_eval: np.ndarray
    make_policy: Callable[[int], ActionPolicy]
    grpo: GRPOConfig
    gamma: float
    eval_rollout: RolloutConfig
    # w/o pi_theta: a structure it commits to ("greedy" / "most_probable": prior.PriorPolicy), "reference":
    # pi_ref, the untrained policy pi_theta starts from, acting greedily under GraphSpec's mask, or
    # "pretrained_lm": `make_router`'s pretrained LM, untrained, acting greedily under the mask (`run_variant`)
    structure: str = "greedy"
    make_router: Callable[[int], ActionScorer] | None = None

    def __post_init__(self) -> None:
        if self.structure not in NO_POLICY_READINGS:
            raise ValueError(
                f"structure (no_policy_structure) must be one of {NO_POLICY_READINGS}, got {self.structure!r}"
            )
        if self.structure == "pretrained_lm" and self.make_router is None:
            raise ValueError(
                'structure "pretrained_lm" routes w/o pi_theta by a pretrained LM: the study needs make_router '
                "(experiment.router_factory; config no_policy_lm.model_path)"
            )

    def specs(self, variant: Variant, gamma: float | None = None) -> tuple[dict | None, dict | None]:
        g = self.gamma if gamma is None else gamma
        train = graphspecs(self.q_train, self.p_train, variant.prior, g)
        evals = graphspecs(self.q_eval, self.p_eval, variant.prior, g)
        if train is None:
            return None, None
        return (
            {t.task_id: s for t, s in zip(self.train_tasks, train, strict=False)},
            {t.task_id: s for t, s in zip(self.eval_tasks, evals, strict=False)},
        )


def run_variant(
    study: Study,
    variant: Variant,
    *,
    seed: int = 0,
    gamma: float | None = None,
    checkpoint_dir: Path | None = None,
    checkpoint_every: int = 0,
    curve_every: int = 0,
    progress: Callable[[str], None] | None = None,
    restore_from: Path | None = None,
) -> tuple[Evaluation, list[dict[str, float]]]:
    """Trains (unless the variant has no policy) and evaluates one variant; returns the evaluation and the
    training history. `curve_every` > 0 also evaluates the policy on the held-out tasks every that many
    iterations (the history's `heldout_*` entries: `learning_curve`); it reads the policy only, so the
    trained policy and its final evaluation are unchanged. With `checkpoint_dir` training resumes from (or,
    finished, restores) the checkpoint there; `progress` gets training's periodic lines (`train_grpo`). With
    `restore_from` (a `train_grpo` checkpoint directory of another run) the policy is not trained here: its trained
    parameters are restored from there and evaluated; with GRPO's `iterations` 0, the initial policy is."""
    train_specs, eval_specs = study.specs(variant, gamma)
    constraint = dataclasses.replace(study.eval_rollout.constraint, use_mask=variant.mask)
    eval_cfg = dataclasses.replace(study.eval_rollout, constraint=constraint)
    if not variant.learn and study.structure in ("reference", "pretrained_lm"):
        # the paper's reading: its w/o pi_theta on GSM-Hard (Table 3, 47.96%) is its pretrained router, untrained,
        # inside the mask (Table 11, 47.47%); "pretrained_lm" is that router, "reference" pi_ref (with a
        # from-scratch head an arbitrary initialisation)
        router = study.make_router(seed) if study.structure == "pretrained_lm" else study.make_policy(seed)
        return evaluate(variant.name, router, study.eval_tasks, study.world, eval_specs, eval_cfg, seed=seed), []
    if not variant.learn:  # structure-centric: executes the structure GraphSpec commits to (PriorPolicy)
        policy = PriorPolicy(
            eval_specs, constraint.edge_threshold, study.structure, study.eval_rollout.max_steps, study.grpo.stop_floor
        )
        return evaluate(variant.name, policy, study.eval_tasks, study.world, eval_specs, eval_cfg, seed=seed), []
    policy = study.make_policy(seed)
    if restore_from is not None or study.grpo.iterations == 0:
        if restore_from is not None:
            policy.params = restore_params(restore_from, policy, make_optimizer(study.grpo))
        return evaluate(variant.name, policy, study.eval_tasks, study.world, eval_specs, eval_cfg, seed=seed), []
    grpo = dataclasses.replace(study.grpo, rollout=dataclasses.replace(study.grpo.rollout, constraint=constraint))

    def probe() -> dict[str, float]:
        return evaluate(variant.name, policy, study.eval_tasks, study.world, eval_specs, eval_cfg, seed=seed).summary

    history = train_grpo(
        policy,
        study.train_tasks,
        study.world,
        train_specs,
        variant,
        grpo,
        seed=seed,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        probe=probe,
        probe_every=curve_every,
        progress=progress,
    )
    return evaluate(variant.name, policy, study.eval_tasks, study.world, eval_specs, eval_cfg, seed=seed), history


def mean_summary(evals: Sequence[Evaluation]) -> dict[str, float]:
    """Mean of each metric over seeds, with `<metric>_sd` (sample sd, 0 for one seed)."""
    keys = evals[0].summary.keys()
    out: dict[str, float] = {}
    for k in keys:
        values = [e.summary[k] for e in evals]
        out[k] = float(np.mean(values))
        out[f"{k}_sd"] = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return out


def learning_curve(histories: Sequence[Sequence[Mapping[str, float]]]) -> list[dict[str, float]]:
    """The held-out metrics a variant's seeds recorded during training (`run_variant(curve_every=...)`), as
    rows {iterations trained, <metric>, <metric>_sd} (mean and sample sd over seeds) at the iterations
    every seed probed."""
    probed = [{h["iteration"] + 1: h for h in hist if any(k.startswith("heldout_") for k in h)} for hist in histories]
    if not probed:
        return []
    rows = []
    for it in sorted(set.intersection(*(set(p) for p in probed))):
        row: dict[str, float] = {"iterations": it}
        for k in (k for k in probed[0][it] if k.startswith("heldout_")):
            values = [p[it][k] for p in probed]
            metric = k.removeprefix("heldout_")
            row[metric] = float(np.mean(values))
            row[f"{metric}_sd"] = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------------
# Reports.
# ---------------------------------------------------------------------------------------------------


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_json(path: Path, obj: Any) -> None:
    """`obj` as `path`, replaced whole: a crash leaves the old file or the new one, never a torn one."""
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _two_panels(xlabel: str, left: str, right: str) -> tuple[Any, Any, Any]:
    """A figure with two side-by-side axes sharing the x label: (figure, left axis, right axis)."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, label in ((a1, left), (a2, right)):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
    return fig, a1, a2


def plot_transitions(matrix: np.ndarray, names: Sequence[str], path: Path, title: str) -> None:
    """Heatmap of the visited rows / reached columns of a transition matrix."""
    rows = [r for r in range(matrix.shape[0]) if matrix[r].sum() > 0]
    cols = [c for c in range(matrix.shape[1]) if matrix[:, c].sum() > 0]
    row_names, col_names = ["START", *names], [*names, "STOP"]
    fig, ax = plt.subplots(figsize=(1.0 + 0.55 * len(cols), 1.0 + 0.45 * len(rows)))
    image = ax.imshow(matrix[np.ix_(rows, cols)], cmap="Blues", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(cols)), [col_names[c] for c in cols], rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(rows)), [row_names[r] for r in rows], fontsize=7)
    for (i, r), (j, c) in itertools.product(enumerate(rows), enumerate(cols)):
        if matrix[r, c] >= 0.005:
            ax.text(
                j,
                i,
                f"{matrix[r, c]:.2f}",
                ha="center",
                va="center",
                fontsize=6,
                color="white" if matrix[r, c] > 0.6 else "black",
            )
    ax.set_xlabel("next")
    ax.set_ylabel("current")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.03)
    _save(fig, path)


def plot_sweep(rows: Sequence[Mapping[str, float]], param: str, path: Path, *, best: float | None = None) -> None:
    """Accuracy and token cost against one parameter (Fig. 7)."""
    xs = [r[param] for r in rows]
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    ax.errorbar(
        xs,
        [r["expected_accuracy"] for r in rows],
        yerr=[r.get("expected_accuracy_sd", 0.0) for r in rows],
        marker="o",
        color="tab:blue",
        label="accuracy",
    )
    if best is not None:
        ax.axhline(best, color="tab:blue", ls=":", lw=1, label="best achievable")
    ax.set_xlabel(param)
    ax.set_ylabel("expected accuracy", color="tab:blue")
    twin = ax.twinx()
    twin.plot(xs, [r["avg_cost"] for r in rows], marker="s", color="tab:red", label="tokens")
    twin.set_ylabel("avg tokens per task", color="tab:red")
    ax.set_title(f"sensitivity to {param}", fontsize=9)
    _save(fig, path)


def plot_gate_sparsity(rows: Sequence[Mapping[str, float]], path: Path, *, gamma: float | None = None) -> None:
    """Precision and recall of the gate's retained agents against gamma (Fig. 8), the configured gamma marked."""
    xs = [r["gamma"] for r in rows]
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    for key, marker in (("precision", "o"), ("recall", "s"), ("full_recall", "^")):
        ax.plot(xs, [r[key] for r in rows], marker=marker, lw=1.2, label=key.replace("_", " "))
    if gamma is not None:
        ax.axvline(gamma, color="gray", ls=":", lw=1, label=f"gamma = {gamma:g}")
    ax.set_xlabel("gamma")
    ax.set_ylim(0.0, 1.02)
    ax.set_title("agent-selection sparsity (held-out tasks)", fontsize=9)
    ax.legend(fontsize=7)
    _save(fig, path)


def plot_learning_curves(
    curves: Mapping[str, Sequence[Mapping[str, float]]],
    flat: Mapping[str, Mapping[str, float]],
    path: Path,
    *,
    metric: str = "expected_accuracy",
    best: float | None = None,
) -> None:
    """Held-out `metric` and tokens per task against GRPO iterations, mean over seeds with a +-sd band; systems
    that do not learn (`flat`: their evaluation rows) as horizontal dashed lines."""
    fig, a1, a2 = _two_panels("GRPO iterations", f"held-out {metric.replace('_', ' ')}", "held-out tokens per task")
    for name, rows in curves.items():
        if not rows:
            continue
        it = np.array([r["iterations"] for r in rows])
        for ax, key in ((a1, metric), (a2, "avg_cost")):
            mean = np.array([r[key] for r in rows])
            sd = np.array([r.get(f"{key}_sd", 0.0) for r in rows])
            (line,) = ax.plot(it, mean, lw=1.2, label=name)
            ax.fill_between(it, mean - sd, mean + sd, color=line.get_color(), alpha=0.15, lw=0)
    for name, row in flat.items():
        for ax, key in ((a1, metric), (a2, "avg_cost")):
            ax.axhline(row[key], ls="--", lw=1, color="gray", label=name if ax is a1 else None)
    if best is not None:
        a1.axhline(best, ls=":", lw=1, color="black", label="best achievable")
    a1.legend(fontsize=6)
    _save(fig, path)


def plot_training(histories: Mapping[str, Sequence[Mapping[str, float]]], path: Path) -> None:
    """Per-iteration training accuracy and cost of each run."""
    fig, a1, a2 = _two_panels("iteration", "train accuracy", "train tokens per episode")
    for name, hist in histories.items():
        if hist:
            it = [h["iteration"] for h in hist]
            a1.plot(it, [h["accuracy"] for h in hist], label=name, lw=1)
            a2.plot(it, [h["cost"] for h in hist], label=name, lw=1)
    a1.legend(fontsize=6)
    _save(fig, path)
