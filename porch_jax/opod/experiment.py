"""The OPOD experiment: the whole loop in one run directory, resumable, with progress (launch/pipeline.py):

    python -m launch.pipeline --config=experiments/quickstart.py [--config.run_dir=runs/qs2]

expert rollouts -> attribution of the expert's decisions -> SFT of a tiny orchestrator from scratch
(expert decisions + hint-following examples) -> rollouts of the SFT policy -> attribution (FLAG,
hint) -> RWR, OPOD (RWR + λ·OPD), OPD with empty hints, DA-GRPO, each from the SFT weights and at each
rate of its ``lr_grid`` -> for each other framework in ``frameworks`` (Orchestra-o1, the lifecycle
orchestrator: ``train_framework``) its expert rollouts, SFT, SFT rollouts, RWR and DA-GRPO through the same
trainer -> selection of rate and checkpoint on validation tasks (config ``selection``: the same rule for
every method, see ``select_checkpoints``) -> evaluation of every selected export on held-out seeded tasks,
each under its framework's engine, beside the reference rows (the scripted expert under the policy's window, the
ceiling; with ``zero_shot``, the untrained model) -> results table (with OPD's hint-following check for each SFT
teacher and the stage times, RUN/stages.jsonl summed over resumes) and plots.

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
import contextlib
import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from transformers import AutoTokenizer

from porch_jax import runtime
from porch_jax.attribution.held import HeldGRM, SamplerReader, ServedReader
from porch_jax.attribution.job import AttributionStore, attribute_store
from porch_jax.attribution.judge import ScriptedJudge, follow_hint
from porch_jax.backends import Backend, ScriptedBackend
from porch_jax.backends.completions import CompletionsClient
from porch_jax.backends.embedded import EmbeddedBackend
from porch_jax.backends.window import ContextWindow
from porch_jax.envs.views import POLICY_FILE, folder_view, selection_candidates, write_policy_file
from porch_jax.envs.workplace import TOOLS
from porch_jax.envs.workplace.codec import corpus as dsl_corpus
from porch_jax.eval import plots, report
from porch_jax.eval import seed_sets as seed_sets_lib
from porch_jax.eval import suite as suite_lib
from porch_jax.eval.evaluate import evaluate, run_policy
from porch_jax.eval.policy import load_policy
from porch_jax.eval.suite import TaskSet
from porch_jax.models import from_pretrained
from porch_jax.models.sampler import Sampler
from porch_jax.models.tiny import make_tiny_model
from porch_jax.opod import rows as episode_rows
from porch_jax.opod.config import (
    AttributionSection,
    ExperimentConfig,
    ServingSection,
    framework_system,
    split_method,
    with_seed_set,
)
from porch_jax.opod.demonstrator import expert_engine
from porch_jax.opod.diagnostics import hint_following
from porch_jax.opod.fork import fork
from porch_jax.opod.rewards import dagrpo_reward
from porch_jax.opod.served_policy import ServedPolicy, describe, served_policy
from porch_jax.progress import Stages, stage_times
from porch_jax.rollout import run_episodes, system_config
from porch_jax.rows.decisions import hint_table
from porch_jax.serving.weights import export_for_serving
from porch_jax.train import mesh as mesh_lib
from porch_jax.train import sources
from porch_jax.train.config import (
    MethodConfig,
    TrainConfig,
)
from porch_jax.train.methods import make_method, method_for_views
from porch_jax.train.served_sampler import served_action_sampler
from porch_jax.train.trainer import Trainer
from porch_jax.trajectories import TrajectoryStore
from porch_jax.typed_config import claim_run_dir, to_dict

STAGE_LOG = "stages.jsonl"  # in the run directory: every stage announcement, summed into results.md's stage times


class Run:
    """Paths and the stage log (`stages`, recorded in RUN/stages.jsonl) of one run directory."""

    def __init__(self, cfg: ExperimentConfig):
        self.cfg, self.dir = cfg, Path(cfg.run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.stages = Stages(lambda line: print(line, flush=True), record=self.dir / STAGE_LOG)

    def __truediv__(self, name: str) -> Path:
        return self.dir / name


def rollouts(
    run: Run,
    store_name: str,
    policy_or_none: Any,
    tasks_cfg: TaskSet,
    *,
    name: str,
    temperature: float,
    system: str = "proactive",
) -> list[Any]:
    """Episodes of the scripted expert (`policy_or_none` None) or of a policy on `tasks_cfg` under `system`'s engine,
    in RUN/<store_name> (resumed)."""
    cfg = run.cfg
    tasks = suite_lib.task_set(tasks_cfg, cfg.suite)
    with TrajectoryStore(run / store_name) as store:
        if policy_or_none is None:
            tok = AutoTokenizer.from_pretrained(str(init_model(run))) if cfg.policy.context_tokens else None
            engine = expert_engine(cfg, tok, system=system)
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
                    system=system,
                )
            )
    return TrajectoryStore(run / store_name).read()


class ContextWindowPolicy:
    """A policy (embedded or served) whose every backend decides under the context window ``max_prompt_tokens``."""

    def __init__(self, inner: Any, tokenizer: Any, max_prompt_tokens: int):
        self.inner, self.tokenizer, self.max_prompt_tokens = inner, tokenizer, max_prompt_tokens

    def load(self, folder: str | Path) -> ContextWindowPolicy:
        self.inner.load(folder)
        return self

    def backend(self, seed: int = 0) -> Backend:
        return ContextWindow(self.inner.backend(seed), self.tokenizer, self.max_prompt_tokens)


def scripted_grm() -> Backend:
    """The miniature's rule-based judge (porch_jax/attribution/judge.py) answering the GRM prompt."""
    return ScriptedBackend(ScriptedJudge())


def base_model_grm(cfg: ExperimentConfig, reading: str) -> Backend:
    """The paper's GRM: the frozen base model (model.init_from, no SFT) at attribution.endpoint, or our embedded
    sampler on it (its prompt buckets cover the GRM prompt of a ~12-decision episode), its reply read `reading`
    ("held": attribution/held.py; "free": as written)."""
    from transformers import AutoTokenizer

    folder, endpoint = cfg.model.init_from, cfg.attribution.endpoint
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if endpoint.configured:
        if reading == "free":
            return endpoint.backend()
        return HeldGRM(ServedReader(CompletionsClient(endpoint.backend(seed=cfg.seed))), tokenizer)
    sampler = Sampler(
        from_pretrained(folder),
        tokenizer,
        max_len=GRM_MAX_LEN,
        prompt_buckets=GRM_BUCKETS,
        batch_buckets=GRM_BATCH,
        prefix_cache_bytes=GRM_PREFIX_CACHE_BYTES if reading == "held" else 0,
    )
    return EmbeddedBackend(sampler, seed=cfg.seed) if reading == "free" else HeldGRM(SamplerReader(sampler), tokenizer)


GRM_BUCKETS, GRM_MAX_LEN = (512, 1024, 1536, 2048), 2176
# One batch size: the attribution job's concurrent decisions share a call, and each program compiles once per length.
GRM_BATCH = (8,)
# The held reading's hint extends the prompt its flag was scored after: the scoring pass keeps each prompt's keys and
# values (a batch of 8 prompts of up to 2,048 tokens: ~0.7 GiB for SmolLM2), so the hint prefills only its opening.
GRM_PREFIX_CACHE_BYTES = 2**30


def attribute(
    run: Run, trajectories: str, out: str, grm: Callable[[], Backend], *, label: str = ""
) -> dict[tuple[str, int], str]:
    """Runs (or resumes) the attribution job of `trajectories` through the GRM `grm()` builds (built only when
    decisions are left to judge); writes RUN/<out> and RUN/<out>.summary.json (FLAG rate and parse errors over the
    judged decisions); returns the hints (FLAG=true)."""
    a = run.cfg.attribution
    store_path = run / out
    done = AttributionStore(store_path).keys() if store_path.exists() else set()
    episodes = TrajectoryStore(run / trajectories).read()  # finished episodes only
    if any((e.episode_id, d.index) not in done for e in episodes for d in e.decisions):
        backend = grm()
        with AttributionStore(store_path) as store:
            asyncio.run(
                attribute_store(
                    episodes,
                    backend,
                    store,
                    concurrency=a.concurrency,
                    sampling=a.sampling,
                    retries=a.retries,
                    progress=True,
                )
            )
    rows = AttributionStore(store_path).read()
    summary = attribution_summary(rows)
    (run / f"{out}.summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(
        f"attribution{label}: {len(rows)} decisions, {summary['judged']} judged, {summary['flagged']} flagged "
        f"(FLAG rate {summary['flag_rate']:.3f}), {summary['malformed']} malformed replies, "
        f"{summary['backend_errors']} failed calls",
        flush=True,
    )
    return hint_table(rows)


def attribution_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The GRM's reading over the decisions it was asked about: FLAG rate, malformed (parse-error) rate, retries."""
    asked = [r for r in rows if r["status"] != "skipped"]
    malformed = sum(r["status"] == "error" and r["detail"].startswith("malformed") for r in asked)
    failed = sum(r["status"] == "error" and not r["detail"].startswith("malformed") for r in asked)
    flagged = sum(bool(r["attributable"]) for r in asked)
    n = max(len(asked), 1)
    return {
        "judged": len(asked),
        "flagged": flagged,
        "flag_rate": flagged / n,
        "malformed": malformed,
        "malformed_rate": malformed / n,
        "backend_errors": failed,
        "retried": sum(r.get("attempts", 1) > 1 for r in asked),
    }


def init_model(run: Run) -> Path:
    """The policy before SFT: model.init_from (a pretrained folder, read in place), else RUN/init, the tiny model of
    config `model` from scratch (its tokenizer over the compact language in the "dsl" view), unless it exists."""
    if run.cfg.model.init_from:
        return Path(run.cfg.model.init_from)
    folder = run / "init"
    if not (folder / POLICY_FILE).is_file():
        m = run.cfg.model
        corpus = dsl_corpus() if run.cfg.policy.view == "dsl" else None
        make_tiny_model(folder, seed=m.seed, vocab_size=m.vocab_size, corpus=corpus, **m.hf)
        (folder / POLICY_FILE).write_text(json.dumps({"view": run.cfg.policy.view}))
    return folder


def train(
    run: Run,
    name: str,
    init: Path,
    source_of: Callable[[Any, Any], Any],
    *,
    learning_rate: float | None = None,
    steps: int | None = None,
    validation: Callable[[Any], list[Any]] | None = None,
    validate_every: int = 0,
    stop_at: int | None = None,
) -> Path:
    """A Trainer run of config section `name` in RUN/<run_name(name, learning_rate)> from the policy in `init`,
    unless its export exists; `source_of(tokenizer, mesh)` builds its batch source, `validation(mesh)` the batches
    it is scored on every `validate_every` steps. `steps` overrides the section's. `stop_at`: run only to that step
    of the `steps`-long schedule, checkpoint it and export nothing (a later call without it resumes there). Returns
    the export folder."""
    folder = run_name(run.cfg, name, learning_rate)
    export = run / folder / "export"
    stage = f"train {folder}" if stop_at is None else f"train {folder} to step {stop_at}"
    done = (export / POLICY_FILE).is_file() or (stop_at is not None and stop_at in logged_steps(run / folder))
    if run.stages.should_run(stage, done=done):
        cfg = train_config(run.cfg, name, learning_rate)
        if steps is not None:
            cfg = dataclasses.replace(cfg, steps=steps)
        if stop_at is not None:  # the full schedule, cut short
            optimizer = dataclasses.replace(cfg.optimizer, total_steps=cfg.steps)
            cfg = dataclasses.replace(cfg, steps=stop_at, optimizer=optimizer)
        tok = AutoTokenizer.from_pretrained(str(init))
        mesh = mesh_lib.make_mesh(cfg.mesh)
        source = source_of(tok, mesh)
        cfg = dataclasses.replace(cfg, method=method_for_views(cfg.method, source.views))
        m = run.cfg.model
        model = from_pretrained(  # on the mesh: each process reads only its devices' slices
            init, dtype=jnp.dtype(m.compute_dtype), param_dtype=jnp.float32, mesh=mesh, remat=m.remat
        )
        view = folder_view(init)  # "full" for a pretrained folder, the only view ExperimentConfig allows it
        checks = validation(mesh) if validation is not None and validate_every else []
        trainer = Trainer(
            cfg,
            model,
            make_method(cfg.method),
            source,
            run / folder,
            tokenizer=tok,
            on_export=lambda folder, step: write_policy_file(folder, view, step),
            record={"view": view},
            validation=checks,
            validate_every=validate_every if checks else 0,
            export=False if stop_at is not None else None,
        )
        trainer.run()
    return export


def logged_steps(workdir: Path) -> set[int]:
    """The steps whose validation loss WORKDIR/metrics.jsonl holds (the Trainer truncates it to its checkpoint)."""
    path = workdir / "metrics.jsonl"
    if not path.is_file():
        return set()
    return {m["step"] for m in plots.read_metrics(path) if "val_loss" in m}


METHOD_OF = {
    "sft": "sft",
    "sft_hints": "sft",
    "rwr": "rwr",
    "opod": "opod",
    "opod_secondary": "opod",
    "opd_empty": "opod",
    "opd_wrong_hint": "opod",
    "dagrpo": "dagrpo",
}


def train_config(cfg: ExperimentConfig, name: str, learning_rate: float | None = None) -> TrainConfig:
    """The TrainConfig of config section `name` (the shared optimizer settings, the section's own)."""
    settings = cfg.method(name)
    rate = settings.learning_rate if learning_rate is None else float(learning_rate)
    return TrainConfig(
        steps=settings.steps,
        optimizer=dataclasses.replace(cfg.optimizer, learning_rate=rate, warmup_steps=settings.warmup_steps),
        method=MethodConfig(
            name=METHOD_OF[split_method(name)[0]], opd_weight=settings.opd_weight, clip_eps=settings.clip_eps
        ),
        checkpoint=cfg.checkpoint,
        log=cfg.log,
        export_every=settings.export_every,
        mesh=cfg.mesh,
    )


def learning_rates(cfg: ExperimentConfig, name: str) -> tuple[float, ...]:
    """The learning rates a method after SFT is trained with: its section's `lr_grid` (checkpoint selection then
    picks the rate and the step on validation tasks, the same rule for every method), else the one configured.
    ExperimentConfig checks at launch that the grid holds the configured rate and that selection is on."""
    return cfg.method(name).lr_grid or (cfg.method(name).learning_rate,)


def run_name(cfg: ExperimentConfig, name: str, learning_rate: float | None) -> str:
    """RUN/<name> for the configured learning rate (so runs made before a grid resume), RUN/<name>_lr<rate> else; a
    framework's method ("rwr@lifecycle") in its framework's folder (RUN/lifecycle/rwr, RUN/lifecycle/rwr_lr<rate>)."""
    method, framework = split_method(name)
    if learning_rate is not None and learning_rate != cfg.method(name).learning_rate:
        method = f"{method}_lr{learning_rate:g}"
    return f"{framework}/{method}" if framework else method


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
        base, cfg, may_change={"seed_sets"}, defaults=NEW_KEY_DEFAULTS
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


# Keys a run directory recorded before they existed holds at these values.
NEW_KEY_DEFAULTS = {
    "model": {"init_from": "", "compute_dtype": "float32", "remat": False},
    "policy": {"prefix_cache_mb": 0},
    "sft_hints": None,
    **{
        name: {"epochs": 0.0, "validation_share": 0.0, "validate_every": 0}
        for name in ("sft", "rwr", "opod", "opd_empty", "dagrpo")
    },
    "frameworks": [],
    "mesh": [1, 1, 1],
    "attribution": to_dict(AttributionSection(reading="free")),  # the only reading before `reading` existed
    "serving": to_dict(ServingSection()),
}


def run_pipeline(cfg: ExperimentConfig) -> None:
    """One seed set's whole loop in cfg.run_dir (module docstring). RUN_DIR/config.json records the typed config
    (every key, defaults included); a rerun with another one (but for its `resumable` fields) is refused, naming the
    keys, before any stage runs. `methods` may differ: every stage a method shares with the others (expert, SFT,
    rollouts, attribution) reads sections the claim checks, and each method trains and evaluates in folders of its
    own, so a run can grow by methods, e.g. SFT and its evaluation first, the methods after SFT in a later call."""
    if cfg.fork_from and (taken := fork(cfg, defaults=NEW_KEY_DEFAULTS)):
        print(
            f"forked from {cfg.fork_from}: " + ", ".join(str(p.relative_to(cfg.fork_from)) for p in taken), flush=True
        )
    claim_run_dir(cfg.run_dir, cfg, may_change={"methods"}, defaults=NEW_KEY_DEFAULTS)
    run = Run(cfg)

    view, buckets, max_len = cfg.policy.view, cfg.policy.buckets, max(cfg.policy.buckets)
    sampler_len = cfg.policy.max_len
    run.stages.begin("expert rollouts")
    expert = rollouts(run, "expert.jsonl", None, cfg.expert_rollouts, name="expert", temperature=0.0)
    print(f"expert: {sum(r.outcome.success for r in expert)}/{len(expert)} succeeded", flush=True)
    # The expert's decisions are attributed only for the hint-following SFT rows (the miniature's variant); the
    # scripted judge writes them, as in the miniature (the paper's SFT reads expert decisions only).
    expert_hints: dict[tuple[str, int], str] = {}
    if cfg.sft.hint_rows > 0 or cfg.sft.empty_hint_rows or "sft_hints" in cfg.methods:
        run.stages.begin("attribution of expert decisions (scripted judge, for the hint-following SFT rows)")
        expert_hints = attribute(run, "expert.jsonl", "expert_attribution.jsonl", scripted_grm)

    init = init_model(run)
    tok = AutoTokenizer.from_pretrained(str(init))
    train_eps, val_eps = episode_rows.validation_split(expert, cfg.sft.validation_share)
    sft_rows, val_rows = (
        episode_rows.packed_rows(train_eps, tok, view, max_len),
        episode_rows.packed_rows(val_eps, tok, view, max_len),
    )

    def with_hints(section: Any) -> list[Any]:
        """The section's hint-following rows (a share of the episodes' rows, not more) beside the expert's."""
        rows = episode_rows.hint_following_rows(train_eps, expert_hints, tok, view, follow_hint)
        rows = rows[: int(section.hint_rows * sum(len(r.tokens) <= max_len for r in sft_rows))]
        if section.empty_hint_rows:  # the same decisions under an empty hint, action unchanged
            rows += episode_rows.empty_hint_rows(train_eps, expert_hints, tok, view, follow_hint)[: len(rows)]
        return rows

    hint_rows = with_hints(cfg.sft)
    print(
        f"SFT: {len(sft_rows)} packed rows ({sum(len(r.tokens) > max_len for r in sft_rows)} over {max_len} tokens) "
        f"from {len(train_eps)} expert episodes, {len(val_rows)} validation rows from {len(val_eps)}, "
        f"{len(hint_rows)} hint-following rows",
        flush=True,
    )
    sft_lr, sft = train_sft(run, "sft", init, sft_rows + hint_rows, val_rows)
    variants = {"sft": {sft_lr: sft}}
    if "sft_hints" in cfg.methods:  # SFT+hints: the same expert rows and the scripted judge's hint-following rows
        lr, path = train_sft(run, "sft_hints", init, sft_rows + with_hints(cfg.sft_hints), val_rows, sft_lr)
        variants["sft_hints"] = {lr: path}

    embedded = load_policy(
        sft,
        max_len=sampler_len,
        prompt_buckets=buckets,
        prefix_cache_bytes=cfg.policy.prefix_cache_mb * 2**20,
        max_batch_tokens=cfg.policy.max_batch_tokens or None,
    )
    with contextlib.ExitStack() as stack:
        policy: Any = embedded
        served = None
        if cfg.serving.kind == "vllm":
            run.stages.begin("serve the SFT export (vLLM)")
            policy = served = stack.enter_context(
                served_policy(cfg.serving, first=sft, served_dir=init, run_dir=run.dir)
            )
        print(f"policies are sampled by {describe(policy)}", flush=True)
        if cfg.policy.context_tokens:
            policy = ContextWindowPolicy(policy, tok, cfg.policy.context_tokens)
        exports, skipped = after_sft(run, expert, tok, sft, embedded, policy, served, variants)
        for framework in cfg.frameworks:  # the other frameworks' SFT, RWR and DA-GRPO, from the same initial model
            trained, untrained = train_framework(run, framework, init, tok, policy)
            exports, skipped = {**exports, **trained}, {**skipped, **untrained}
        evaluate_and_report(run, policy, exports, skipped)
    run.stages.end()


def train_sft(
    run: Run, name: str, init: Path, rows: list[Any], validation: list[Any], learning_rate: float | None = None
) -> tuple[float, Path]:
    """SFT section `name` (sft or sft_hints) on `rows` at `learning_rate`, else at each rate of its grid, scored on
    the `validation` rows (section.validation_share) every validate_every steps; with several rates, the one whose
    validation loss is lowest (at the end, or after `select_after_epochs`) is kept (RUN/<name>_selection.json).
    Train and validation loss curves: RUN/<name>_loss.png. Returns the chosen rate and export."""
    cfg, settings = run.cfg, run.cfg.method(name)
    buckets, overlong = cfg.policy.buckets, cfg.policy.overlong
    epoch = len(rows) / settings.batch
    steps = math.ceil(settings.epochs * epoch) if settings.epochs > 0 else settings.steps
    every = settings.validate_every or max(1, math.ceil(epoch))  # once per epoch by default
    probe = math.ceil(settings.select_after_epochs * epoch) if settings.select_after_epochs > 0 else None
    rates = (learning_rate,) if learning_rate is not None else learning_rates(cfg, name)

    def run_at(lr: float, stop_at: int | None = None) -> Path:
        return train(
            run,
            name,
            init,
            lambda tok, mesh: sources.PackedSource(
                rows, settings.batch, buckets, settings.seed, mesh, overlong=overlong, accum_steps=settings.accum_steps
            ),
            learning_rate=lr,
            steps=steps,
            validation=lambda mesh: sources.fixed_batches(validation, settings.batch, buckets, mesh, overlong=overlong),
            validate_every=every if validation else 0,
            stop_at=stop_at,
        )

    def workdir(lr: float) -> Path:
        return run / run_name(cfg, name, lr)

    def val_loss(lr: float, step: int | None = None) -> float:  # at `step` (a rerun finds later ones too), else last
        logged = [m for m in plots.read_metrics(workdir(lr) / "metrics.jsonl") if "val_loss" in m]
        return [m["val_loss"] for m in logged if step is None or m["step"] == step][-1]

    def lowest(losses: dict[float, float]) -> float:  # ties go to the configured rate
        return min(losses, key=lambda lr: (losses[lr], lr != settings.learning_rate))

    if len(rates) == 1:
        chosen = rates[0]
        exports = {chosen: run_at(chosen)}
    elif probe is not None:  # each rate to the probe's step; only the chosen one continues
        for lr in rates:
            if not (workdir(lr) / "export" / POLICY_FILE).is_file():
                run_at(lr, stop_at=probe)
        at = {lr: val_loss(lr, probe) for lr in rates}
        chosen = lowest(at)
        exports = {chosen: run_at(chosen)}
        compared = f"validation loss at step {probe} of {steps} ({settings.select_after_epochs:g} epochs)"
    else:
        exports = {lr: run_at(lr) for lr in rates}
        at = {lr: val_loss(lr) for lr in rates}
        chosen = lowest(at)
        compared = f"final validation loss (step {steps})"
    curves = {f"{name} lr {lr:g}": plots.read_metrics(workdir(lr) / "metrics.jsonl") for lr in rates}
    plots.plot_loss_curves(curves, run / f"{run_name(cfg, name, None)}_loss.png")
    if len(rates) == 1:
        return chosen, exports[chosen]
    (run / f"{run_name(cfg, name, None)}_selection.json").write_text(
        json.dumps(
            {"learning_rate": chosen, "compared": compared, "val_loss": {f"{lr:g}": v for lr, v in at.items()}},
            indent=1,
        )
    )
    print(f"{name}: {compared} by learning rate {at} -> {chosen:g}", flush=True)
    return chosen, exports[chosen]


def after_sft(
    run: Run,
    expert: list[Any],
    tok: Any,
    sft: Path,
    embedded: Any,
    policy: Any,
    served: ServedPolicy | None,
    sft_runs: dict[str, dict[float, Path]] | None = None,
) -> tuple[dict[str, dict[float, Path]], dict[str, str]]:
    """SFT rollouts, their attribution and POrchestra's methods after SFT. `policy` samples every rollout (the
    embedded sampler or a vLLM server, `served_policy`); `served` is that server's ServedPolicy (None when embedded),
    on which OPD's student samples with opd.sampling.sampler.kind "vllm"; `embedded` (the SFT weights in this process)
    measures hint following. Returns every trained method's exports by learning rate (SFT and its variants
    included) and the configured methods left untrained for want of data, with why."""
    cfg = run.cfg
    view, buckets, max_len, overlong = cfg.policy.view, cfg.policy.buckets, max(cfg.policy.buckets), cfg.policy.overlong
    run.stages.begin("rollouts of the SFT policy")
    data = rollouts(
        run, "rollouts.jsonl", policy.load(sft), cfg.rollouts, name="sft", temperature=cfg.rollouts.temperature
    )
    print(f"SFT rollouts: {sum(r.outcome.success for r in data)}/{len(data)} succeeded", flush=True)
    a = cfg.attribution
    primary = f"base model, {a.reading} reading" if a.grm == "base_model" else "scripted judge"
    run.stages.begin(f"attribution of SFT decisions ({primary})")
    grm = (lambda: base_model_grm(cfg, a.reading)) if a.grm == "base_model" else scripted_grm
    hints = attribute(run, "rollouts.jsonl", "attribution.jsonl", grm, label=f" ({primary})")
    readings = {"primary": hints}
    if a.free_reading:  # reported beside the held one; OPOD trains on the primary
        run.stages.begin("attribution of SFT decisions (base model, free reading: reported)")
        attribute(
            run,
            "rollouts.jsonl",
            "attribution_free.jsonl",
            lambda: base_model_grm(cfg, "free"),
            label=" (free reading)",
        )
    if cfg.attribution.secondary:
        run.stages.begin("secondary attribution of SFT decisions (scripted judge's verdicts as hints)")
        readings["secondary"] = attribute(
            run, "rollouts.jsonl", "attribution_secondary.jsonl", scripted_grm, label=" (secondary: scripted judge)"
        )

    # OPD's precondition: the teacher under s ⊕ H acts as H says, the student not; for each SFT teacher trained
    teachers = {"sft": sft} | {n: next(iter(by_lr.values())) for n, by_lr in (sft_runs or {}).items() if n != "sft"}
    loaded = sft
    for name, h in readings.items():
        if name not in a.hint_following:
            continue
        for teacher, folder in teachers.items():
            check = run / hint_following_file(name, teacher)
            if not check.is_file():
                run.stages.begin(f"hint following ({name} hints, {teacher} weights)")
                loaded = folder
                embedded.load(folder)
                check.write_text(
                    json.dumps(
                        hint_following(
                            embedded.sampler,
                            data,
                            h,
                            view,
                            follow_hint,
                            max_new_tokens=cfg.policy.max_new_tokens,
                            seed=cfg.seed,
                        )
                    )
                )
            print(
                f"hinted action matched on flagged decisions ({name}, {teacher}, greedy): {check.read_text()}",
                flush=True,
            )
    if loaded != sft:  # the SFT weights back for what samples from `embedded` later
        embedded.load(sft)

    rwr_rows = successful_rows(data, tok, view, max_len)
    opd_rows = {name: episode_rows.opd_rows(data, h, tok, view) for name, h in readings.items()}
    print(
        f"RWR: {len(rwr_rows)} packed rows from successful rollouts; OPD: "
        + ", ".join(f"{len(r)} attributable decisions ({name})" for name, r in opd_rows.items()),
        flush=True,
    )

    has_rwr = has_rows(rwr_rows, max_len, overlong)

    def packed(section: str, view: str, mesh: Any) -> list[Any]:
        if not has_rwr:
            return []
        settings = cfg.method(section)
        return [
            sources.PackedSource(
                rwr_rows, settings.batch, buckets, settings.seed, mesh, view, overlong, settings.accum_steps
            )
        ]

    def opd(section: str, rows: list[Any], tok: Any, mesh: Any) -> list[Any]:
        settings = cfg.method(section)
        o = settings.opd  # not None for a method in cfg.methods (ExperimentConfig checks)
        sampling = o.sampling
        if not rows:
            return []
        sampler = None
        if sampling.sampler.kind == "vllm":  # the student samples on the policy server, pushed every push_every steps
            sampler = served_action_sampler(sampling, tok, server=served, export_dir=run / section / "served_weights")
            served.folder = None  # training changes the served weights: the next load pushes again
        return [
            sources.OpdSource(
                rows, tok, sampling, o.batch, buckets, mesh, overlong, sampler, accum_steps=settings.accum_steps
            )
        ]

    def opod_plan(section: str, rows: list[Any]) -> tuple[Callable[[Any, Any], Any], bool]:
        def source(tok: Any, mesh: Any) -> Any:
            if not rows:  # RWR rows alone, as the RWR method reads them (train() then picks "rwr")
                return packed(section, "policy", mesh)[0]
            return sources.CombinedViews(*packed(section, "rwr", mesh), *opd(section, rows, tok, mesh))

        return source, has_rwr or bool(rows)

    empty_rows = episode_rows.opd_rows(data, dict.fromkeys(hints, ""), tok, view)
    wrong_rows = episode_rows.opd_rows(data, episode_rows.wrong_hints(hints, cfg.seed), tok, view)
    exports = dict(sft_runs or {"sft": {cfg.sft.learning_rate: sft}})  # SFT (chosen rate) and its variants
    plans = {  # a method's batch source (given tokenizer and mesh) and whether it has data
        "rwr": (lambda tok, mesh: packed("rwr", "policy", mesh)[0], has_rwr),
        "opod": opod_plan("opod", opd_rows["primary"]),
        "opod_secondary": opod_plan("opod_secondary", opd_rows.get("secondary", [])),
        "opd_empty": opod_plan("opd_empty", empty_rows),
        "opd_wrong_hint": opod_plan("opd_wrong_hint", wrong_rows),
        "dagrpo": (dagrpo_source(cfg, expert, "dagrpo"), True),
    }
    flagged = len(opd_rows["primary"])
    why_empty = {  # what a method trains on, said where it has none
        "rwr": NO_SUCCESS,
        "opod": f"no successful SFT rollout and no decision the primary GRM flagged ({flagged})",
        "opod_secondary": "no successful SFT rollout and no decision the scripted judge flagged",
        "opd_empty": f"no successful SFT rollout and no flagged decision to distil with an empty hint ({flagged})",
        "opd_wrong_hint": f"no successful SFT rollout and fewer than two flagged decisions with different hints "
        f"({flagged} flagged)",
    }
    skipped: dict[str, str] = {}
    for name in cfg.methods:
        if name in exports:  # SFT and its variants, trained before the rollouts
            continue
        source_of, has_data = plans[name]
        if not has_data:
            skipped[name] = why_empty[name]
            print(f"{name}: no training data ({skipped[name]}); skipped", flush=True)
            continue
        exports[name] = {lr: train(run, name, sft, source_of, learning_rate=lr) for lr in learning_rates(cfg, name)}
    return exports, skipped


NO_SUCCESS = "no successful SFT rollout (RWR reweights successes)"  # why RWR has no rows


def successful_rows(data: list[Any], tok: Any, view: str, max_len: int) -> list[Any]:
    """RWR's packed rows: the rollouts' episodes, each weighted by its success (a failure's rows weigh nothing)."""
    return episode_rows.packed_rows(data, tok, view, max_len, weight=lambda ep: float(ep.outcome.success))


def has_rows(rows: list[Any], max_len: int, overlong: str) -> bool:
    """Whether packed rows leave a batch: under "drop", rows that are all over-long leave none (as no rows do)."""
    return any(len(r.tokens) <= max_len for r in rows) or (overlong != "drop" and bool(rows))


def dagrpo_source(cfg: ExperimentConfig, expert: list[Any], name: str) -> Callable[[Any, Any], Any]:
    """DA-GRPO's batch source (given tokenizer and mesh) for method `name` ("dagrpo", or a framework's
    "dagrpo@<framework>"): groups sampled at `expert`'s decision contexts, each sample scored against the expert's
    action there with the framework's action set (opod/rewards.py)."""
    g = cfg.dagrpo.group  # not None when dagrpo is in cfg.methods (ExperimentConfig checks)
    actions = system_config(framework_system(name)).prompt_actions
    view, buckets, overlong = cfg.policy.view, cfg.policy.buckets, cfg.policy.overlong

    def source(tok: Any, mesh: Any) -> Any:
        contexts = episode_rows.expert_contexts(expert, tok, view)
        reward = dagrpo_reward(TOOLS, actions)
        return sources.GroupSource(
            contexts,
            tok,
            g.sampling,
            g.contexts_per_step,
            g.group_size,
            buckets,
            reward,
            mesh,
            overlong=overlong,
            accum_steps=cfg.method(name).accum_steps,
        )

    return source


def train_framework(
    run: Run, framework: str, init: Path, tok: Any, policy: Any
) -> tuple[dict[str, dict[float, Path]], dict[str, str]]:
    """One of `frameworks` (ExperimentConfig's docstring), trained as POrchestra is, in RUN/<framework>: the scripted
    expert plays its action set (<framework>/expert.jsonl) -> SFT from the initial model `init` on those decisions
    (the sft section, its validation split and learning-rate choice) -> rollouts of that SFT policy under its engine
    (<framework>/rollouts.jsonl, the SFT rollouts' tasks and temperature; `policy` samples them) -> RWR on the
    successful ones and DA-GRPO at the expert's contexts, from its SFT weights, at each rate of their sections'
    grids. Returns the exports by method ("sft@<framework>", ...) and learning rate, and the methods left untrained
    for want of data, with why."""
    cfg = run.cfg
    view, buckets, max_len, overlong = cfg.policy.view, cfg.policy.buckets, max(cfg.policy.buckets), cfg.policy.overlong
    names = cfg.framework_methods(framework)
    sft_name, rwr_name, dagrpo_name = (f"{m}@{framework}" for m in ("sft", "rwr", "dagrpo"))
    run.stages.begin(f"{framework}: expert rollouts (the scripted expert playing its action set)")
    expert = rollouts(
        run, f"{framework}/expert.jsonl", None, cfg.expert_rollouts, name="expert", temperature=0.0, system=framework
    )
    print(f"{framework} expert: {sum(r.outcome.success for r in expert)}/{len(expert)} succeeded", flush=True)
    train_eps, val_eps = episode_rows.validation_split(expert, cfg.sft.validation_share)
    sft_rows = episode_rows.packed_rows(train_eps, tok, view, max_len)
    val_rows = episode_rows.packed_rows(val_eps, tok, view, max_len)
    print(
        f"{sft_name}: {len(sft_rows)} packed rows ({sum(len(r.tokens) > max_len for r in sft_rows)} over {max_len} "
        f"tokens) from {len(train_eps)} expert episodes, {len(val_rows)} validation rows from {len(val_eps)}",
        flush=True,
    )
    sft_lr, sft = train_sft(run, sft_name, init, sft_rows, val_rows)
    exports: dict[str, dict[float, Path]] = {sft_name: {sft_lr: sft}}
    skipped: dict[str, str] = {}
    if rwr_name in names:
        run.stages.begin(f"{framework}: rollouts of its SFT policy")
        data = rollouts(
            run,
            f"{framework}/rollouts.jsonl",
            policy.load(sft),
            cfg.rollouts,
            name=sft_name,
            temperature=cfg.rollouts.temperature,
            system=framework,
        )
        print(f"{sft_name} rollouts: {sum(r.outcome.success for r in data)}/{len(data)} succeeded", flush=True)
        rwr_rows = successful_rows(data, tok, view, max_len)
        print(f"{rwr_name}: {len(rwr_rows)} packed rows from successful rollouts", flush=True)
        if has_rows(rwr_rows, max_len, overlong):
            s = cfg.rwr

            def rwr_source(tok: Any, mesh: Any) -> Any:
                return sources.PackedSource(
                    rwr_rows, s.batch, buckets, s.seed, mesh, overlong=overlong, accum_steps=s.accum_steps
                )

            exports[rwr_name] = {
                lr: train(run, rwr_name, sft, rwr_source, learning_rate=lr) for lr in learning_rates(cfg, rwr_name)
            }
        else:
            skipped[rwr_name] = NO_SUCCESS
            print(f"{rwr_name}: no training data ({skipped[rwr_name]}); skipped", flush=True)
    if dagrpo_name in names:
        group = dagrpo_source(cfg, expert, dagrpo_name)
        exports[dagrpo_name] = {
            lr: train(run, dagrpo_name, sft, group, learning_rate=lr) for lr in learning_rates(cfg, dagrpo_name)
        }
    return exports, skipped


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
            cands = selection_candidates(export) if split_method(name)[0] != "sft" else {}
            for step, folder in (cands or {-1: export}).items():  # no step exports: the final export only
                tag = run_name(cfg, name, lr) + ("" if step < 0 else f"_step{step}")
                run.stages.begin(f"validate {tag} on {len(tasks)} validation tasks")
                recs = evaluate(
                    policy.load(folder),
                    tasks,
                    run / "val" / f"{tag}.jsonl",
                    cfg.suite,
                    cfg.eval,
                    tag,
                    system=framework_system(name),
                )
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


def flag_agreement(run: Run, reading: str) -> dict[str, Any] | None:
    """How often the flags of RUN/<reading> agree with the scripted judge's (the secondary reading, which knows the
    expert's blind spots) on the decisions both judged; None without both."""
    mine, judge = run / reading, run / "attribution_secondary.jsonl"
    if not (mine.is_file() and judge.is_file()):
        return None
    verdict = {(r["episode_id"], r["index"]): bool(r["attributable"]) for r in AttributionStore(judge).read()
               if r["status"] == "ok"}  # fmt: skip
    pairs = [
        (bool(r["attributable"]), verdict[(r["episode_id"], r["index"])])
        for r in AttributionStore(mine).read()
        if r["status"] != "skipped" and (r["episode_id"], r["index"]) in verdict
    ]
    n = len(pairs)
    return {
        "decisions": n,
        "agreement": sum(a == b for a, b in pairs) / n if n else 0.0,
        "both_flag": sum(a and b for a, b in pairs),
        "only_grm": sum(a and not b for a, b in pairs),
        "only_judge": sum(b and not a for a, b in pairs),
    }


def hint_following_file(reading: str, teacher: str) -> str:
    """The hint-following check of `reading`'s hints ("primary", "secondary") on `teacher`'s weights ("sft",
    "sft_hints"), in the run directory."""
    return (
        "hint_following"
        + ("" if reading == "primary" else f"_{reading}")
        + ("" if teacher == "sft" else f"_{teacher}")
        + ".json"
    )


def attribution_notes(run: Run) -> str:
    """The attribution readings under the results table: who the GRM was and how its reply was read, its FLAG and
    parse-error rates, its flags' agreement with the scripted judge's, and whether the SFT policy follows a hint in
    its context (the teacher's precondition)."""
    cfg, lines = run.cfg, []
    a = cfg.attribution
    grm = (
        f"the frozen base model (model.init_from), {a.reading} reading"
        if a.grm == "base_model"
        else "the scripted judge"
    )
    for name, out, who in (
        ("primary", "attribution.jsonl", grm),
        ("free reading (reported)", "attribution_free.jsonl", "the frozen base model, its replies as written"),
        ("secondary", "attribution_secondary.jsonl", "the scripted judge's verdicts written as hints"),
    ):
        summary = run / f"{out}.summary.json"
        if not summary.is_file():
            continue
        g = json.loads(summary.read_text())
        agree = flag_agreement(run, out) if name != "secondary" else None
        lines.append(
            f"- {name} attribution ({who}): {g['judged']} decisions asked, FLAG rate {g['flag_rate']:.3f}, "
            f"malformed replies {g['malformed_rate']:.3f} ({g['retried']} asked again), {g['backend_errors']} failed "
            "calls"
            + (
                f"; flags agree with the scripted judge's on {agree['agreement']:.2f} of {agree['decisions']} "
                f"decisions (both flag {agree['both_flag']}, only this reading {agree['only_grm']}, only the judge "
                f"{agree['only_judge']})"
                if agree and agree["decisions"]
                else ""
            )
        )
    if "opod_secondary" in cfg.methods:
        lines.append(
            "- opod_secondary is the SECONDARY reading: OPOD on the scripted judge's hints, which know where the "
            "scripted expert is blind; it measures the distillation mechanism on this model and carries the "
            "miniature's built-in advantage."
        )
    if cfg.sft.hint_rows > 0:
        lines.append(
            f"- SFT includes hint-following rows (hint_rows={cfg.sft.hint_rows:g}, the miniature's variant), not "
            "expert decisions only"
        )
    return ("Attribution:\n\n" + "\n".join(lines) if lines else "") + hint_following_notes(run)


def hint_following_notes(run: Run) -> str:
    """OPD's precondition as a table: on each reading's flagged decisions, how often each SFT teacher's greedy action
    is the hinted one from the student's context s, from s ⊕ H, and from the two controls' contexts."""
    lines = []
    for reading in ("primary", "secondary"):
        for teacher in ("sft", "sft_hints"):
            path = run / hint_following_file(reading, teacher)
            if not path.is_file():
                continue
            h = json.loads(path.read_text())
            cells = [f"{h[k]:.2f}" if k in h else "-" for k in FOLLOW_COLUMNS]
            lines.append(f"| {reading} | {teacher} | {int(h['n'])} | " + " | ".join(cells) + " |")
    if not lines:
        return ""
    return (
        "\n\nHint following (greedy exact match with the hinted action on flagged decisions; OPD helps only where "
        "s + H beats s and the controls):\n\n| hints | weights | n | s | s + H | s + empty hint | s + wrong hint |\n"
        "|---|---|---|---|---|---|---|\n" + "\n".join(lines)
    )


FOLLOW_COLUMNS = ("student", "teacher", "teacher_empty_hint", "teacher_wrong_hint")


def framework_notes(run: Run) -> str:
    """The notes on the other frameworks under the results table: what each trained on, and why OPOD and OPD are not
    applicable to them (as the paper's training table marks them)."""
    cfg = run.cfg
    if not cfg.frameworks:
        return ""
    lines = []
    for framework in cfg.frameworks:
        counts = []
        for store, what in (("expert.jsonl", "expert episodes (its SFT data)"), ("rollouts.jsonl", "SFT rollouts")):
            path = run / framework / store
            if path.is_file():
                eps = TrajectoryStore(path).read()
                counts.append(f"{sum(e.outcome.success for e in eps)}/{len(eps)} successful {what}")
        lines.append(
            f"- {framework} (engine system `{framework}`): "
            + ", ".join(m for m in cfg.framework_methods(framework))
            + " trained through the same trainer, rows and config sections as POrchestra's, from the same initial "
            "model; SFT on its expert's decisions only (no hint-following rows); " + "; ".join(counts)
        )
    if cfg.not_applicable():
        lines.append(
            "- not applicable: "
            + ", ".join(cfg.not_applicable())
            + ". OPOD and OPD need mid-run feedback (a sub-agent's message during its run, which the GRM attributes and "
            "the hint answers); Orchestra-o1's and the lifecycle orchestrator's sub-agents only return when done."
        )
    return "\n\nOther frameworks (POrchestra's rows are those without @):\n\n" + "\n".join(lines)


def reference_rows(run: Run, policy: Any, tasks: list[Any]) -> dict[str, list[Any]]:
    """The results table's reference rows on the held-out tasks, beside the trained methods: "expert", the scripted
    expert deciding from what its window shows (the demonstrator SFT imitates, so the ceiling of imitation), and,
    with `zero_shot`, "zero_shot", model.init_from as it is (no training)."""
    cfg, out = run.cfg, {}
    window = " deciding from its window" if cfg.policy.context_tokens else ""
    run.stages.begin(f"evaluate the scripted expert{window} (the ceiling) on {len(tasks)} held-out tasks")
    (run / "eval").mkdir(exist_ok=True)
    out["expert"] = rollouts(run, "eval/expert.jsonl", None, cfg.eval.tasks, name="expert", temperature=0.0)
    if cfg.zero_shot:
        init, folder = init_model(run), run / "zero_shot" / "export"
        if not (folder / POLICY_FILE).is_file():  # the marker is written last: a folder with it is whole
            export_for_serving(from_pretrained(init), folder, tokenizer=AutoTokenizer.from_pretrained(str(init)))
            write_policy_file(folder, cfg.policy.view)
        run.stages.begin(f"evaluate zero_shot (model.init_from, untrained) on {len(tasks)} held-out tasks")
        out["zero_shot"] = evaluate(
            policy.load(folder), tasks, run / "eval" / "zero_shot.jsonl", cfg.suite, cfg.eval, "zero_shot"
        )
    for name, records in out.items():
        print(f"{name}: {sum(r.outcome.success for r in records)}/{len(records)} succeeded", flush=True)
    return out


def stage_notes(run: Run) -> str:
    """The run's stage times (RUN/stages.jsonl, summed over the processes of a resumed run; a process's last stage
    before it was killed is not counted) under the results table."""
    times = stage_times(run / STAGE_LOG) if (run / STAGE_LOG).is_file() else []
    if not times:
        return ""
    total = sum(t for _, t in times)
    return (
        f"\n\nStage times ({total / 60:.1f} min counted; a stage cut by a kill counts from its resume):\n\n"
        "| stage | minutes |\n|---|---|\n" + "\n".join(f"| {name} | {t / 60:.1f} |" for name, t in times)
    )


def evaluate_and_report(
    run: Run, policy: Any, exports: dict[str, dict[float, Path]], skipped: dict[str, str] | None = None
) -> None:
    """Each method's selected (or only) export on the held-out tasks, under its framework's engine; RUN/results.{md,json}
    and the plots. A method in `skipped` (no training data) has a row saying why, and so has each method that does not
    apply to a framework trained (`ExperimentConfig.not_applicable`)."""
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
        run.stages.begin(f"evaluate {tag} on {len(tasks)} held-out tasks")
        records[name] = evaluate(
            policy.load(folder),
            tasks,
            run / "eval" / f"{tag}.jsonl",
            cfg.suite,
            cfg.eval,
            name,
            system=framework_system(name),
        )
        print(f"{name}: {sum(r.outcome.success for r in records[name])}/{len(records[name])} succeeded", flush=True)
    references = reference_rows(run, policy, tasks)
    run.stages.begin("report")
    rows = report.summaries(records | references, reference="sft")
    pairs = [
        (a, b)
        for a, b in (
            ("opod", "rwr"),
            ("rwr", "sft"),
            ("opod", "sft"),
            ("opod", "opd_empty"),
            ("opod", "opd_wrong_hint"),
            ("opod", "dagrpo"),
            ("opod_secondary", "sft"),
            ("opod_secondary", "opod"),
            *(  # within each other framework, then POrchestra against it under the same method
                (f"{a}{f}", f"{b}{f}")
                for framework in cfg.frameworks
                for f in (f"@{framework}",)
                for a, b in (("rwr", "sft"), ("dagrpo", "sft"))
            ),
            *((m, f"{m}@{framework}") for framework in cfg.frameworks for m in ("sft", "rwr", "dagrpo")),
        )
        if a in records and b in records
    ]
    comparisons = [report.compare(records, a, b) for a, b in pairs]
    not_applicable = cfg.not_applicable()
    table = (
        report.format_table(rows, records | references, comparisons, skipped or {}, not_applicable)
        + "\n\nReference rows: expert is the scripted demonstrator SFT imitates, on the same tasks"
        + (", deciding from what its context window shows" if cfg.policy.context_tokens else "")
        + " (the ceiling of imitation)"
        + ("; zero_shot is model.init_from untrained" if "zero_shot" in references else "")
        + ".\n\nBlind-spot checks on held-out delegations:\n\n"
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
    table += "\n\n" + attribution_notes(run) + framework_notes(run)
    table += stage_notes(run)
    (run / "results.md").write_text(table + "\n")
    report.write_results(
        [r for r in rows if r.system in records],
        comparisons,
        run / "results.json",
        skipped or {},
        not_applicable,
        references=[r for r in rows if r.system in references],
    )
    plots.plot_curves({n: plots.read_metrics(run / runs[n] / "metrics.jsonl") for n in exports}, run / "curves.png")
    plots.plot_success(rows, run / "success.png")
    print(
        f"\n{table}\n\nresults: {run / 'results.md'}, plots: {run / 'curves.png'}, {run / 'success.png'} "
        f"({time.monotonic() - run.stages.t0:.0f} s)",
        flush=True,
    )
