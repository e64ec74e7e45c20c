"""GAIA (and TaskCraft) through the engine: (task, run) pairs, concurrent, resumable, scored by GAIA's rules.

Each pair is one episode: the orchestrator and its sub-agents on their own backends, the tools of
``envs.gaia`` (web search behind a provider, page extraction, sandboxed code), the answer scored by GAIA's
``question_scorer`` rules (``envs.gaia.score``). Where exact match rejects an answer and a judge backend is
configured, the judge is asked whether the answer is equivalent; its verdict is recorded beside the official one
(``meta["judge"]``) and reported as a second table, never folded into the official score.

Policies: ``llm`` (served models) or ``answer_key``: an orchestrator that finishes with the task's ground truth,
the check that the runner, the scorer and the reporting agree (it scores 100%).

Outputs in ``out_dir``: ``episodes.jsonl`` (the trajectory store), ``results.json`` / ``results.md`` (success by
level with Wilson intervals, pass^N, pass@N, tokens per pair; then the judged table), ``success.png``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from porch_jax.backends import ChatRequest, Sampling, ScriptedBackend
from porch_jax.backends.spec import EndpointSpec
from porch_jax.envs.gaia import CorpusFetcher, CorpusSearch, GaiaEnvironment, GaiaTask
from porch_jax.envs.gaia.text import Page
from porch_jax.eval.plots import plot_group_success
from porch_jax.protocol import Finish, render_action
from porch_jax.rollout import BUDGETS, Engine, EngineConfig, run_episodes, system_config
from porch_jax.rollout.pairs import Pair, make_pairs, markdown_table, record_outcome, results_by, write_results
from porch_jax.trajectories import EpisodeRecord, TrajectoryStore
from porch_jax.typed_config import from_dict

POLICIES = ("llm", "answer_key")
EQUIVALENCE_PROMPT = (
    "Question: {question}\nGround-truth answer: {truth}\nSubmitted answer: {answer}\n"
    "Does the submitted answer mean the same as the ground truth? Reply with one word: yes or no."
)


@dataclasses.dataclass(frozen=True)
class GaiaRunConfig:
    out_dir: str
    runs: int = 1  # each task N times
    concurrency: int = 4  # episodes at once
    policy: str = "llm"
    system: str = "proactive"
    orchestrator: EndpointSpec = EndpointSpec()
    executor: EndpointSpec = EndpointSpec()  # empty: the orchestrator's endpoint
    judge: EndpointSpec = EndpointSpec()  # empty: exact match only
    judge_max_tokens: int = 8
    episode_timeout_s: float = 1800.0
    # EngineConfig fields over GAIA's (the paper's budgets: 300 steps in total, up to 10 sub-agents, 30 steps each),
    # e.g. {"orchestrator_sampling": {"max_tokens": 128}, "budgets": {"total_steps": 40}}.
    engine: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy: one of {POLICIES}, got {self.policy!r}")
        if self.runs < 1 or self.concurrency < 1:
            raise ValueError(f"runs and concurrency must be >= 1, got runs={self.runs}, concurrency={self.concurrency}")
        if self.policy == "llm" and not self.orchestrator.configured:
            raise ValueError("policy 'llm' needs an orchestrator endpoint (its model, and urls for a served one)")

    def engine_config(self) -> EngineConfig:
        return system_config(
            self.system, from_dict(EngineConfig, self.engine, path="engine", base=EngineConfig(budgets=BUDGETS["gaia"]))
        )


def _answer_key(request: ChatRequest) -> str:
    return render_action(Finish(request.state.task.truth))


def _backends(cfg: GaiaRunConfig, seed: int) -> tuple[Any, Any]:
    if cfg.policy == "answer_key":
        never = ScriptedBackend(lambda request: "the answer-key policy delegates nothing")
        return ScriptedBackend(_answer_key), never
    orchestrator = cfg.orchestrator.backend(seed=seed)
    executor = (cfg.executor if cfg.executor.configured else cfg.orchestrator).backend(seed=seed)
    return orchestrator, executor


async def judge_equivalent(judge: Any, task: GaiaTask, answer: str, max_tokens: int) -> dict[str, Any]:
    """The judge backend's yes/no on an answer exact match rejected (a backend outage raises: the pair is retried)."""
    prompt = EQUIVALENCE_PROMPT.format(question=task.question, truth=task.truth, answer=answer)
    result = await judge.chat(
        ChatRequest(
            [{"role": "user", "content": prompt}],
            sampling=Sampling(temperature=0.0, max_tokens=max_tokens, logprobs=False),
            role="judge",
        )
    )
    word = re.match(r"\W*(\w+)", result.text)
    return {"equivalent": bool(word) and word[1].lower() == "yes", "reply": result.text[:200]}


def _judged(record: EpisodeRecord) -> bool:
    return record.outcome.success or bool(record.meta.get("judge", {}).get("equivalent"))


def _level(record: EpisodeRecord) -> list[str]:
    level = record.meta.get("gaia", {}).get("level")
    return [f"level {level}"] if level is not None else []


async def run_gaia(
    cfg: GaiaRunConfig,
    tasks: Sequence[GaiaTask],
    *,
    search: Any,
    fetcher: Any,
    progress: bool = True,
) -> dict[str, Any]:
    """Every (task, run) pair not finished in ``out_dir/episodes.jsonl``; then the tables from the whole store
    (by GAIA level); returns the results JSON's content."""
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    store = TrajectoryStore(out / "episodes.jsonl")
    engine_cfg = cfg.engine_config()
    orchestrator, executor = _backends(cfg, seed=0)
    judge = cfg.judge.backend() if cfg.judge.configured else None
    engine = Engine(lambda: GaiaEnvironment(search, fetcher), orchestrator, executor, engine_cfg)

    async def episode(pair: Pair) -> EpisodeRecord:
        record = await engine.run(pair.task, seed=pair.run - 1, episode_id=pair.episode_id)
        record.meta["gaia"] = {"task_id": pair.task_id, "run": pair.run, "level": pair.task.level}
        answer = record.meta.get("answer")
        if judge is not None and not record.outcome.success and not record.outcome.retryable and answer:
            record.meta["judge"] = await judge_equivalent(judge, pair.task, str(answer), cfg.judge_max_tokens)
        return record

    pairs = make_pairs(tasks, cfg.runs, lambda t: t.task_id)
    summary = await run_episodes(
        pairs,
        episode,
        store,
        cfg.concurrency,
        progress,
        key=lambda p: p.episode_id,
        episode_timeout_s=cfg.episode_timeout_s,
    )
    store.close()
    return report(cfg, store, wall_s=summary.wall_s)


def report(cfg: GaiaRunConfig, store: TrajectoryStore, *, wall_s: float = 0.0) -> dict[str, Any]:
    """The tables and plot of a run directory, from its store alone (so they rebuild without rerunning)."""
    records = store.read()
    retryable = store.retryable_ids()
    official = results_by([record_outcome(r, _level(r)) for r in records], open_retryable=len(retryable))
    judged = results_by([record_outcome(r, _level(r), _judged(r)) for r in records], open_retryable=len(retryable))
    meta = {"policy": cfg.policy, "system": cfg.system, "runs": cfg.runs, "wall_s": round(wall_s, 1)}
    extra = {"judged": judged} if cfg.judge.configured else {}
    path = write_results(cfg.out_dir, official, meta, title="GAIA (official scorer)", extra=extra)
    if cfg.judge.configured:
        with open(Path(cfg.out_dir, "results.md"), "a") as f:
            f.write("\nExact match or judged equivalent (the judge's reading, not the official score):\n\n")
            f.write(markdown_table(judged, title="GAIA (scorer or judge)"))
    plot_group_success(official, Path(cfg.out_dir, "success.png"), "GAIA success (95% CI)")
    return json.loads(path.read_text())


def corpus_from_jsonl(path: str | Path) -> list[Page]:
    """An offline search corpus: one JSON object per line with ``url``, ``title`` and ``html``."""
    pages = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            pages.append(Page(str(row["url"]), str(row["title"]), str(row["html"])))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{n}: a corpus page needs url, title and html ({type(e).__name__}: {e})") from None
    return pages


def offline_tools(corpus: str | Path) -> tuple[CorpusSearch, CorpusFetcher]:
    pages = corpus_from_jsonl(corpus)
    return CorpusSearch(pages), CorpusFetcher(pages)


def run(cfg: GaiaRunConfig, tasks: Sequence[GaiaTask], **kwargs: Any) -> dict[str, Any]:
    return asyncio.run(run_gaia(cfg, tasks, **kwargs))
