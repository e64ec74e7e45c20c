"""SWE-bench Verified instances: the local partial copy, or the full dataset from the hub.

The local file (``../shared/data/swe_bench_verified``, see its SOURCE.md) holds only instance_id,
repo, base_commit, problem_statement and the gold patch: enough to list tasks and prompt agents,
not to grade (no test_patch or FAIL_TO_PASS/PASS_TO_PASS). The hub dataset has every field; in the
swebench 5.0.2 format a row also carries ``image``, ``eval_script``, ``log_parser`` and ``eval_type``,
kept in ``extra`` for the docker path.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_LOCAL = Path(__file__).resolve().parents[4] / "shared/data/swe_bench_verified/swebench_verified.jsonl"
HUB_NAME = "princeton-nlp/SWE-bench_Verified"
_CORE = (
    "instance_id",
    "repo",
    "base_commit",
    "problem_statement",
    "patch",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "version",
    "environment_setup_commit",
    "hints_text",
)


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
            d["instance_id"],
            d["repo"],
            d["base_commit"],
            d["problem_statement"],
            d.get("patch") or "",
            d.get("test_patch") or "",
            _tests(d.get("FAIL_TO_PASS")),
            _tests(d.get("PASS_TO_PASS")),
            str(d.get("version") or ""),
            d.get("environment_setup_commit") or "",
            d.get("hints_text") or "",
            {k: v for k, v in d.items() if k not in _CORE},
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
        }


def load_verified(path: str | Path | None = None) -> list[SWEInstance]:
    """The local partial copy (``$PORCH_SWE_VERIFIED`` or the shared data folder); errors name the line."""
    path = Path(path or os.environ.get("PORCH_SWE_VERIFIED", DEFAULT_LOCAL))
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(SWEInstance.from_dict(json.loads(line)))
                except (ValueError, TypeError) as e:
                    raise ValueError(f"{path}:{n}: {e}") from e
    return out


def load_hub(name: str = HUB_NAME, split: str = "test") -> list[SWEInstance]:
    """The full dataset from the Hugging Face hub (needs network or a warm cache)."""
    import datasets

    return [SWEInstance.from_dict(dict(row)) for row in datasets.load_dataset(name, split=split)]
