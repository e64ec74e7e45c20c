"""An append-only JSONL file with one writer, durable batches and a torn-tail policy.

Shared by the trajectory store and the attribution job, whose rows differ but whose crash story must
not: each batch of lines is one ``os.write`` then ``fsync`` (a crash loses only what was not yet
appended); a kill during a write can leave a *torn last line* (bytes without the final newline), which
readers skip with a warning (it was never acknowledged) and the writer, on opening, moves to
``<path>.torn`` and truncates, so the next line starts clean. One writer per file: the writer holds an
exclusive ``flock``, so two runs cannot interleave lines.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from porch_jax import faults

log = logging.getLogger(__name__)


def torn_cut(data: bytes) -> int:
    """Where a crash test tears a batch of lines: halfway into its last line, so the torn write always leaves a
    partial line behind (half of the batch's bytes could end exactly on a newline, a clean crash instead)."""
    start = data.rfind(b"\n", 0, len(data) - 1) + 1
    return start + (len(data) - start) // 2


class AppendOnlyJsonl:
    """Subclasses turn objects into lines (``write_lines``) and lines back (``raw_lines``)."""

    writer_name = "another writer"  # who else may hold the lock, for the error message

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._fd: int | None = None

    def _writer(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RuntimeError(f"{self.path} is being written by {self.writer_name}") from None
            self._repair_torn_tail(fd)
            self._fd = fd
        return self._fd

    def _repair_torn_tail(self, fd: int) -> None:
        size = os.fstat(fd).st_size
        end, chunk, keep = size, 1 << 16, 0
        while end > 0:  # the last newline, reading backwards in chunks (stores grow to GBs)
            start = max(0, end - chunk)
            nl = os.pread(fd, end - start, start).rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            end = start
        if keep == size:
            return
        torn = os.pread(fd, size - keep, keep)
        with open(f"{self.path}.torn", "ab") as f:
            f.write(torn + b"\n")
        os.ftruncate(fd, keep)
        os.fsync(fd)
        log.warning(
            "%s: removed a torn last line (%d bytes, from an interrupted write); saved to %s.torn",
            self.path,
            len(torn),
            self.path,
        )

    def write_lines(self, data: bytes) -> None:
        """Whole newline-terminated lines, written at once and fsynced (one durability point)."""
        if not data:
            return
        fd = self._writer()
        if faults.due(self.path.name):  # a fault test's crash mid-write (porch_jax/faults.py): a torn line, then kill
            os.write(fd, data[: torn_cut(data)])
            os.fsync(fd)
            faults.crash()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)

    def raw_lines(self) -> Iterator[tuple[int, bytes]]:
        """(line number, bytes) of every complete line; a torn last line is skipped with a warning."""
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                if not raw.endswith(b"\n"):
                    log.warning(
                        "%s:%d: ignoring a torn last line (%d bytes, no newline): an interrupted write",
                        self.path,
                        lineno,
                        len(raw),
                    )
                    return
                yield lineno, raw

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # also releases the flock
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
