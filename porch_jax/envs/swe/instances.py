"""SWE-bench Verified instances: the local partial copy, and the full rows it lacks.

The local file (``../shared/data/swe_bench_verified``, see its SOURCE.md) holds only instance_id,
repo, base_commit, problem_statement and the gold patch: enough to list tasks and prompt agents,
not to grade locally (no test_patch or FAIL_TO_PASS/PASS_TO_PASS). ``missing_fields`` names what it
lacks against the hub's rows (``HUB_FIELDS``) and ``load_verified`` logs it; ``load_full`` fills
those fields in by instance_id, from a JSONL in the hub's row format or from the hub dataset itself.
Fields beyond the hub's (swebench 5.0.2 rows also carry ``image``, ``eval_script``, ``log_parser``
and ``eval_type``) are kept in ``extra``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

DEFAULT_LOCAL = Path(__file__).resolve().parents[4] / "shared/data/swe_bench_verified/swebench_verified.jsonl"
HUB_NAME = "princeton-nlp/SWE-bench_Verified"
# How an instance is graded: "docker" (swebench's official images), "local" (a checkout here), "auto" (docker
# where an engine answers).
Grader = Literal["auto", "docker", "local"]
GRADERS = get_args(Grader)
# The fields of a row of HUB_NAME (split test).
HUB_FIELDS = (
    "repo",
    "instance_id",
    "base_commit",
    "patch",
    "test_patch",
    "problem_statement",
    "hints_text",
    "created_at",
    "version",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "environment_setup_commit",
)
_log = logging.getLogger(__name__)
_Rows = list[tuple[int, dict[str, Any]]]  # (line number in its file, row)


def _tests(value: Any) -> tuple[str, ...]:
    if value in (None, ""):
        return ()
    return tuple(json.loads(value) if isinstance(value, str) else value)


@dataclass(frozen=True)
class SWEInstance:
    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str = ""  # the gold patch
    test_patch: str = ""
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()
    version: str = ""
    environment_setup_commit: str = ""
    hints_text: str = ""
    created_at: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def gradable(self) -> bool:
        """Whether the tests that decide resolution are known (not in the partial local file)."""
        return bool(self.test_patch and self.fail_to_pass)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SWEInstance:
        missing = [k for k in ("instance_id", "repo", "base_commit", "problem_statement") if not d.get(k)]
        if missing:
            raise ValueError(f"SWE-bench instance {d.get('instance_id', '?')!r} lacks {missing}")
        return cls(
            instance_id=d["instance_id"],
            repo=d["repo"],
            base_commit=d["base_commit"],
            problem_statement=d["problem_statement"],
            patch=d.get("patch") or "",
            test_patch=d.get("test_patch") or "",
            fail_to_pass=_tests(d.get("FAIL_TO_PASS")),
            pass_to_pass=_tests(d.get("PASS_TO_PASS")),
            version=str(d.get("version") or ""),
            environment_setup_commit=d.get("environment_setup_commit") or "",
            hints_text=d.get("hints_text") or "",
            created_at=str(d.get("created_at") or ""),
            extra={k: v for k, v in d.items() if k not in HUB_FIELDS},
        )

    def to_swebench(self) -> dict[str, Any]:
        """The row as swebench expects it (test lists as JSON strings)."""
        return {
            **self.extra,
            "instance_id": self.instance_id,
            "repo": self.repo,
            "base_commit": self.base_commit,
            "problem_statement": self.problem_statement,
            "patch": self.patch,
            "test_patch": self.test_patch,
            "FAIL_TO_PASS": json.dumps(list(self.fail_to_pass)),
            "PASS_TO_PASS": json.dumps(list(self.pass_to_pass)),
            "version": self.version,
            "environment_setup_commit": self.environment_setup_commit,
            "hints_text": self.hints_text,
            "created_at": self.created_at,
        }


def load_verified(path: str | Path | None = None) -> list[SWEInstance]:
    """The local partial copy (``$PORCH_SWE_VERIFIED`` or the shared data folder); errors name the line, and a
    warning names the hub fields it lacks, so a run that cannot grade says why before it starts."""
    path = _local_path(path)
    rows = _read_rows(path)
    missing = _missing(rows)
    if missing:
        _log.warning(
            "%s lacks %s: its instances list and prompt but cannot be graded locally; load_full() merges them in",
            path,
            ", ".join(missing),
        )
    return _instances(path, rows)


def missing_fields(path: str | Path | None = None) -> tuple[str, ...]:
    """The hub fields (``HUB_FIELDS``, in that order) that some row of the local copy lacks; () when none."""
    return _missing(_read_rows(_local_path(path)))


def load_full(
    path: str | Path | None = None,
    *,
    rows_path: str | Path | None = None,
    name: str = HUB_NAME,
    split: str = "test",
) -> list[SWEInstance]:
    """The local copy's instances with the fields it lacks merged in by instance_id (the full row wins), from
    ``rows_path`` (a JSONL in the hub's row format) or, without one, from the hub when ``hub_available()``.

    Raises ValueError naming the missing fields when neither source is there. Instances with no full row stay
    partial and are named in a warning, so one absent row does not hide the other 499."""
    path = _local_path(path)
    rows = _read_rows(path)
    missing = _missing(rows)
    if missing:
        rows = _merge(rows, _full_rows(missing, rows_path, name, split))
    return _instances(path, rows)


def hub_available() -> bool:
    """Whether full rows may come from the hub: ``datasets`` importable and the hub not switched off
    (``HF_HUB_OFFLINE=1``, which is also how tests keep it from downloading)."""
    return importlib.util.find_spec("datasets") is not None and os.environ.get("HF_HUB_OFFLINE") != "1"


def load_hub(name: str = HUB_NAME, split: str = "test") -> list[SWEInstance]:
    """The full dataset from the Hugging Face hub (needs network or a warm cache)."""
    return [SWEInstance.from_dict(row) for row in _hub_rows(name, split)]


def _hub_rows(name: str, split: str) -> list[dict[str, Any]]:
    import datasets

    return [dict(row) for row in datasets.load_dataset(name, split=split)]


def _full_rows(
    missing: tuple[str, ...], rows_path: str | Path | None, name: str, split: str
) -> Iterable[Mapping[str, Any]]:
    if rows_path is not None:
        return [row for _, row in _read_rows(Path(rows_path))]
    if hub_available():
        return _hub_rows(name, split)
    raise ValueError(
        f"the local SWE-bench list lacks {', '.join(missing)} and no full rows are reachable: pass rows_path "
        f"(a JSONL in {name}'s row format) or make the hub reachable (install datasets, unset HF_HUB_OFFLINE=1)"
    )


def _merge(rows: _Rows, full: Iterable[Mapping[str, Any]]) -> _Rows:
    by_id = {row["instance_id"]: row for row in full}
    merged = [(n, {**row, **by_id.get(row.get("instance_id"), {})}) for n, row in rows]
    partial = [row.get("instance_id") for _, row in merged if not set(HUB_FIELDS) <= row.keys()]
    if partial:
        _log.warning(
            "%d of %d instances have no full row and stay partial: %s%s",
            len(partial),
            len(merged),
            ", ".join(map(str, partial[:5])),
            " ..." if len(partial) > 5 else "",
        )
    return merged


def _missing(rows: _Rows) -> tuple[str, ...]:
    return tuple(f for f in HUB_FIELDS if any(f not in row for _, row in rows))


def _local_path(path: str | Path | None) -> Path:
    return Path(path or os.environ.get("PORCH_SWE_VERIFIED", DEFAULT_LOCAL))


def _read_rows(path: Path) -> _Rows:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append((n, json.loads(line)))
                except ValueError as e:
                    raise ValueError(f"{path}:{n}: {e}") from e
    return rows


def _instances(path: Path, rows: _Rows) -> list[SWEInstance]:
    out = []
    for n, row in rows:
        try:
            out.append(SWEInstance.from_dict(row))
        except (ValueError, TypeError, AttributeError) as e:
            raise ValueError(f"{path}:{n}: {e}") from e
    return out
