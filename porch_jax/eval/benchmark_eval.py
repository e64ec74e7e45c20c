"""One evaluation config for every benchmark runner: what to evaluate, on which benchmark, how often, how wide.

``BenchmarkEvalConfig`` is what ``launch/eval.py`` validates once: the benchmark (``gaia``, ``taskcraft``,
``gaia2``, ``swe``), where its tasks come from (a local file in the hub's row format, or the hub), the policy
(``policy``: a provider ``endpoint``, an ``hf`` folder or an ``orbax`` step, both served by vLLM for the run; or
``answer_key`` / ``oracle`` / ``gold``, the runners' own checks that score 100%), each role's endpoint, runs per
task, concurrency and the engine's sampling and budgets. ``run_benchmark(cfg, orchestrator)`` runs it with the orchestrator endpoint the
launcher resolved; every runner resumes from its run directory (a rerun plays only the unfinished (task, run)
pairs) and writes ``results.json`` / ``results.md`` and a plot there.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from porch_jax.backends.spec import EndpointSpec
from porch_jax.envs.swe import SWEConfig
from porch_jax.rollout import ABLATIONS, SYSTEMS, EngineConfig
from porch_jax.serving import ServerConfig
from porch_jax.typed_config import check, resumable, to_dict

BENCHMARKS = ("gaia", "taskcraft", "gaia2", "swe")
POLICY_KINDS = ("endpoint", "hf", "orbax", "answer_key", "oracle", "gold")
CHECK_POLICIES = {"gaia": "answer_key", "taskcraft": "answer_key", "gaia2": "oracle", "swe": "gold"}


@dataclasses.dataclass(frozen=True)
class PolicySource:
    """``endpoint``: the ``orchestrator`` endpoint as configured. ``hf``: ``path`` is a Hugging Face folder (empty:
    SmolLM2-135M-Instruct from the package index, ``models.smollm2``);
    ``orbax``: ``path`` is a trainer folder (``RUN/opod``) or a bare checkpoint folder, ``step`` 0 the newest; both
    are served by vLLM (``serve``) for the run and the orchestrator endpoint points at that server."""

    kind: Literal["endpoint", "hf", "orbax", "answer_key", "oracle", "gold"] = "endpoint"
    path: str = ""
    step: int = 0
    tokenizer: str = ""  # orbax: a folder whose tokenizer goes into the export (the base model's)
    serve: ServerConfig = ServerConfig(device="auto", served_model_name="policy")
    tools_in_prompt: bool = True  # a served folder's template reads no tools (SmolLM2's ChatML): render them in

    def __post_init__(self) -> None:
        check(self.kind in POLICY_KINDS, "kind", f"one of {POLICY_KINDS}, got {self.kind!r}")
        check(self.kind != "orbax" or bool(self.path), "path", "an orbax policy needs its run's trainer folder")
        check(self.step >= 0, "step", f"must be >= 0 (0: the newest), got {self.step}")

    @property
    def served(self) -> bool:
        return self.kind in ("hf", "orbax")


@dataclasses.dataclass(frozen=True)
class BenchmarkEvalConfig:
    benchmark: Literal["gaia", "taskcraft", "gaia2", "swe"] = "gaia"
    out_dir: str = resumable("runs/eval")
    # gaia / taskcraft: rows file in the hub's format ("" : the hub); gaia2: hub rows ("" : none); swe: full rows of
    # SWE-bench Verified in the hub's format ("" : the shared list, its missing fields from the hub)
    tasks: str = ""
    split: str = "validation"
    level: int = 0  # gaia / taskcraft: one level only (0: all)
    corpus: str = ""  # search "offline": JSONL pages (url, title, html)
    search: Literal["offline", "serper"] = "offline"
    gaia2_dataset: str = ""  # gaia2: a folder of GAIA2-format scenario files
    gaia2_checks: str = ""  # gaia2 with judge "scripted": ARE scripted checks per scenario
    gaia2_hub_config: str = ""  # gaia2 from the hub: a capability or "mini"
    gaia2_judge: Literal["scripted", "llm"] = "scripted"  # "llm": ARE's judge on the `judge` endpoint
    swe_repos: str = ""  # swe: a folder of git mirrors named <owner>__<name> (checkouts at each base commit)
    swe: SWEConfig = SWEConfig()  # swe: the sub-agents' tools, the paper's budgets (500 / 50), the grader
    limit: int = 0  # at most this many tasks (0: all)
    runs: int = 1
    concurrency: int = resumable(4)
    system: str = "proactive"
    policy: PolicySource = PolicySource()
    orchestrator: EndpointSpec = EndpointSpec()
    executor: EndpointSpec = EndpointSpec()  # empty model: the orchestrator's endpoint
    judge: EndpointSpec = EndpointSpec()  # gaia: equivalence fallback; gaia2 "llm": ARE's soft checks
    judge_max_tokens: int = 32
    engine: EngineConfig = EngineConfig()  # the benchmark's budgets are taken when these are the defaults
    episode_timeout_s: float = resumable(1800.0)

    def __post_init__(self) -> None:
        check(self.benchmark in BENCHMARKS, "benchmark", f"one of {BENCHMARKS}, got {self.benchmark!r}")
        check(self.runs >= 1 and self.concurrency >= 1, "runs", "runs and concurrency must be >= 1")
        check(self.limit >= 0 and self.level >= 0, "limit", "limit and level must be >= 0")
        known = SYSTEMS + ABLATIONS
        check(self.system in known, "system", f"one of {', '.join(known)}, got {self.system!r}")
        needs_model = self.policy.kind == "endpoint"
        check(not needs_model or self.orchestrator.configured, "orchestrator.model", "an endpoint policy needs it")
        own = CHECK_POLICIES[self.benchmark]
        check(
            self.policy.kind not in CHECK_POLICIES.values() or self.policy.kind == own,
            "policy.kind",
            f"{self.benchmark}'s check policy is {own}, got {self.policy.kind!r}",
        )
        if self.benchmark in ("gaia", "taskcraft"):
            check(self.search != "offline" or bool(self.corpus), "corpus", "offline search needs a corpus file")
        elif self.benchmark == "swe":
            check(bool(self.swe_repos), "swe_repos", "swe needs a folder of git mirrors of the instances' repositories")
        else:
            sources = (self.tasks, self.gaia2_dataset, self.gaia2_hub_config)
            check(any(sources), "tasks", "gaia2 needs hub rows (tasks), a gaia2_dataset folder or a gaia2_hub_config")
            check(self.gaia2_judge != "llm" or self.judge.configured, "judge.model", "gaia2_judge 'llm' needs it")


def engine_changes(cfg: BenchmarkEvalConfig) -> dict[str, Any]:
    """The engine fields the config sets away from EngineConfig's defaults (the runner applies them over its
    benchmark's own budgets, so an untouched config runs the paper's)."""
    default, mine = to_dict(EngineConfig()), to_dict(cfg.engine)
    return {k: v for k, v in mine.items() if v != default[k]}


def run_benchmark(cfg: BenchmarkEvalConfig, orchestrator: EndpointSpec) -> dict[str, Any]:
    """The configured benchmark with ``orchestrator`` as the policy's endpoint; returns the runner's results."""
    executor = cfg.executor if cfg.executor.configured else orchestrator
    if cfg.benchmark == "gaia2":
        return _run_gaia2(cfg, orchestrator, executor)
    if cfg.benchmark == "swe":
        return _run_swe(cfg, orchestrator, executor)
    return _run_gaia(cfg, orchestrator, executor)


def _run_swe(cfg: BenchmarkEvalConfig, orchestrator: EndpointSpec, executor: EndpointSpec) -> dict[str, Any]:
    from porch_jax.envs.swe import load_full
    from porch_jax.eval import swe_runner

    instances = load_full(cfg.tasks or None)
    instances = instances[: cfg.limit] if cfg.limit else instances
    run_cfg = swe_runner.SWERunConfig(
        out_dir=cfg.out_dir,
        repos=cfg.swe_repos,
        runs=cfg.runs,
        concurrency=cfg.concurrency,
        policy="gold" if cfg.policy.kind == "gold" else "llm",
        system=cfg.system,
        orchestrator=orchestrator,
        executor=executor,
        episode_timeout_s=cfg.episode_timeout_s,
        swe=cfg.swe,
        engine=engine_changes(cfg),
    )
    return swe_runner.run(run_cfg, instances)


def _run_gaia(cfg: BenchmarkEvalConfig, orchestrator: EndpointSpec, executor: EndpointSpec) -> dict[str, Any]:
    from porch_jax.envs.gaia import CorpusFetcher, HTTPFetcher, load_gaia, load_taskcraft, search_provider
    from porch_jax.eval import gaia_runner

    level = cfg.level or None
    path = cfg.tasks or None
    tasks = (
        load_gaia(path, split=cfg.split, level=level) if cfg.benchmark == "gaia" else load_taskcraft(path, level=level)
    )
    tasks = tasks[: cfg.limit] if cfg.limit else tasks
    if cfg.search == "offline":
        pages = gaia_runner.corpus_from_jsonl(cfg.corpus)
        search, fetcher = search_provider("offline", pages), CorpusFetcher(pages)
    else:
        search, fetcher = search_provider(cfg.search), HTTPFetcher()
    run_cfg = gaia_runner.GaiaRunConfig(
        out_dir=cfg.out_dir,
        runs=cfg.runs,
        concurrency=cfg.concurrency,
        policy="answer_key" if cfg.policy.kind == "answer_key" else "llm",
        system=cfg.system,
        orchestrator=orchestrator,
        executor=executor,
        judge=cfg.judge,
        judge_max_tokens=cfg.judge_max_tokens,
        episode_timeout_s=cfg.episode_timeout_s,
        engine=engine_changes(cfg),
    )
    return gaia_runner.run(run_cfg, tasks, search=search, fetcher=fetcher)


def _run_gaia2(cfg: BenchmarkEvalConfig, orchestrator: EndpointSpec, executor: EndpointSpec) -> dict[str, Any]:
    import json
    from pathlib import Path

    from porch_jax.envs.are.client import run_gaia2
    from porch_jax.eval.plots import plot_group_success
    from porch_jax.rollout.pairs import GroupResult

    judge = ["--judge", cfg.gaia2_judge]
    if cfg.gaia2_judge == "llm":
        judge += ["--judge_model", cfg.judge.model, "--judge_provider", "openai"]
        judge += ["--judge_endpoint", f"{cfg.judge.urls[0]}/v1"] if cfg.judge.urls else []
        judge += ["--judge_api_key_env", cfg.judge.api_key_env] if cfg.judge.api_key_env else []
        judge += ["--judge_max_tokens", str(cfg.judge_max_tokens)]
    extra = [*judge, "--timeout_s", str(int(cfg.episode_timeout_s))]
    if cfg.gaia2_hub_config:
        extra += ["--hub_config", cfg.gaia2_hub_config, "--hub_split", cfg.split]
    if cfg.limit:
        extra += ["--limit", str(cfg.limit)]
    oracle = cfg.policy.kind == "oracle"
    summary = run_gaia2(
        cfg.out_dir,
        dataset=cfg.gaia2_dataset or None,
        checks=cfg.gaia2_checks or None,
        hub_rows=cfg.tasks or None,
        oracle=oracle,
        system=cfg.system,
        policy="scripted_oracle" if oracle else "llm",
        store=None if oracle else Path(cfg.out_dir, "episodes.jsonl"),
        orchestrator=None if oracle else orchestrator,
        executor=None if oracle else executor,
        engine=engine_changes(cfg),
        runs=cfg.runs,
        concurrency=cfg.concurrency,
        timeout_s=max(3600.0, 4 * cfg.episode_timeout_s),
        extra=extra,
    )
    results = json.loads(Path(cfg.out_dir, "results.json").read_text())
    rows = [GroupResult(**{**r, "ci": tuple(r["ci"])}) for r in results["rows"]]
    plot_group_success(rows, Path(cfg.out_dir, "success.png"), "GAIA2 success by capability (95% CI)")
    return results | {"success_rate": summary["success_rate"], "played": summary["played"]}
