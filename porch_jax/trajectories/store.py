"""Append-only JSONL trajectory store: one episode per line, crash-safe.

Durability: each ``append`` writes whole lines with one ``os.write`` then ``fsync``es, so a crash
loses at most the episodes not yet appended. A kill during a write can leave a *torn last line*
(bytes without the final newline). Policy: readers skip a torn final line with a warning (it was
never acknowledged as written); the writer, on opening, moves the torn bytes to ``<path>.torn`` and
truncates them, so the next line starts clean. A complete (newline-terminated) line that does not
parse is corruption, not a crash artefact: readers raise ``RecordError`` with file, line and field.

One writer per file: the writer holds an exclusive ``flock`` so two runs cannot interleave lines.
(The file mechanics live in ``trajectories.jsonl``, shared with the attribution job.)

Finished and retryable records: an episode cut short because its backend could not answer is recorded with
``outcome.retryable`` (a placeholder, so the attempt and its cause stay on disk), and a resumed run plays it again,
appending its next record. So one episode id may have several lines: retryable attempts, then at most one finished
record (the runner never replays a finished episode). ``read`` and ``episode_ids`` see finished episodes only (what
training, reports and resume take); iterating the store yields every line, attempts included.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from porch_jax.trajectories.jsonl import AppendOnlyJsonl
from porch_jax.trajectories.schema import EpisodeRecord, RecordError


class TrajectoryStore(AppendOnlyJsonl):
    """``append`` / ``append_many`` (durable); ``read`` and ``episode_ids`` (finished episodes), ``retryable_ids``
    (episodes a rerun plays again) and iteration (every line), all validated."""

    writer_name = "another TrajectoryStore or process"

    def append(self, record: EpisodeRecord) -> None:
        self.append_many([record])

    def append_many(self, records: Iterable[EpisodeRecord]) -> None:
        """Validate all, then write them as complete lines in one write and fsync (one durability point)."""
        self.write_lines(b"".join(encode_record(r) for r in records))

    def __iter__(self) -> Iterator[EpisodeRecord]:
        for lineno, raw in self.raw_lines():
            yield _decode(raw, str(self.path), lineno)

    def read(self) -> list[EpisodeRecord]:
        """The finished records (``outcome.retryable`` False), in file order; retryable attempts are left out."""
        return [r for r in self if not r.outcome.retryable]

    def episode_ids(self) -> set[str]:
        """The ids of finished episodes: what a resumed run skips."""
        return {r.episode_id for r in self.read()}

    def retryable_ids(self) -> set[str]:
        """The ids with retryable attempts and no finished record: what a resumed run plays again."""
        records = list(self)
        finished = {r.episode_id for r in records if not r.outcome.retryable}
        return {r.episode_id for r in records if r.outcome.retryable} - finished


def encode_record(record: EpisodeRecord) -> bytes:
    """The record as one JSONL line, validated by reading it back: a record that the reader would
    reject (a wrong type in any field, a non-JSON value) raises here, before anything is written."""
    if not isinstance(record, EpisodeRecord):
        raise TypeError(f"expected EpisodeRecord, got {type(record).__name__}")
    # ASCII-escaped so any str (even lone surrogates from a broken tokenizer decode) is storable.
    try:
        line = json.dumps(record.to_dict(), ensure_ascii=True, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise RecordError(f"not JSON-serializable ({e})") from None
    EpisodeRecord.from_dict(json.loads(line))
    return line.encode("ascii") + b"\n"


def _decode(raw: bytes, path: str, lineno: int) -> EpisodeRecord:
    try:
        d = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise RecordError(f"not valid JSON ({e})", path=path, line=lineno) from None
    try:
        return EpisodeRecord.from_dict(d)
    except RecordError as e:
        raise e.at(path, lineno) from None
