"""The attribution job: every decision of a trajectory store through a GRM backend, resumably.

Output: an append-only JSONL store with one row per decision, keyed by (episode_id, index):
``{"episode_id", "index", "attributable", "hint", "status", "detail", "reply", "attempts"}``. ``status`` is
"ok" (a parsed judgement), "error" (a malformed reply or a failed call: recorded, not attributable,
with the reason in ``detail``: "malformed: ..." or "backend: ...") or "skipped" (a decision no sub-agent feedback
followed: finish, stop, or an action that did not parse). A malformed reply is asked again ``retries`` times (the
paper's reading: once; the retry samples at ``retry_temperature`` at least, so a greedy GRM can answer otherwise)
and then read as FLAG=false. The rows are what ``rows.decisions.hint_table`` reads.

Resume: keys already in the output are not judged again, so rerunning after a crash or a kill
finishes the rest and never writes a key twice. Rows are written by one writer in whole lines,
each batch with one ``fsync``; a torn last line (a kill mid-write) is moved to ``<path>.torn`` when
the writer opens the file, and the reader ignores it, as ``trajectories.TrajectoryStore`` does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from porch_jax.attribution.grm import (
    AttributionUnit,
    GRMReplyError,
    grm_request,
    parse_reply,
)
from porch_jax.backends import Backend, Sampling
from porch_jax.backends.spec import EndpointSpec
from porch_jax.protocol import DELEGATE, REVISE
from porch_jax.trajectories import DecisionKey as Key
from porch_jax.trajectories import DecisionRecord, EpisodeRecord, TrajectoryStore
from porch_jax.trajectories.jsonl import AppendOnlyJsonl
from porch_jax.typed_config import check, claim_run_dir, resumable

log = logging.getLogger(__name__)


class AttributionStore(AppendOnlyJsonl):
    """Append-only JSONL of attribution rows; one writer at a time (``flock``)."""

    writer_name = "another attribution job"

    def append_many(self, rows: Iterable[dict[str, Any]]) -> None:
        self.write_lines(
            b"".join(json.dumps(r, ensure_ascii=True, separators=(",", ":")).encode() + b"\n" for r in rows)
        )

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for lineno, raw in self.raw_lines():
            try:
                row = json.loads(raw)
                str(row["episode_id"]), int(row["index"]), bool(row["attributable"]), str(row["hint"])
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{self.path}:{lineno}: bad attribution row ({e!r})") from None
            yield row

    def read(self) -> list[dict[str, Any]]:
        return list(self)

    def keys(self) -> set[Key]:
        return {(r["episode_id"], r["index"]) for r in self}


@dataclass(frozen=True)
class AttributionConfig:
    """One attribution run (``python -m launch.attribute``): the trajectory store to judge, the output store (a rerun
    resumes it), the GRM's endpoint (any OpenAI-compatible provider; OPOD's GRM is the frozen base model, served;
    its key is read from the variable the endpoint names), how it samples, and the calls in flight."""

    records: str
    out: str = resumable()
    grm: EndpointSpec
    sampling: Sampling = Sampling(max_tokens=128)
    concurrency: int = resumable(16)
    retries: int = 1

    def __post_init__(self):
        check(self.retries >= 0, "retries", f"must be >= 0, got {self.retries}")
        check(self.grm.configured, "grm.model", "the GRM's endpoint names no model")
        check(self.concurrency >= 1, "concurrency", f"must be >= 1, got {self.concurrency}")
        check(self.records != self.out, "out", "must differ from records (the trajectories are read, never written)")


async def run_job(cfg: AttributionConfig, *, progress: bool = True) -> JobSummary:
    """The attribution job of ``cfg``: every decision of ``cfg.records`` not yet in ``cfg.out`` through the GRM.
    ``<out>.config.json`` records the config; a rerun into the same output with another one (but for its
    `resumable` fields: another GRM, records or sampling) is refused, naming the keys that differ."""
    out = Path(cfg.out)
    claim_run_dir(out.parent, cfg, file=f"{out.name}.config.json")
    grm = cfg.grm.backend()
    try:
        with AttributionStore(cfg.out) as out:
            return await attribute_store(
                TrajectoryStore(cfg.records).read(),
                grm,
                out,
                concurrency=cfg.concurrency,
                sampling=cfg.sampling,
                progress=progress,
                retries=cfg.retries,
            )
    finally:
        await grm.aclose()


@dataclass
class JobSummary:
    total: int  # decisions in the trajectory store
    skipped_done: int  # already in the output (resumed)
    judged: int  # GRM calls made by this run
    attributable: int
    errors: int
    wall_s: float


def needs_judgement(decision: DecisionRecord) -> bool:
    """Only a delegate or revise is followed by a sub-agent's feedback o_t."""
    return decision.action is not None and decision.action.get("name") in (DELEGATE, REVISE)


def _row(
    episode_id: str,
    index: int,
    attributable: bool,
    hint: str,
    status: str,
    detail: str = "",
    reply: str = "",
    attempts: int = 0,
) -> dict[str, Any]:
    return {
        "episode_id": episode_id,
        "index": index,
        "attributable": attributable,
        "hint": hint,
        "status": status,
        "detail": detail,
        "reply": reply,
        "attempts": attempts,
    }


RETRY_TEMPERATURE = 0.7


async def _judge(
    backend: Backend, episode_id: str, decision: DecisionRecord, sampling: Sampling, retries: int = 1
) -> dict[str, Any]:
    if not needs_judgement(decision):
        name = decision.action.get("name") if decision.action else "invalid action"
        return _row(episode_id, decision.index, False, "", "skipped", f"no sub-agent feedback after {name}")
    unit = AttributionUnit.of(decision)
    for attempt in range(retries + 1):
        asked = sampling if not attempt else replace(sampling, temperature=max(sampling.temperature, RETRY_TEMPERATURE))
        try:
            result = await backend.chat(grm_request(unit, asked))
        except Exception as e:  # a failed call is recorded, never silently dropped
            detail = f"backend: {type(e).__name__}: {str(e)[:200]}"
            return _row(episode_id, decision.index, False, "", "error", detail, attempts=attempt + 1)
        try:
            a = parse_reply(result.text)
        except GRMReplyError as e:
            if attempt < retries:
                continue
            detail = f"malformed: {str(e)[:300]}"
            return _row(episode_id, decision.index, False, "", "error", detail, result.text[:2000], attempt + 1)
        return _row(
            episode_id, decision.index, a.attributable, a.hint, "ok", reply=result.text[:2000], attempts=attempt + 1
        )
    raise AssertionError("unreachable")


async def attribute_store(
    trajectories: TrajectoryStore | Iterable[EpisodeRecord],
    backend: Backend,
    out: AttributionStore,
    *,
    concurrency: int = 16,
    sampling: Sampling = Sampling(max_tokens=128),
    progress: bool = True,
    retries: int = 1,
) -> JobSummary:
    """Judges every decision not yet in ``out``; returns counts. Raises only if writing fails."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    t0 = time.monotonic()
    done = await asyncio.to_thread(out.keys)
    todo, total = [], 0
    for ep in trajectories:
        for d in ep.decisions:
            total += 1
            if (ep.episode_id, d.index) not in done:
                todo.append((ep.episode_id, d))
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    counts = {"judged": 0, "attributable": 0, "errors": 0}
    it = iter(todo)

    async def worker() -> None:
        for episode_id, d in it:
            queue.put_nowait(await _judge(backend, episode_id, d, sampling, retries))

    async def writer() -> None:
        last = time.monotonic()
        while True:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            rows = [r for r in batch if r is not None]
            await asyncio.to_thread(out.append_many, rows)
            for r in rows:
                counts["judged"] += r["status"] != "skipped"
                counts["attributable"] += r["attributable"]
                counts["errors"] += r["status"] == "error"
            if progress and (time.monotonic() - last > 5 or None in batch):
                last = time.monotonic()
                print(
                    f"[attribution] {sum(counts.values()) and counts['judged']} judged, {counts['attributable']}"
                    f" attributable, {counts['errors']} errors ({len(todo)} to do, {len(done)} done earlier)",
                    file=sys.stderr,
                    flush=True,
                )
            if None in batch:
                return

    workers = [asyncio.create_task(worker()) for _ in range(min(concurrency, max(len(todo), 1)))]
    writing = asyncio.create_task(writer())
    try:
        await asyncio.gather(*workers)
    finally:
        for w in workers:
            w.cancel()
        queue.put_nowait(None)
        await writing
    return JobSummary(
        total, total - len(todo), counts["judged"], counts["attributable"], counts["errors"], time.monotonic() - t0
    )
