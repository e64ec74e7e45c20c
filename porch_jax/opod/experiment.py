"""The OPOD experiment: the whole loop in one run directory, resumable, with progress (launch/pipeline.py):

    python -m launch.pipeline --config=experiments/quickstart.py [--config.run_dir=runs/qs2]

expert rollouts -> attribution of the expert's decisions -> SFT of a tiny orchestrator from scratch
(expert decisions + hint-following examples) -> rollouts of the SFT policy -> attribution (FLAG,
hint) -> RWR, OPOD (RWR + λ·OPD), OPD with empty hints, DA-GRPO, each from the SFT weights and at each
rate of its ``lr_grid`` -> selection of rate and checkpoint on validation tasks (config ``selection``: the
same rule for every method, see ``select_checkpoints``) -> evaluation of every selected export on held-out
seeded tasks -> results table and plots.

Every stage leaves files in the run directory and is skipped when they are complete; a stage
interrupted midway resumes (trajectory and attribution stores skip what they hold, trainers restore
their newest checkpoint). Rerunning a finished run only rebuilds the report. The run directory records
its config (config.json); a rerun with another config is refused, naming the keys that differ.

`cfg` is the typed ExperimentConfig (porch_jax/opod/config.py) that launch/pipeline.py builds and checks
once; nothing here reads a ConfigDict. With `seed_sets` (`--config=experiments/quickstart.py:seed_sets=8`,
or `--config.seed_sets="(0, 1, 2, 3)"`) the loop runs once per seed set in RUN_DIR/seed_set_k
(`opod.config.with_seed_set`), and RUN_DIR/seed_sets.{md,json,png} report the sets as the unit: per-method
mean and spread, paired differences with t-intervals over sets.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
from transformers import AutoTokenizer

from porch_jax import runtime
from porch_jax.attribution.job import AttributionStore, attribute_store
from porch_jax.attribution.judge import ScriptedJudge, follow_hint
from porch_jax.backends import ScriptedBackend
from porch_jax.envs.views import POLICY_FILE, folder_view
from porch_jax.envs.workplace import TOOLS
from porch_jax.envs.workplace.codec import corpus as dsl_corpus
from porch_jax.eval import plots, report
from porch_jax.eval import seed_sets as seed_sets_lib
from porch_jax.eval import suite as suite_lib
from porch_jax.eval.evaluate import evaluate, run_policy
from porch_jax.eval.policy import load_policy
from porch_jax.eval.suite import TaskSet
from porch_jax.models import from_pretrained
from porch_jax.models.tiny import make_tiny_model
from porch_jax.opod import rows as od
from porch_jax.opod.config import ExperimentConfig, with_seed_set
from porch_jax.opod.diagnostics import hint_following
from porch_jax.rollout import run_episodes
from porch_jax.train import mesh as mesh_lib
from porch_jax.train import sources
from porch_jax.train.config import (
    CheckpointConfig,
    LogConfig,
    MethodConfig,
    OptimizerConfig,
    SamplingConfig,
    TrainConfig,
)
from porch_jax.train.data import hint_table
from porch_jax.train.methods import make_method
from porch_jax.train.trainer import Trainer, selection_candidates
from porch_jax.trajectories import TrajectoryStore
from porch_jax.typed_config import claim_run_dir


class Run:
    """Paths and the stage log of one run directory."""

    def __init__(self, cfg: ExperimentConfig):
        self.cfg, self.dir, self.t0 = cfg, Path(cfg.run_dir), time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)

    def __truediv__(self, name: str) -> Path:
        return self.dir / name

    def stage(self, name: str, done: bool) -> bool:
        """Announces a stage; True when it still has work to do."""
        state = "done, skipped" if done else "running"
        print(f"\n=== [{time.monotonic() - self.t0:6.0f}s] {name}: {state}", flush=True)
        return not done


def rollouts(
    run: Run, store_name: str, policy_or_none: Any, tasks_cfg: TaskSet, *, name: str, temperature: float
) -> list[Any]:
    cfg = run.cfg
    tasks = suite_lib.task_set(tasks_cfg, cfg.suite)
    with TrajectoryStore(run / store_name) as store:
        if policy_or_none is None:
            engine = suite_lib.expert_engine(cfg.suite)
            asyncio.run(run_episodes(tasks, lambda t: engine.run(t, episode_id=t.task_id), store, 64))
        else:
            asyncio.run(
                run_policy(
                    policy_or_none,
                    tasks,
                    store,
                    cfg.suite,
                    name=name,
                    temperature=temperature,
                    max_tokens=cfg.policy.max_new_tokens,
                    concurrency=cfg.eval.concurrency,
                    seed=cfg.seed,
                )
            )
    return TrajectoryStore(run / store_name).read()


def attribute(run: Run, trajectories: str, out: str) -> dict[tuple[str, int], str]:
    """Runs (or resumes) the attribution job with the scripted judge; returns the hints (FLAG=true)."""
    with AttributionStore(run / out) as store:
        summary = asyncio.run(
            attribute_store(
                TrajectoryStore(run / trajectories), ScriptedBackend(ScriptedJudge()), store, progress=False
            )
        )
    rows = AttributionStore(run / out).read()
    print(
        f"attribution: {len(rows)} decisions, {sum(r['attributable'] for r in rows)} attributable, "
        f"{sum(r['status'] == 'error' for r in rows)} errors ({summary.judged} judged now)",
        flush=True,
    )
    return hint_table(rows)


def init_model(run: Run) -> Path:
    """RUN/init: the tiny model of config `model` from scratch (its tokenizer over the compact language in the
    "dsl" view), unless it exists."""
    folder = run / "init"
    if not (folder / POLICY_FILE).is_file():
        m = run.cfg.model
        corpus = dsl_corpus() if run.cfg.policy.view == "dsl" else None
        make_tiny_model(folder, seed=m.seed, vocab_size=m.vocab_size, corpus=corpus, **m.hf)
        (folder / POLICY_FILE).write_text(json.dumps({"view": run.cfg.policy.view}))
    return folder


def train(
    run: Run, name: str, init: Path, source_of: Callable[[Any, Any], Any], *, learning_rate: float | None = None
) -> Path:
    """A Trainer run of config section `name` in RUN/<run_name(name, learning_rate)> from the policy in `init`,
    unless its export exists; `source_of(tokenizer, mesh)` builds its batch source. Returns the export folder."""
    folder = run_name(run.cfg, name, learning_rate)
    export = run / folder / "export"
    if run.stage(f"train {folder}", (export / POLICY_FILE).is_file()):
        cfg = train_config(run.cfg, name, learning_rate)
        tok = AutoTokenizer.from_pretrained(str(init))
        mesh = mesh_lib.make_mesh(cfg.mesh)
        source = source_of(tok, mesh)
        model = from_pretrained(init, mesh=mesh)  # each process reads only its devices' slices
        trainer = Trainer(
            cfg, model, make_method(cfg.method), source, run / folder, tokenizer=tok, view=folder_view(init)
        )
        trainer.run()
    return export


METHOD_OF = {"sft": "sft", "rwr": "rwr", "opod": "opod", "opd_empty": "opod", "dagrpo": "dagrpo"}


def train_config(cfg: ExperimentConfig, name: str, learning_rate: float | None = None) -> TrainConfig:
    """The TrainConfig of config section `name` (the shared optimizer settings, the section's own)."""
    opt, sec = cfg.optimizer, cfg.method(name)
    return TrainConfig(
        steps=sec.steps,
        optimizer=OptimizerConfig(
            learning_rate=sec.learning_rate if learning_rate is None else float(learning_rate),
            warmup_steps=sec.warmup_steps,
            final_lr_ratio=opt.final_lr_ratio,
            weight_decay=opt.weight_decay,
            b1=opt.b1,
            b2=opt.b2,
            eps=opt.eps,
            max_grad_norm=opt.max_grad_norm,
        ),
        method=MethodConfig(name=METHOD_OF[name], layout="packed", opd_weight=sec.opd_weight, clip_eps=sec.clip_eps),
        checkpoint=CheckpointConfig(every=opt.checkpoint_every, keep=1, async_save=False),
        log=LogConfig(every=opt.log_every),
        export_every=sec.export_every,
    )


def learning_rates(cfg: ExperimentConfig, name: str) -> tuple[float, ...]:
    """The learning rates a method after SFT is trained with: its section's `lr_grid` (checkpoint selection then
    picks the rate and the step on validation tasks, the same rule for every method), else the one configured.
    ExperimentConfig checks at launch that the grid holds the configured rate and that selection is on."""
    return cfg.method(name).lr_grid or (cfg.method(name).learning_rate,)


def run_name(cfg: ExperimentConfig, name: str, learning_rate: float | None) -> str:
    """RUN/<name> for the configured learning rate (so runs made before a grid resume), RUN/<name>_lr<rate> else."""
    if learning_rate is None or learning_rate == cfg.method(name).learning_rate:
        return name
    return f"{name}_lr{learning_rate:g}"


def run(cfg: ExperimentConfig) -> None:
    """The experiment of `cfg` in cfg.run_dir: one seed set, or each of cfg.seed_sets and their report."""
    runtime.tune_malloc()  # before the first computation (porch_jax/runtime.py says why)
    base = Path(cfg.run_dir)
    base.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str((base / "jax_cache").absolute()))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    seed_sets = cfg.seed_sets  # distinct and from 0 (ExperimentConfig checks)
    if not seed_sets:
        run_pipeline(cfg)
        return
    claim_run_dir(
        base, cfg, may_change=RESUME_MAY_CHANGE | {"seed_sets"}
    )  # more sets may join; each set claims its own
    for k in seed_sets:
        print(f"\n##### seed set {k} ({seed_sets.index(k) + 1} of {len(seed_sets)})", flush=True)
        run_pipeline(with_seed_set(cfg, k))
    report_seed_sets(base, seed_sets)


def report_seed_sets(base: Path, seed_sets: tuple[int, ...]) -> None:
    """RUN_DIR/seed_sets.{md,json,png} from each set's results.json (eval/seed_sets.py)."""
    agg = seed_sets_lib.aggregate(
        {k: json.loads((base / f"seed_set_{k}" / "results.json").read_text()) for k in seed_sets}
    )
    table = seed_sets_lib.format_table(agg)
    (base / "seed_sets.md").write_text(table + "\n")
    (base / "seed_sets.json").write_text(json.dumps(agg, indent=1))
    plots.plot_seed_sets(agg, base / "seed_sets.png")
    print(f"\n{table}\n\nseed sets: {base / 'seed_sets.md'}, {base / 'seed_sets.png'}", flush=True)


# What a rerun into the same RUN_DIR may change: where it is and the episodes evaluated in flight.
RESUME_MAY_CHANGE = frozenset({"run_dir", "eval.concurrency"})


def run_pipeline(cfg: ExperimentConfig) -> None:
    """One seed set's whole loop in cfg.run_dir (module docstring). RUN_DIR/config.json records the typed config
    (every key, defaults included); a rerun with another one (but for RESUME_MAY_CHANGE) is refused, naming the
    keys, before any stage runs."""
    claim_run_dir(cfg.run_dir, cfg, may_change=RESUME_MAY_CHANGE)
    run = Run(cfg)

    view, buckets, max_len, overlong = cfg.policy.view, cfg.policy.buckets, max(cfg.policy.buckets), cfg.policy.overlong
    sampler_len = cfg.policy.max_len
    run.stage("expert rollouts", False)
    expert = rollouts(run, "expert.jsonl", None, cfg.expert_rollouts, name="expert", temperature=0.0)
    print(f"expert: {sum(r.outcome.success for r in expert)}/{len(expert)} succeeded", flush=True)
    run.stage("attribution of expert decisions", False)
    expert_hints = attribute(run, "expert.jsonl", "expert_attribution.jsonl")

    init = init_model(run)
    tok = AutoTokenizer.from_pretrained(str(init))
    sft_rows = od.packed_rows(expert, tok, view, max_len)
    hint_rows = od.hint_following_rows(expert, expert_hints, tok, view, follow_hint)
    fitting = sum(len(r.tokens) <= max_len for r in sft_rows)  # the rows every overlong rule keeps whole
    hint_rows = hint_rows[: int(cfg.sft.hint_rows * fitting)]  # a share of the episodes, not more
    if cfg.sft.empty_hint_rows:  # the same decisions under an empty hint, action unchanged
        hint_rows += od.empty_hint_rows(expert, expert_hints, tok, view, follow_hint)[: len(hint_rows)]
    print(
        f"SFT: {len(sft_rows)} packed rows ({len(sft_rows) - fitting} over {max_len} tokens), "
        f"{len(hint_rows)} hint-following rows",
        flush=True,
    )
    sft = train(
        run,
        "sft",
        init,
        lambda tok, mesh: sources.PackedSource(
            sft_rows + hint_rows, cfg.sft.batch, buckets, cfg.sft.seed, mesh, overlong=overlong
        ),
    )

    policy = load_policy(sft, max_len=sampler_len, prompt_buckets=buckets)
    run.stage("rollouts of the SFT policy", False)
    data = rollouts(run, "rollouts.jsonl", policy, cfg.rollouts, name="sft", temperature=cfg.rollouts.temperature)
    print(f"SFT rollouts: {sum(r.outcome.success for r in data)}/{len(data)} succeeded", flush=True)
    run.stage("attribution of SFT decisions", False)
    hints = attribute(run, "rollouts.jsonl", "attribution.jsonl")

    teacher_check = run / "hint_following.json"
    if not teacher_check.is_file():  # OPD's precondition: the teacher under s ⊕ H acts as H says, the student not
        teacher_check.write_text(
            json.dumps(
                hint_following(policy.sampler, data, hints, view, follow_hint, max_new_tokens=cfg.policy.max_new_tokens)
            )
        )
    print(f"hinted action matched on flagged decisions (greedy): {teacher_check.read_text()}", flush=True)

    rwr_rows = od.packed_rows(data, tok, view, max_len, weight=lambda ep: float(ep.outcome.success))
    opd_rows = od.opd_rows(data, hints, tok, view)
    print(
        f"RWR: {len(rwr_rows)} packed rows from successful rollouts; OPD: {len(opd_rows)} attributable decisions",
        flush=True,
    )

    # Under "drop", RWR rows that are all over-long leave no RWR part (as no successful rollout does).
    has_rwr = any(len(r.tokens) <= max_len for r in rwr_rows) or (overlong != "drop" and bool(rwr_rows))

    def packed(section: str, view: str, mesh: Any) -> list[Any]:
        if not has_rwr:
            return []
        sec = cfg.method(section)
        return [sources.PackedSource(rwr_rows, sec.batch, buckets, sec.seed, mesh, view, overlong=overlong)]

    def opd(section: str, rows: list[Any], tok: Any, mesh: Any) -> list[Any]:
        o = cfg.method(section).opd  # not None for a method in cfg.methods (ExperimentConfig checks)
        sampling = SamplingConfig(o.max_new_tokens, o.temperature, o.top_p, o.seed)
        return [sources.OpdSource(rows, tok, sampling, o.batch, buckets, mesh, overlong=overlong)] if rows else []

    def group(tok: Any, mesh: Any) -> Any:
        g = cfg.dagrpo.group  # not None when dagrpo is in cfg.methods (ExperimentConfig checks)
        sampling = SamplingConfig(g.max_new_tokens, g.temperature, g.top_p, g.seed)
        contexts = od.expert_contexts(expert, tok, view)
        return sources.GroupSource(
            contexts, tok, sampling, g.contexts_per_step, g.group_size, buckets, TOOLS, mesh, overlong=overlong
        )

    empty_rows = od.opd_rows(data, dict.fromkeys(hints, ""), tok, view)
    exports = {"sft": {cfg.sft.learning_rate: sft}}
    plans = {  # a method's batch source (given tokenizer and mesh) and whether it has data
        "rwr": (lambda tok, mesh: packed("rwr", "policy", mesh)[0], has_rwr),
        "opod": (
            lambda tok, mesh: sources.Joined(*packed("opod", "rwr", mesh), *opd("opod", opd_rows, tok, mesh)),
            has_rwr or bool(opd_rows),
        ),
        "opd_empty": (
            lambda tok, mesh: sources.Joined(
                *packed("opd_empty", "rwr", mesh), *opd("opd_empty", empty_rows, tok, mesh)
            ),
            has_rwr or bool(opd_rows),
        ),
        "dagrpo": (group, True),
    }
    for name in cfg.methods:
        if name == "sft":
            continue
        source_of, has_data = plans[name]
        if not has_data:
            print(
                f"{name}: no training data (no successful rollouts and no attributable decisions); skipped", flush=True
            )
            continue
        exports[name] = {lr: train(run, name, sft, source_of, learning_rate=lr) for lr in learning_rates(cfg, name)}
    evaluate_and_report(run, policy, exports)


def select_checkpoints(run: Run, policy: Any, exports: dict[str, dict[float, Path]]) -> dict[str, dict[str, Any]]:
    """Checkpoint selection on validation tasks, the same rule for every trained method.

    Each method's candidates (for each of its learning rates, its exports every ``export_every`` steps) run
    greedily on the validation tasks (seeds disjoint from training, rollouts and held-out evaluation); the
    candidate with the most successes is the method's checkpoint (ties: the configured learning rate, then the
    later step, so the final weights unless an earlier one is strictly better). SFT, the common starting point,
    has one checkpoint. Written to ``RUN/selection.json``; the held-out evaluation then reads only the selected
    export folder.
    """
    cfg = run.cfg
    tasks = suite_lib.task_set(cfg.selection.tasks, cfg.suite)
    out: dict[str, dict[str, Any]] = {}
    for name, runs in exports.items():
        scores: dict[tuple[float, int], float] = {}
        folders: dict[tuple[float, int], Path] = {}
        for lr, export in runs.items():
            cands = selection_candidates(export) if name != "sft" else {}
            for step, folder in (cands or {-1: export}).items():  # no step exports: the final export only
                tag = run_name(cfg, name, lr) + ("" if step < 0 else f"_step{step}")
                run.stage(f"validate {tag} on {len(tasks)} validation tasks", False)
                recs = evaluate(policy.load(folder), tasks, run / "val" / f"{tag}.jsonl", cfg.suite, cfg.eval, tag)
                scores[lr, step], folders[lr, step] = sum(r.outcome.success for r in recs) / len(recs), folder
        configured = cfg.method(name).learning_rate
        lr, step = max(scores, key=lambda k: (scores[k], k[0] == configured, k[1]))
        out[name] = {
            "learning_rate": lr,
            "step": None if step < 0 else step,
            "folder": str(folders[lr, step]),
            "run": run_name(cfg, name, lr),
            "val_success": {f"{r:g}": {str(k): v for (r2, k), v in scores.items() if r2 == r} for r in runs},
        }
        print(
            f"{name}: validation success by learning rate and step {out[name]['val_success']} -> "
            f"{out[name]['learning_rate']:g}, step {out[name]['step']}",
            flush=True,
        )
    (run / "selection.json").write_text(json.dumps(out, indent=1))
    return out


def evaluate_and_report(run: Run, policy: Any, exports: dict[str, dict[float, Path]]) -> None:
    """Each method's selected (or only) export on the held-out tasks; RUN/results.{md,json} and the plots."""
    cfg = run.cfg
    selection = select_checkpoints(run, policy, exports) if cfg.selection.enabled else {}
    tasks = suite_lib.task_set(cfg.eval.tasks, cfg.suite)
    records, runs = {}, {}
    for name, by_lr in exports.items():
        if name in selection:
            lr, folder, step = (
                selection[name]["learning_rate"],
                Path(selection[name]["folder"]),
                selection[name]["step"],
            )
        else:  # one learning rate (`learning_rates`), its final export
            (lr, folder), step = next(iter(by_lr.items())), None
        runs[name] = run_name(cfg, name, lr)
        tag = runs[name] + ("" if step is None else f"_step{step}")
        run.stage(f"evaluate {tag} on {len(tasks)} held-out tasks", False)
        records[name] = evaluate(policy.load(folder), tasks, run / "eval" / f"{tag}.jsonl", cfg.suite, cfg.eval, name)
        print(f"{name}: {sum(r.outcome.success for r in records[name])}/{len(records[name])} succeeded", flush=True)
    rows = report.summaries(records, reference="sft")
    pairs = [
        (a, b)
        for a, b in (("opod", "rwr"), ("rwr", "sft"), ("opod", "sft"), ("opod", "opd_empty"), ("opod", "dagrpo"))
        if a in records and b in records
    ]
    comparisons = [report.compare(records, a, b) for a, b in pairs]
    table = (
        report.format_table(rows, records, comparisons)
        + "\n\nBlind-spot checks on held-out delegations:\n\n"
        + report.format_blind_spots(records)
    )
    if selection:
        table += "\n\nCheckpoints selected on validation tasks (success by learning rate and step):\n\n" + "\n".join(
            f"- {n}: learning rate {v['learning_rate']:g}, step {v['step'] if v['step'] is not None else 'final'} of "
            + "; ".join(
                f"{lr}: " + ", ".join(f"{k}: {s:.2f}" for k, s in steps.items())
                for lr, steps in v["val_success"].items()
            )
            for n, v in selection.items()
        )
    if (run / "hint_following.json").is_file():
        table += (
            "\n\nHinted action matched (greedy, SFT weights, flagged rollout decisions): "
            + (run / "hint_following.json").read_text()
        )
    (run / "results.md").write_text(table + "\n")
    report.write_results(rows, comparisons, run / "results.json")
    plots.plot_curves({n: plots.read_metrics(run / runs[n] / "metrics.jsonl") for n in exports}, run / "curves.png")
    plots.plot_success(rows, run / "success.png")
    print(
        f"\n{table}\n\nresults: {run / 'results.md'}, plots: {run / 'curves.png'}, {run / 'success.png'} "
        f"({time.monotonic() - run.t0:.0f} s)",
        flush=True,
    )
