"""MACA end to end, as functions a launcher or a notebook calls: GraphSpec prior learning, token-aware GRPO,
evaluation, the Table 3 ablations with held-out learning curves (`curve_every`), the gamma / lambda sweeps,
transition analyses, the comparison baselines (benchmark worlds: `baselines.systems`), the gate's precision /
recall against gamma (Fig. 8), the oracle ceilings and (synthetic config) the LM-policy check. With
`lambda_selection.enabled` lambda is first chosen for MACA on a validation split drawn from the training
distribution (`select_lambda`) and used for MACA and every ablation that keeps the prior KL.

`run(cfg)` writes RUN_DIR/results.json, RUN_DIR/tables.md and PNG figures; RUN_DIR/checkpoints holds the learned
prior and an Orbax checkpoint of every training run (system x seed, lambda-selection and sweep points), so the same
call after a crash resumes where the run stopped (RUN_DIR/config.json: another config there is refused).
`launch/maca.py` is the command-line app around it. `add_baselines` runs baselines a finished run's results lack
and adds their rows (the real-agent table's rerun with new comparison systems).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from absl import logging

from porch_jax.backends import Backend
from porch_jax.backends.cache import CacheStats, counts_since, scope, scope_counts
from porch_jax.envs.benchmarks.base import evaluate as evaluate_benchmark
from porch_jax.maca import analysis, baselines, multi_agent
from porch_jax.maca.adaptive import Learned
from porch_jax.maca.config import GATE_GAMMAS, BackendConfig, LMConfig, MacaConfig, WorldConfig
from porch_jax.maca.encoder import HashingEncoder, SentenceEncoder, SentenceTransformerEncoder
from porch_jax.maca.graphspec import BudgetTemperature, context_text
from porch_jax.maca.lm_policy import ActionPolicy, head_policy, lm_policy, router_policy, tiny_lm
from porch_jax.maca.orchestrator import (
    AgentWorld,
    Constraint,
    OrchestrationTask,
    RolloutConfig,
    benchmark_tasks,
    benchmark_world,
    synthetic_tasks,
    synthetic_world,
)
from porch_jax.maca.pools import AgentPool, load_pool
from porch_jax.maca.prior import (
    PriorConfig,
    edge_probs,
    learn_edge_mlp,
    relevance_scores,
    restore_edge_mlp,
    save_edge_mlp,
)
from porch_jax.maca.settings import ADAPTIVE, VARIANTS, training_scope
from porch_jax.maca.synthetic import SyntheticPool, make_tasks
from porch_jax.maca.train import GRPOConfig, Variant
from porch_jax.progress import ProgressLine
from porch_jax.train.mesh import make_mesh
from porch_jax.typed_config import claim_run_dir, to_dict

__all__ = ["GATE_GAMMAS", "gate_report", "run", "tables"]  # GATE_GAMMAS: Fig. 8's default grid (maca/config.py)


# ---------------------------------------------------------------------------------------------------
# Building the pieces from a config.
# ---------------------------------------------------------------------------------------------------


def build_backend(cfg: BackendConfig) -> Backend:
    """The agents' backend for a benchmark world (the synthetic world brings its own)."""
    if cfg.kind == "served":
        return cfg.endpoint.backend()
    raise ValueError(f"backend.kind must be 'served' for a benchmark world (or pass a backend), got {cfg.kind!r}")


def build_tasks(cfg: MacaConfig) -> tuple[list[OrchestrationTask], list[OrchestrationTask]]:
    """The configured world's train and held-out eval tasks (no agent is involved)."""
    w = cfg.world
    if w.kind == "synthetic":
        return _synthetic_split(w, w.num_train, w.train_seed), _synthetic_split(w, w.num_eval, w.eval_seed)
    if w.kind == "benchmark":
        from porch_jax.envs.benchmarks import load_tasks

        train = load_tasks(w.benchmark, "train", data_dir=w.data_dir or None, subset=w.subset)[: w.num_train]
        test = load_tasks(w.benchmark, "test", data_dir=w.data_dir or None, subset=w.subset)[: w.num_eval]
        return benchmark_tasks(train, w.budget), benchmark_tasks(test, w.budget)
    raise ValueError(f"world.kind must be 'synthetic' or 'benchmark', got {w.kind!r}")


def _synthetic_split(w: WorldConfig, n: int, seed: int) -> list[OrchestrationTask]:
    return synthetic_tasks(
        make_tasks(n, families=w.families, hard_fraction=w.hard_fraction, budget=w.budget, seed=seed)
    )


def build_world(
    cfg: MacaConfig, backend: Backend | None = None
) -> tuple[AgentWorld, list[OrchestrationTask], list[OrchestrationTask], SyntheticPool | None]:
    """(world, train tasks, eval tasks, the synthetic pool when the world is synthetic)."""
    pool = load_pool(cfg.pool_families)
    train, evals = build_tasks(cfg)
    if cfg.world.kind == "synthetic":
        spool = SyntheticPool(pool)
        return synthetic_world(spool), train, evals, spool
    from porch_jax.envs.benchmarks import BENCHMARKS

    world = benchmark_world(
        BENCHMARKS[cfg.world.benchmark], pool, backend or build_backend(cfg.backend), cfg.backend.sampling
    )
    return world, train, evals, None


def build_encoder(name: str) -> SentenceEncoder:
    """`encoder` in a config: "minilm" (the packaged all-MiniLM-L6-v2), "hashing" (a test stand-in), or any
    sentence-transformers model: a local folder, or a hub id such as "BAAI/bge-small-en-v1.5" (the paper's BGE)
    where a hub is reachable."""
    if name == "minilm":
        return SentenceTransformerEncoder()
    if name == "hashing":
        return HashingEncoder()
    return SentenceTransformerEncoder(name)


def contexts(encoder: SentenceEncoder, tasks: Sequence[OrchestrationTask]) -> np.ndarray:
    """e(x, b) [M, d] of each task (Eq. 4's task side)."""
    return encoder.encode([context_text(t.prompt, t.budget) for t in tasks])


def prior_config(cfg: MacaConfig) -> PriorConfig:
    t = cfg.graphspec.temperature
    return dataclasses.replace(
        cfg.prior, gamma=cfg.graphspec.gamma, temperature=BudgetTemperature(t.base, t.reference, t.exponent)
    )


def grpo_config(cfg: MacaConfig, **overrides: Any) -> GRPOConfig:
    constraint = Constraint(True, cfg.graphspec.edge_threshold, cfg.graphspec.conditional_edges)
    settings = {f.name: getattr(cfg.grpo, f.name) for f in dataclasses.fields(GRPOConfig)}  # lambda goes per variant
    rollout = RolloutConfig(max_steps=cfg.rollout.max_steps, constraint=constraint)
    return GRPOConfig(**settings | {"stop_floor": cfg.graphspec.stop_floor, "rollout": rollout} | overrides)


def policy_factory(
    cfg: MacaConfig, names: Sequence[str], embeddings: dict[str, np.ndarray]
) -> Callable[[int], ActionPolicy]:
    p = cfg.policy
    if p.kind == "head":
        return lambda seed: head_policy(embeddings, len(names), cfg.rollout.max_steps, hidden=p.hidden, seed=seed)
    if p.kind == "lm":
        return lm_factory(p.lm, names)
    raise ValueError(f"policy.kind must be 'head' or 'lm', got {p.kind!r}")


def lm_factory(cfg: LMConfig, names: Sequence[str]) -> Callable[[int], ActionPolicy]:
    """LM policies: a Hugging Face folder (model_path) or a tiny Qwen3 built in-process; `mesh` (data, fsdp,
    tensor) splits the policy over devices as the trainers do (one device when absent or (1, 1, 1))."""
    shape = cfg.mesh
    mesh = make_mesh(shape) if int(np.prod(shape)) > 1 else None
    if cfg.model_path:
        from transformers import AutoTokenizer

        from porch_jax.models import from_pretrained

        tokenizer = AutoTokenizer.from_pretrained(cfg.model_path)
        return lambda seed: lm_policy(
            from_pretrained(cfg.model_path),
            tokenizer,
            names,
            mesh=mesh,
            max_task_words=cfg.max_task_words or None,
            uniform_offset=False,
        )
    _, tokenizer = tiny_lm(0, **cfg.overrides)  # the tokenizer is the same for every seed
    return lambda seed: lm_policy(
        tiny_lm(seed, **cfg.overrides)[0],
        tokenizer,
        names,
        mesh=mesh,
        max_task_words=cfg.max_task_words or None,
        uniform_offset=True,
    )


def router_factory(cfg: LMConfig, pool: AgentPool) -> Callable[[int], ActionPolicy]:
    """w/o pi_theta's "pretrained_lm" router: the Hugging Face folder's LM, untrained, routing inside Eq. 11's
    mask by the chat-template router prompt (`lm_policy.router_policy`). The seed changes nothing (no sampling,
    no initialisation), so the model is loaded once."""
    if not cfg.model_path:
        raise ValueError("the pretrained LM router needs no_policy_lm.model_path (a Hugging Face folder)")
    from transformers import AutoTokenizer

    from porch_jax.models import from_pretrained

    shape = cfg.mesh
    mesh = make_mesh(shape) if int(np.prod(shape)) > 1 else None
    router = router_policy(
        from_pretrained(cfg.model_path),
        AutoTokenizer.from_pretrained(cfg.model_path),
        pool,
        max_task_words=cfg.max_task_words or None,
        mesh=mesh,
    )
    return lambda seed: router


@dataclasses.dataclass
class Setup:
    study: analysis.Study
    spool: SyntheticPool | None
    best: np.ndarray | None  # per eval task
    timings: dict[str, float]
    prior_stats: dict[str, Any]
    validation: analysis.Study | None = None  # the study with a validation split as its eval tasks (lambda selection)
    encoder: SentenceEncoder | None = None  # e(x, b)'s encoder, also the adaptive baselines' frozen features


def build_setup(cfg: MacaConfig, backend: Backend | None = None, log: Callable[[str], None] = print) -> Setup:
    """World, tasks, embeddings, the learned structural prior (Algorithm 1, lines 3-7) and the study."""
    # the prior and the training runs resume from what RUN_DIR holds; another config there is refused, but for the
    # baselines: they keep no state there (every rerun replays their calls from the exact response cache; MaAS and
    # Puppeteer have no checkpoint, their training replays too), so baselines can be added to a finished run
    claim_run_dir(cfg.run_dir, cfg, may_change={"baselines"}, defaults=MacaConfig(cfg.run_dir))
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    world, train, evals, spool = build_world(cfg, backend)
    encoder = build_encoder(cfg.encoder)
    agent_embs = encoder.encode([a.profile for a in world.pool])
    ctx_train, ctx_eval = contexts(encoder, train), contexts(encoder, evals)
    timings["encode_s"] = time.perf_counter() - t0
    pcfg = prior_config(cfg)
    q_train = relevance_scores(ctx_train, agent_embs, [t.budget for t in train], pcfg.temperature)
    q_eval = relevance_scores(ctx_eval, agent_embs, [t.budget for t in evals], pcfg.temperature)
    t0 = time.perf_counter()
    prior_dir = Path(cfg.run_dir) / "checkpoints" / "prior"
    cached = restore_edge_mlp(prior_dir, agent_embs.shape[1], pcfg.mlp_hidden)
    if cached is None:
        mlp, prior_stats = learn_edge_mlp(
            world, train, ctx_train, agent_embs, q_train, pcfg, seed=cfg.seed, progress=logging.info
        )
        save_edge_mlp(prior_dir, mlp, prior_stats)
    else:
        mlp, prior_stats = cached
    timings["prior_s"] = time.perf_counter() - t0
    log(
        f"prior {'learned' if cached is None else 'restored from ' + str(prior_dir)} in {timings['prior_s']:.0f} s: "
        f"{prior_stats}"
    )
    embeddings = {t.task_id: e for t, e in zip(train, ctx_train, strict=False)} | {
        t.task_id: e for t, e in zip(evals, ctx_eval, strict=False)
    }
    val = validation_tasks(cfg)
    if val:
        ctx_val = contexts(encoder, val)
        embeddings |= {t.task_id: e for t, e in zip(val, ctx_val, strict=False)}
    eval_rollout = RolloutConfig(
        max_steps=cfg.rollout.max_steps,
        greedy=True,
        constraint=Constraint(True, cfg.graphspec.edge_threshold, cfg.graphspec.conditional_edges),
    )
    p_train = edge_probs(mlp, agent_embs, ctx_train, with_start=pcfg.with_start)
    p_eval = edge_probs(mlp, agent_embs, ctx_eval, with_start=pcfg.with_start)
    study = analysis.Study(
        world,
        train,
        evals,
        q_train,
        p_train,
        q_eval,
        p_eval,
        policy_factory(cfg, world.pool.names, embeddings),
        grpo_config(cfg),
        cfg.graphspec.gamma,
        eval_rollout,
        cfg.no_policy_structure,
        router_factory(cfg.no_policy_lm, world.pool) if cfg.no_policy_structure == "pretrained_lm" else None,
    )
    best = analysis.best_achievable(spool, evals, cfg.rollout.max_steps) if spool is not None else None
    validation = None
    if val:
        validation = dataclasses.replace(
            study,
            eval_tasks=val,
            q_eval=relevance_scores(ctx_val, agent_embs, [t.budget for t in val], pcfg.temperature),
            p_eval=edge_probs(mlp, agent_embs, ctx_val, with_start=pcfg.with_start),
        )
    return Setup(study, spool, best, timings, prior_stats, validation, encoder)


def validation_tasks(cfg: MacaConfig) -> list[OrchestrationTask]:
    """The lambda-selection split: tasks from the training distribution (the world's families, hard fraction
    and budget) on a seed of their own, so disjoint from the held-out eval tasks. [] when selection is off,
    and for a benchmark world: no validation split is drawn there (each grid point would train the policy
    against live agents), so it keeps the configured lambda (`run` records the selection as skipped)."""
    sel, w = cfg.lambda_selection, cfg.world
    if not sel.enabled or w.kind != "synthetic":
        return []  # MacaConfig checks that task_seed differs from the train and eval seeds
    return _synthetic_split(w, sel.num_tasks, sel.task_seed)


# ---------------------------------------------------------------------------------------------------
# The experiment.
# ---------------------------------------------------------------------------------------------------


def variant(cfg: MacaConfig, name: str, **changes: Any) -> Variant:
    """A Table 3 variant with the config's lambda (unconstrained GRPO keeps lambda = 0)."""
    v = VARIANTS[name]
    if name != "grpo":
        v = dataclasses.replace(v, prior_kl_weight=cfg.grpo.prior_kl_weight)
    return dataclasses.replace(v, **changes)


def _row(name: str, evals: Sequence[analysis.Evaluation], best: float | None, **extra: Any) -> dict[str, Any]:
    row = {"system": name, **analysis.mean_summary(evals), **extra}
    row["top2_mass"] = float(np.mean([analysis.top2_mass(e.episodes) for e in evals]))
    if best is not None:
        row["of_best"] = row["expected_accuracy"] / best
    return row


def _resumable(cfg: MacaConfig, run: str, seed: int) -> dict[str, Any]:
    """run_variant's checkpoint arguments for one training run of the experiment: its own directory under
    RUN_DIR/checkpoints, saved every `checkpoint_every` iterations (0: at the end only) and resumed from there;
    training's progress lines go to the log (absl's, so they carry time stamps)."""
    return {
        "checkpoint_dir": Path(cfg.run_dir) / "checkpoints" / run / f"seed_{seed}",
        "checkpoint_every": cfg.checkpoint_every,
        "progress": lambda line: logging.info("%s: %s", run, line),
    }


def run_systems(
    cfg: MacaConfig, setup: Setup, run_dir: Path, log: Callable[[str], None]
) -> tuple[list[dict[str, Any]], dict[str, list[analysis.Evaluation]], dict[str, list]]:
    """Every configured system over every seed: table rows, the evaluations per system (in seed order) and
    the first seed's training history per system."""
    best = float(setup.best.mean()) if setup.best is not None else None
    rows, evaluations, histories = [], {}, {}
    for name in cfg.systems:
        evals, hists, start = [], [], time.perf_counter()
        for seed in cfg.seeds:
            trained_elsewhere = Path(cfg.policy_from, "checkpoints", name, f"seed_{seed}") if cfg.policy_from else None
            evaluation, history = analysis.run_variant(
                setup.study,
                variant(cfg, name),
                seed=seed,
                curve_every=cfg.curve_every,
                restore_from=trained_elsewhere,
                **_resumable(cfg, name, seed),
            )
            evals.append(evaluation)
            hists.append(history)
        evaluations[name], histories[name] = evals, hists
        extra: dict[str, Any] = {"seconds": time.perf_counter() - start}
        if cfg.world.kind == "benchmark":  # per-task records of the first seed (a benchmark table's intervals)
            names = setup.study.world.pool.names
            extra["correct"] = [e.correct for e in evals[0].episodes]
            extra["paths"] = [" > ".join(names[a] for a in e.path) for e in evals[0].episodes]
            extra["extracted"] = [baselines.extracted(e.task.source, e.answer) for e in evals[0].episodes]
            extra["policy"] = policy_source(cfg, name)
        rows.append(_row(name, evals, best, **extra))
        log(f"{name}: {_brief(rows[-1])}")
    return rows, evaluations, histories


def policy_source(cfg: MacaConfig, name: str) -> str:
    """Where system `name`'s pi_theta comes from in this run (a table row says it)."""
    if not VARIANTS[name].learn:
        return "none"
    if cfg.policy_from:
        return f"trained in {cfg.policy_from}"
    return "untrained" if cfg.grpo.iterations == 0 else f"trained here ({cfg.grpo.iterations} iterations)"


PAPER_TABLE3_ORDER = ("maca", "no_policy", "no_z_prior", "no_p_prior", "no_graphspec")  # by accuracy, MACA Table 3


def curve_orders(
    curves: dict[str, list[dict[str, Any]]], systems: Sequence[dict[str, Any]], key: str
) -> list[dict[str, Any]]:
    """At each probed iteration: the systems' held-out `key` (learning systems from their curves, the others
    at their final value), the measured order, and whether the Table 3 systems present order as the paper's
    Table 3 (all of them, and the learning ones alone)."""
    flat = {r["system"]: r[key] for r in systems if not curves.get(r["system"])}
    points = sorted({r["iterations"] for c in curves.values() for r in c})
    out = []
    for it in points:
        value = dict(flat) | {n: r[key] for n, c in curves.items() for r in c if r["iterations"] == it}
        measured = sorted(value, key=lambda n: -value[n])
        paper = [n for n in PAPER_TABLE3_ORDER if n in value]
        learning = [n for n in paper if n not in flat]
        out.append(
            {
                "iterations": it,
                **value,
                "order": " > ".join(measured),
                "paper_order": [n for n in measured if n in paper] == paper,
                "paper_order_learning": [n for n in measured if n in learning] == learning,
            }
        )
    return out


def iterations_to(
    curve: list[dict[str, Any]], key: str, best: float, shares: Sequence[float] = (0.9, 0.95)
) -> dict[str, int | None]:
    """Sample efficiency: per share of the best achievable, the first probe whose seed mean reaches it (None:
    none did)."""
    out = {}
    for share in shares:
        hit = [r["iterations"] for r in curve if r[key] >= share * best]
        out[f"iterations_to_{round(share * 100)}pct"] = hit[0] if hit else None
    return out


def run_sweep(
    cfg: MacaConfig, setup: Setup, param: str, values: Sequence[float], log: Callable[[str], None]
) -> list[dict]:
    """MACA with one parameter varied (gamma: the relevance gate; prior_kl_weight: lambda)."""
    best = float(setup.best.mean()) if setup.best is not None else None
    rows = []
    for value in values:
        evals = []
        for seed in cfg.sweep_seeds:
            if param == "gamma":
                evaluation, _ = analysis.run_variant(
                    setup.study,
                    variant(cfg, "maca"),
                    seed=seed,
                    gamma=value,
                    **_resumable(cfg, f"sweep_gamma_{value}", seed),
                )
            else:
                evaluation, _ = analysis.run_variant(
                    setup.study,
                    variant(cfg, "maca", prior_kl_weight=value),
                    seed=seed,
                    **_resumable(cfg, f"sweep_prior_kl_weight_{value}", seed),
                )
            evals.append(evaluation)
        rows.append(_row("maca", evals, best, **{param: value}))
        log(f"{param}={value}: {_brief(rows[-1])}")
    return rows


def run_baselines(cfg: MacaConfig, setup: Setup, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """The comparison systems (`settings.BASELINES`: Table 1's single-model ones, Table 11's LLM routers, which
    route under MACA's GraphSpec, and multi_agent.py's multi-agent systems) on the held-out tasks through the agents'
    backend: accuracy by the benchmark's checker, cost = every call's prompt + completion tokens, and the routers'
    invalid-action rate. MaAS and Puppeteer first learn on the training tasks through the same backend (no
    checkpoint: with the response cache a rerun replays their training's calls), their rows adding each task's
    architecture or agent path and the training's history and tokens. Each system's calls count under its name as
    the response cache's scope (its training's under `training_scope`); where the backend keeps scopes
    (a `CachedBackend`), each row records its calls' `cache` counts (`training_cache` for the training): misses
    are the calls that reached the model."""
    study = setup.study
    benchmark = study.world.judge.benchmark
    _, specs = study.specs(variant(cfg, "maca"))
    sampling = cfg.backend.sampling
    limit = asyncio.Semaphore(cfg.baselines.concurrency)
    exemplars = [t.source for t in study.train_tasks]  # ComplexCoT's pool: never a held-out task
    before = scope_counts(study.world.backend)
    learned, training = train_adaptive_baselines(cfg, setup, log)
    total, finished = len(cfg.baselines.systems) * len(study.eval_tasks), 0
    line = ProgressLine(total, log, unit="episodes")

    async def one(name: str, task: OrchestrationTask, seed: int) -> baselines.RunResult:
        nonlocal finished
        async with limit:
            with scope(name):
                result = await multi_agent.run_system(
                    name,
                    study.world.backend,
                    task.source,
                    study.world.pool,
                    specs[task.task_id],
                    exemplars=exemplars,
                    max_steps=cfg.rollout.max_steps,
                    edge_threshold=cfg.graphspec.edge_threshold,
                    sampling=sampling,
                    seed=seed,
                    learned=learned,
                )
        finished += 1
        line(finished, f"baselines: {finished}/{total} episodes")
        return result

    async def every_system() -> list[list[baselines.RunResult]]:
        # every system's tasks at once under one bound: the served agents batch what is in flight
        runs = [[one(name, t, k) for k, t in enumerate(study.eval_tasks)] for name in cfg.baselines.systems]
        flat = await asyncio.gather(*(c for system in runs for c in system))
        n = len(study.eval_tasks)
        return [list(flat[i * n : (i + 1) * n]) for i in range(len(runs))]

    start = time.perf_counter()
    by_system = asyncio.run(every_system())
    seconds = time.perf_counter() - start
    after = scope_counts(study.world.backend)
    calls = counts_since(before, after) if before is not None and after is not None else None
    rows = []
    for name, runs in zip(cfg.baselines.systems, by_system, strict=True):
        answers = {t.source.task_id: r.to_answer() for t, r in zip(study.eval_tasks, runs, strict=False)}
        report = evaluate_benchmark(
            benchmark, [t.source for t in study.eval_tasks], lambda task, answers=answers: answers[task.task_id]
        )
        row = {
            "system": name,
            "accuracy": report.accuracy,
            "avg_cost": report.avg_cost,
            "avg_calls": float(np.mean([r.calls for r in runs])),
            "seconds_all_baselines": seconds,
            "correct": [r.correct for r in report.results],
            "extracted": [baselines.extracted(t.source, r.answer) for t, r in zip(study.eval_tasks, runs, strict=True)],
        }
        if name.startswith("router_"):
            row["invalid_action_rate"] = baselines.invalid_action_rate(runs)
            row["avg_agents"] = float(np.mean([len(r.path) for r in runs]))
        if name in training:
            history = training[name]
            row["paths"] = [" > ".join(r.path) for r in runs]
            row["policy"] = f"trained here ({len(history)} REINFORCE iterations)" if history else "untrained"
            row["training"] = history
            row["training_tokens"] = sum(h["tokens"] * h["episodes"] for h in history)
        if calls is not None:
            row["cache"] = calls.get(name, CacheStats()).to_dict()
            if name in training:
                row["training_cache"] = calls.get(training_scope(name), CacheStats()).to_dict()
        rows.append(row)
        log(f"baseline {name}: {_brief(row)}")
    return rows


def train_adaptive_baselines(
    cfg: MacaConfig, setup: Setup, log: Callable[[str], None]
) -> tuple[Learned | None, dict[str, list[dict[str, Any]]]]:
    """The configured adaptive baselines (MaAS, Puppeteer) trained on the training tasks through the agents'
    backend, scored by the benchmark's checker, on the features of the study's encoder; (None, {}) where none is
    configured."""
    names = [n for n in cfg.baselines.systems if n in ADAPTIVE]
    if not names:
        return None, {}
    study, b = setup.study, cfg.baselines
    start = time.perf_counter()
    learned, training = asyncio.run(
        multi_agent.train_adaptive(
            names,
            study.world.backend,
            [t.source for t in study.train_tasks],
            study.world.pool,
            study.world.judge.benchmark.check,
            setup.encoder,
            maas_config=b.maas,
            puppeteer_config=b.puppeteer,
            max_steps=cfg.rollout.max_steps,
            sampling=cfg.backend.sampling,
            seed=cfg.seed,
            concurrency=b.concurrency,
            log=log,
        )
    )
    seconds = time.perf_counter() - start
    for name, history in training.items():
        last = ", ".join(f"{k} {v:.3f}" for k, v in history[-1].items() if k != "iteration") if history else "untrained"
        log(f"{name} trained on {len(study.train_tasks)} tasks ({seconds:.0f} s for all): last iteration {last}")
    return learned, training


def _brief(row: dict[str, Any]) -> str:
    keys = ("expected_accuracy", "accuracy", "avg_cost", "avg_calls", "of_best")
    return ", ".join(f"{k} {row[k]:.3f}" for k in keys if k in row)


def select_lambda(cfg: MacaConfig, setup: Setup, log: Callable[[str], None]) -> dict[str, Any]:
    """Chooses lambda (the prior-KL weight of Eq. 12) once, for MACA, on the validation split: MACA is trained
    on the training tasks with each value of the grid and each selection seed, evaluated greedily on the
    validation tasks, and the value with the highest mean validation reward (expected accuracy - beta *
    tokens / token_unit: Eq. 12's r without the KL regulariser) is chosen. The held-out eval tasks are not
    seen. The paper's lambda = 0.7 is in its reward units; ours weigh the KL term differently."""
    sel = cfg.lambda_selection
    g = cfg.grpo
    rows = []
    for value in sel.grid:
        evals = [
            analysis.run_variant(
                setup.validation,
                variant(cfg, "maca", prior_kl_weight=value),
                seed=seed,
                **_resumable(cfg, f"select_lambda_{value}", seed),
            )[0]
            for seed in sel.seeds
        ]
        row = {"prior_kl_weight": value, **analysis.mean_summary(evals)}
        row["reward"] = row["expected_accuracy"] - g.token_cost_weight * row["avg_cost"] / g.token_unit
        rows.append(row)
        log(f"lambda selection, prior_kl_weight={value}: validation reward {row['reward']:.4f}, {_brief(row)}")
    chosen = max(rows, key=lambda r: r["reward"])["prior_kl_weight"]
    log(f"lambda selection: chose prior_kl_weight={chosen}")
    return {
        "chosen": chosen,
        "criterion": "expected_accuracy - token_cost_weight * avg_cost / token_unit",
        "num_tasks": len(setup.validation.eval_tasks),
        "task_seed": sel.task_seed,
        "seeds": list(sel.seeds),
        "rows": rows,
    }


def run_lm_check(cfg: MacaConfig, setup: Setup, log: Callable[[str], None]) -> dict[str, Any]:
    """MACA with the LM policy on the reduced setting: held-out accuracy before and after training, and the
    measured seconds per iteration (the full sweep uses the head)."""
    lc = cfg.lm_check
    study = setup.study

    def keep(tasks):
        return [i for i, t in enumerate(tasks) if t.family in lc.families]

    tr, ev = keep(study.train_tasks)[: lc.num_train], keep(study.eval_tasks)[: lc.num_eval]
    grpo = grpo_config(
        cfg,
        iterations=lc.iterations,
        tasks_per_iteration=lc.tasks_per_iteration,
        learning_rate=lc.learning_rate,
        epochs=lc.epochs,
    )
    reduced = dataclasses.replace(
        study,
        train_tasks=[study.train_tasks[i] for i in tr],
        eval_tasks=[study.eval_tasks[i] for i in ev],
        q_train=study.q_train[tr],
        p_train=study.p_train[tr],
        q_eval=study.q_eval[ev],
        p_eval=study.p_eval[ev],
        make_policy=lm_factory(lc.lm, study.world.pool.names),
        grpo=grpo,
    )
    maca = variant(cfg, "maca")
    _, eval_specs = reduced.specs(maca)
    before = analysis.evaluate(
        "lm_init",
        reduced.make_policy(cfg.seed),
        reduced.eval_tasks,
        reduced.world,
        eval_specs,
        reduced.eval_rollout,
        seed=cfg.seed,
    )
    after, history = analysis.run_variant(reduced, maca, seed=cfg.seed, **_resumable(cfg, "lm_check", cfg.seed))
    seconds = sum(h["seconds"] for h in history)  # recorded per iteration: right also when restored
    best = None if setup.best is None else float(setup.best[ev].mean())
    out = {
        "families": list(lc.families),
        "train_tasks": len(tr),
        "eval_tasks": len(ev),
        "iterations": lc.iterations,
        "episodes_per_iteration": lc.tasks_per_iteration * grpo.group_size,
        "seconds": seconds,
        "seconds_per_iteration": seconds / max(len(history), 1),
        "before": before.summary,
        "after": after.summary,
        "best_achievable": best,
        "train_accuracy": [h["accuracy"] for h in history],
    }
    log(
        f"LM policy ({lc.iterations} iterations, {seconds:.0f} s): before {_brief(before.summary)}; "
        f"after {_brief(after.summary)}"
    )
    return out


def run(cfg: MacaConfig, backend: Backend | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole experiment; returns what results.json holds."""
    baseline_names = cfg.baselines.systems  # MacaConfig checks them and that the world is a benchmark
    run_dir = Path(cfg.run_dir)
    start = time.perf_counter()
    setup = build_setup(cfg, backend, log)
    names = setup.study.world.pool.names
    selection = None
    if setup.validation is not None:  # lambda chosen on the validation split, for MACA and every KL-keeping ablation
        t0 = time.perf_counter()
        selection = select_lambda(cfg, setup, log)
        setup.timings["lambda_selection_s"] = time.perf_counter() - t0
        cfg = dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, prior_kl_weight=selection["chosen"]))
    elif cfg.lambda_selection.enabled:
        selection = {
            "skipped": f"no validation split for a {cfg.world.kind} world; configured lambda kept",
            "chosen": cfg.grpo.prior_kl_weight,
        }
        log(f"lambda selection skipped: {selection['skipped']} ({cfg.grpo.prior_kl_weight})")
    results: dict[str, Any] = {"config": to_dict(cfg), "prior": setup.prior_stats}
    if selection is not None:
        results["lambda_selection"] = selection
    if setup.best is not None:
        results["best_achievable"] = float(setup.best.mean())
        log(f"best achievable expected accuracy (exact): {results['best_achievable']:.4f}")
        results["ceilings"] = ceilings(cfg, setup)
        log(f"ceilings: {results['ceilings']}")
    rows, evaluations, histories = run_systems(cfg, setup, run_dir, log)
    results["systems"] = rows
    if baseline_names:
        results["baselines"] = run_baselines(cfg, setup, log)
    results["transitions"] = _transitions({k: v[0] for k, v in evaluations.items()}, names, run_dir)
    analysis.plot_training({k: v[0] for k, v in histories.items()}, run_dir / "training.png")
    curves = {k: analysis.learning_curve(v) for k, v in histories.items()}
    if any(curves.values()):
        key = "expected_accuracy" if setup.best is not None else "accuracy"
        results["learning_curves"] = {"curves": curves, "orders": curve_orders(curves, rows, key)}
        if setup.best is not None:
            for row in (r for r in rows if curves[r["system"]]):
                row |= iterations_to(curves[row["system"]], key, results["best_achievable"])
        analysis.plot_learning_curves(
            curves,
            {r["system"]: r for r in rows if not curves[r["system"]]},
            run_dir / "learning_curves.png",
            metric=key,
            best=results.get("best_achievable"),
        )
    results["sweeps"] = {}
    main = [e for s, e in zip(cfg.seeds, evaluations.get("maca", ()), strict=False) if s in cfg.sweep_seeds]
    best = results.get("best_achievable")
    for param, values in to_dict(cfg.sweeps).items():
        if values:
            value = cfg.graphspec.gamma if param == "gamma" else cfg.grpo.prior_kl_weight
            reuse = len(main) == len(cfg.sweep_seeds)  # the main runs on the sweep's seeds are its configured point
            sweep = run_sweep(cfg, setup, param, [v for v in values if not (reuse and v == value)], log)
            if reuse:
                sweep.append(_row("maca", main, best, **{param: value}))
            sweep.sort(key=lambda r: r[param])
            results["sweeps"][param] = sweep
            analysis.plot_sweep(sweep, param, run_dir / f"sweep_{param}.png", best=best)
    results["gate_sparsity"] = analysis.gate_sparsity(
        setup.study.q_eval, setup.study.eval_tasks, setup.study.world.pool, cfg.gate_gammas
    )
    analysis.plot_gate_sparsity(results["gate_sparsity"], run_dir / "gate_sparsity.png", gamma=cfg.graphspec.gamma)
    if cfg.lm_check.enabled:
        results["lm_check"] = run_lm_check(cfg, setup, log)
    results["timings"] = setup.timings | {"total_s": time.perf_counter() - start}
    analysis.write_json(run_dir / "results.json", results)
    (run_dir / "tables.md").write_text(tables(results))
    return results


def add_baselines(
    cfg: MacaConfig, names: Sequence[str], backend: Backend | None = None, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Baselines `names` run on a finished run and added to its results, as `run` would have run them: the same
    setup (the prior restored from RUN_DIR, the same tasks and GraphSpec), through `backend`. Their rows are
    appended to RUN_DIR/results.json, read again after they ran and replaced whole in one step, so neither a crash
    nor the rows already there are lost; tables.md is rewritten. Returns the results."""
    start = time.perf_counter()
    setup = build_setup(cfg, backend, log)
    only = dataclasses.replace(cfg, baselines=dataclasses.replace(cfg.baselines, systems=tuple(names)))
    rows = run_baselines(only, setup, log)
    path = Path(cfg.run_dir) / "results.json"
    results = with_baselines(json.loads(path.read_text()), rows, cfg, time.perf_counter() - start)
    analysis.write_json(path, results)
    (path.parent / "tables.md").write_text(tables(results))
    return results


def with_baselines(
    results: dict[str, Any], rows: list[dict[str, Any]], cfg: MacaConfig, seconds: float
) -> dict[str, Any]:
    """`results` with baseline `rows` appended: its config's `baselines` is `cfg`'s with the systems the rows now
    hold, and its timings count the `seconds` the rows took (`added_baselines_s`, and in `total_s`)."""
    held = [*results.get("baselines", []), *rows]
    config = results["config"] | {"baselines": to_dict(cfg.baselines) | {"systems": [r["system"] for r in held]}}
    timings = results["timings"]
    added = {
        "total_s": timings["total_s"] + seconds,
        "added_baselines_s": timings.get("added_baselines_s", 0) + seconds,
    }
    return results | {"config": config, "baselines": held, "timings": timings | added}


def gate_report(cfg: MacaConfig, log: Callable[[str], None] = print) -> list[dict[str, float]]:
    """Fig. 8 alone, before any agent call: the gate's precision / recall against gamma on the configured world's
    held-out tasks, for choosing gamma (and judging the encoder) on a new pool or benchmark without a served model.
    Writes gate_sparsity.json / .png / .md into the run directory."""
    pool = load_pool(cfg.pool_families)
    _, evals = build_tasks(cfg)
    encoder = build_encoder(cfg.encoder)
    q = relevance_scores(
        contexts(encoder, evals),
        encoder.encode([a.profile for a in pool]),
        [t.budget for t in evals],
        prior_config(cfg).temperature,
    )
    rows = analysis.gate_sparsity(q, evals, pool, cfg.gate_gammas)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    analysis.write_json(run_dir / "gate_sparsity.json", rows)
    analysis.plot_gate_sparsity(rows, run_dir / "gate_sparsity.png", gamma=cfg.graphspec.gamma)
    table = _gate_table(rows)
    (run_dir / "gate_sparsity.md").write_text(table + "\n")
    log(table)
    return rows


def _gate_table(rows: Sequence[dict[str, float]]) -> str:
    return analysis.markdown_table(rows, ["gamma", "precision", "recall", "full_recall", "retained"])


def ceilings(cfg: MacaConfig, setup: Setup) -> list[dict[str, Any]]:
    """What an oracle scores (synthetic pool, exact): the best expected accuracy knowing each eval task's hidden
    difficulty, the path maximising Eq. 12's reward without the KL (accuracy - beta * tokens), both again within
    Eq. 11's mask H of MACA's GraphSpec (the space MACA's policy acts in), and both for one structure committed
    per task family without knowing the difficulty (`analysis.committed_optimum`: the best a structure-centric
    system, w/o pi_theta, could commit to; on this pool also the ceiling of any policy, which sees the family only)."""
    study, g = setup.study, cfg.grpo
    best = float(setup.best.mean())
    _, specs = study.specs(variant(cfg, "maca"))
    steps, constraint = study.eval_rollout.max_steps, study.eval_rollout.constraint
    cost = {"token_cost_weight": g.token_cost_weight, "token_unit": g.token_unit}
    committed = {
        name: analysis.committed_optimum(setup.spool, study.eval_tasks, steps, **kw)
        for name, kw in (("accuracy", {}), ("reward", cost))
    }
    rows = [
        ("best accuracy", False, (setup.best, None), None),
        ("best reward", False, analysis.reward_optimal(setup.spool, study.eval_tasks, steps, **cost), None),
        (
            "best accuracy within H",
            True,
            analysis.masked_optimum(setup.spool, study.eval_tasks, specs, steps, constraint),
            None,
        ),
        (
            "best reward within H",
            True,
            analysis.masked_optimum(setup.spool, study.eval_tasks, specs, steps, constraint, **cost),
            None,
        ),
        *((f"best {name}, one structure per family", False, c[:2], c[2]) for name, c in committed.items()),
    ]
    names = setup.spool.pool.names
    out = []
    for name, masked, (acc, tokens), structures in rows:
        row = {
            "oracle": name,
            "mask": masked,
            "expected_accuracy": float(np.mean(acc)),
            "of_best": float(np.mean(acc)) / best,
        }
        if tokens is not None:
            row["avg_cost"] = float(np.mean(tokens))
        if structures is not None:
            row["structures"] = {f: " -> ".join(names[a] for a in path) for f, path in structures.items()}
        out.append(row)
    return out


def _transitions(first: dict[str, analysis.Evaluation], names: Sequence[str], run_dir: Path) -> dict[str, Any]:
    """Per family: transition heatmaps and top-2 mass with the prior (maca) and without it (no_graphspec)."""
    out: dict[str, Any] = {}
    for name in ("maca", "no_graphspec"):
        if name not in first:
            continue
        for family in sorted({e.task.family for e in first[name].episodes}):
            episodes = [e for e in first[name].episodes if e.task.family == family]
            matrix = analysis.transition_matrix(episodes, len(names))
            analysis.plot_transitions(
                matrix, names, run_dir / f"transitions_{name}_{family}.png", f"{name}, {family}: P(next | current)"
            )
            out.setdefault(family, {})[name] = {
                "top2_mass": analysis.top2_mass(episodes),
                "matrix": np.round(matrix, 4).tolist(),
            }
    return out


def tables(results: dict[str, Any]) -> str:
    cols = [
        "system",
        "expected_accuracy",
        "expected_accuracy_sd",
        "accuracy",
        "avg_cost",
        "avg_cost_sd",
        "avg_calls",
        "of_best",
        "top2_mass",
        "invalid_action_rate",
    ]
    efficiency = [c for c in ("iterations_to_90pct", "iterations_to_95pct") if any(c in r for r in results["systems"])]
    parts = ["# MACA results", ""]
    if "best_achievable" in results:
        parts += [f"Best achievable expected accuracy (exact, synthetic pool): {results['best_achievable']:.4f}", ""]
    key = "expected_accuracy" if "best_achievable" in results else "accuracy"
    order = " > ".join(r["system"] for r in sorted(results["systems"], key=lambda r: -r[key]))
    parts += [
        "## Systems and Table 3 ablations",
        "",
        analysis.markdown_table(results["systems"], cols + efficiency),
        "",
        f"Measured order by {key}: {order}",
        "",
    ]
    if "learning_curves" in results:
        orders = results["learning_curves"]["orders"]
        systems = [r["system"] for r in results["systems"]]
        parts += [
            f"## Held-out {key} during training (mean over seeds; systems without a policy at their final "
            "value; paper_order: the Table 3 systems order as the paper's Table 3, _learning: those with a "
            "policy)",
            "",
            analysis.markdown_table(orders, ["iterations", *systems, "paper_order", "paper_order_learning"]),
            "",
        ]
    if "baselines" in results:
        parts += [
            "## Baselines (Table 1's single-model systems; Table 11's LLM routers under MACA's GraphSpec)",
            "",
            analysis.markdown_table(
                results["baselines"],
                ["system", "accuracy", "avg_cost", "avg_calls", "invalid_action_rate", "avg_agents"],
            ),
            "",
        ]
    if "ceilings" in results:
        parts += [
            "## Oracle ceilings (hidden difficulty known, except for one structure per family; H: Eq. 11's mask "
            "of MACA's GraphSpec)",
            "",
            analysis.markdown_table(results["ceilings"], ["oracle", "expected_accuracy", "of_best", "avg_cost"]),
            "",
        ]
        parts += [
            f"- {row['oracle']}: " + "; ".join(f"{f}: {path}" for f, path in row["structures"].items())
            for row in results["ceilings"]
            if "structures" in row
        ] + [""]
    top2 = [{"family": f, **{k: v["top2_mass"] for k, v in d.items()}} for f, d in results["transitions"].items()]
    if top2:
        parts += [
            "## Top-2 transition mass (mean over decisions)",
            "",
            analysis.markdown_table(top2, ["family", "maca", "no_graphspec"]),
            "",
        ]
    if "rows" in results.get("lambda_selection", {}):
        sel = results["lambda_selection"]
        heading = (
            f"## lambda selection (validation split: {sel['num_tasks']} training-distribution tasks, seed "
            f"{sel['task_seed']}; MACA seeds {sel['seeds']})"
        )
        parts += [
            heading,
            "",
            analysis.markdown_table(
                sel["rows"],
                ["prior_kl_weight", "reward", "expected_accuracy", "expected_accuracy_sd", "avg_cost", "avg_calls"],
            ),
            "",
            f"Chosen prior_kl_weight (max validation {sel['criterion']}): {sel['chosen']}",
            "",
        ]
    if "gate_sparsity" in results:
        parts += [
            "## Agent-selection sparsity against gamma (Fig. 8; held-out tasks; correct domain: the task's family)",
            "",
            _gate_table(results["gate_sparsity"]),
            "",
        ]
    for param, rows in results["sweeps"].items():
        parts += [
            f"## Sensitivity: {param} (held-out eval tasks)",
            "",
            analysis.markdown_table(rows, [param, *cols[1:]]),
            "",
        ]
    if "lm_check" in results:
        lc = results["lm_check"]
        rows = [{"policy": "LM, untrained", **lc["before"]}, {"policy": "LM, MACA-trained", **lc["after"]}]
        heading = (
            f"## LM policy (families {lc['families']}, {lc['iterations']} iterations, "
            f"{lc['seconds_per_iteration']:.1f} s/iteration)"
        )
        parts += [
            heading,
            "",
            analysis.markdown_table(
                rows, ["policy", "expected_accuracy", "accuracy", "avg_cost", "avg_calls", "invalid_action_rate"]
            ),
            "",
        ]
    parts += [f"Timings: {json.dumps({k: round(v, 1) for k, v in results['timings'].items()})}", ""]
    return "\n".join(parts)
