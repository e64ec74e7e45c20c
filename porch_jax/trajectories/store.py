"""Append-only JSONL trajectory store: one episode per line, crash-safe.

Durability: each ``append`` writes whole lines with one ``os.write`` then ``fsync``es, so a crash
loses at most the episodes not yet appended. A kill during a write can leave a *torn last line*
(bytes without the final newline). Policy: readers skip a torn final line with a warning (it was
never acknowledged as written); the writer, on opening, moves the torn bytes to ``<path>.torn`` and
truncates them, so the next line starts clean. A complete (newline-terminated) line that does not
parse is corruption, not a crash artefact: readers raise ``RecordError`` with file, line and field.

One writer per file: the writer holds an exclusive ``flock`` so two runs cannot interleave lines.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from porch_jax.trajectories.schema import EpisodeRecord, RecordError

log = logging.getLogger(__name__)


class TrajectoryStore:
    """``append`` / ``append_many`` (durable), ``read`` / iteration (validated), ``episode_ids``."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._fd: int | None = None

    # ---- writing ---------------------------------------------------------------------------------
    def _open_writer(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RuntimeError(f"{self.path} is being written by another TrajectoryStore or process") from None
            self._repair_torn_tail(fd)
            self._fd = fd
        return self._fd

    def _repair_torn_tail(self, fd: int) -> None:
        size = os.fstat(fd).st_size
        if size == 0:
            return
        # Find the last newline by reading backwards in chunks.
        end, chunk = size, 1 << 16
        while end > 0:
            start = max(0, end - chunk)
            data = os.pread(fd, end - start, start)
            nl = data.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            end = start
        else:
            keep = 0
        if keep == size:
            return
        torn = os.pread(fd, size - keep, keep)
        with open(f"{self.path}.torn", "ab") as f:
            f.write(torn + b"\n")
        os.ftruncate(fd, keep)
        os.fsync(fd)
        log.warning("%s: removed a torn last line (%d bytes, from an interrupted write); saved to %s.torn",
                    self.path, len(torn), self.path)

    def append(self, record: EpisodeRecord) -> None:
        self.append_many([record])

    def append_many(self, records: Iterable[EpisodeRecord]) -> None:
        """Validate all, then write them as complete lines in one write and fsync (one durability point)."""
        data = b"".join(encode_record(r) for r in records)
        if not data:
            return
        fd = self._open_writer()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # also releases the flock
            self._fd = None

    def __enter__(self) -> TrajectoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    # ---- reading ---------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[EpisodeRecord]:
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                if not raw.endswith(b"\n"):
                    log.warning("%s:%d: ignoring a torn last line (%d bytes, no newline): an interrupted write",
                                self.path, lineno, len(raw))
                    return
                yield _decode(raw, str(self.path), lineno)

    def read(self) -> list[EpisodeRecord]:
        return list(self)

    def episode_ids(self) -> set[str]:
        return {r.episode_id for r in self}


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
