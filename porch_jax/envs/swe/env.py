"""SWE-bench as an ``Environment``: a repository checkout with view / edit / search / bash tools.

The tools are the usual software-engineering set (AOrchestra's SWE sub-agents, mini-SWE): paths are
confined to the checkout (no ``..`` or symlink escapes), ``bash`` runs in the sandbox (the checkout
is its only writable place), observations are capped. ``score`` extracts the checkout's diff and
grades it with swebench: on the official images when a docker engine answers, else locally when the
instance has tests (``SWEConfig.grader``); SWE-bench has no asynchronous events. ``SWEConfig`` also
holds the sub-agents' tool set and the paper's SWE-bench step budgets.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from porch_jax.envs.base import Environment, Score
from porch_jax.envs.sandbox import Limits, run_command
from porch_jax.envs.swe.instances import GRADERS, HUB_NAME, Grader, SWEInstance
from porch_jax.envs.swe.repo import extract_patch
from porch_jax.typed_config import check

_MAX_CHARS = 8000
_VIEW_LINES = 200
_MAX_MATCHES = 50
BASH_LIMITS = Limits(wall_s=120.0, cpu_s=120, memory_mb=4096, max_processes=64, max_file_mb=256, max_open_files=512)


def _schema(name: str, description: str, props: dict[str, Any], required: tuple[str, ...]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": list(required)},
        },
    }


_S, _I = {"type": "string"}, {"type": "integer", "minimum": 1}
SCHEMAS = {
    "view": _schema(
        "view",
        "Show a file's numbered lines (a range of at most 200) or a directory listing.",
        {"path": _S, "start": _I, "end": _I},
        ("path",),
    ),
    "edit": _schema(
        "edit",
        "Replace the unique exact text `old` with `new` in a file; empty `old` creates the file.",
        {"path": _S, "old": _S, "new": _S},
        ("path", "old", "new"),
    ),
    "search": _schema(
        "search",
        "Regex search in files under `path` (default: the repository): file:line: text.",
        {"pattern": _S, "path": _S},
        ("pattern",),
    ),
    "bash": _schema(
        "bash", "Run a bash command in the repository root (sandboxed, no network).", {"command": _S}, ("command",)
    ),
}
TOOLS = tuple(SCHEMAS)


@dataclass(frozen=True)
class SWEConfig:
    """How a SWE-bench episode is set up and graded.

    ``total_steps`` (500) and ``agent_steps`` (50) are the POrchestra paper's SWE-bench budgets: sub-agent
    steps per task in all, and per sub-agent (``rollout.config.BUDGETS["swe"]``; a launcher hands them to
    ``EngineConfig.budgets``: envs sit below the engine).
    ``subagent_tools`` is the tool set the orchestrator may give its sub-agents (default: all four).
    ``grader``: "auto" grades on the official docker images when an engine answers, else locally; "docker"
    and "local" force one. ``dataset_name`` is the harness's --dataset_name (a hub id, or a .json/.jsonl of
    full rows) for docker grading."""

    subagent_tools: tuple[str, ...] = TOOLS
    total_steps: int = 500
    agent_steps: int = 50
    grader: Grader = "auto"
    dataset_name: str = HUB_NAME

    def __post_init__(self) -> None:
        unknown = [t for t in self.subagent_tools if t not in SCHEMAS]
        check(bool(self.subagent_tools) and not unknown, "subagent_tools", f"must be a non-empty subset of {TOOLS}")
        for name in ("total_steps", "agent_steps"):
            value = getattr(self, name)
            check(type(value) is int and value > 0, name, f"must be a positive int, got {value!r}")
        check(
            self.agent_steps <= self.total_steps,
            "agent_steps",
            f"must be <= total_steps ({self.total_steps}), got {self.agent_steps}",
        )
        check(self.grader in GRADERS, "grader", f"must be one of {GRADERS}, got {self.grader!r}")


@dataclass(frozen=True)
class SWETask:
    """One instance on a prepared checkout; ``source`` is the repository to grade against (a clean
    clone is made there), ``grading`` extra keyword arguments for ``grade_local``."""

    instance: SWEInstance
    repo_dir: str
    source: str | None = None
    grading: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0

    @property
    def task_id(self) -> str:
        return self.instance.instance_id

    @property
    def text(self) -> str:
        return (
            f"Resolve this issue in {self.instance.repo} (checked out in the working directory):\n"
            f"{self.instance.problem_statement}"
        )


class SWEEnvironment(Environment):
    name = "swe"

    def __init__(
        self,
        config: SWEConfig = SWEConfig(),
        *,
        bash_limits: Limits = BASH_LIMITS,
        bash_env: Mapping[str, str] | None = None,
    ):
        self.config, self.bash_limits, self.bash_env = config, bash_limits, bash_env
        self.task: SWETask | None = None

    def reset(self, task: SWETask) -> None:
        self.task = task
        self.root = Path(task.repo_dir).resolve()

    def tool_names(self) -> tuple[str, ...]:
        return self.config.subagent_tools

    def tool_schemas(self, names: tuple[str, ...] | list[str]) -> list[dict[str, Any]]:
        return [SCHEMAS[n] for n in names if n in self.config.subagent_tools]

    def call_tool(self, agent_id: int, name: str, args: dict[str, Any]) -> str:
        try:
            known = name in self.config.subagent_tools
            out = getattr(self, f"_{name}")(**args) if known else f"error: unknown tool {name!r}"
        except TypeError as e:
            out = f"error: bad arguments for {name}: {e}"
        except (OSError, ValueError, re.error) as e:
            out = f"error: {e}"
        return out if len(out) <= _MAX_CHARS else out[:_MAX_CHARS] + f"\n… ({len(out) - _MAX_CHARS} more chars)"

    def poll_notifications(self, step: int) -> list[str]:
        return []

    def patch(self) -> str:
        assert self.task is not None, "reset() first"
        return extract_patch(self.root)

    def score(self, answer: str | None) -> Score:
        from porch_jax.envs.swe.grading import grade_docker, grade_local, uses_docker  # imports swebench only here

        assert self.task is not None, "reset() first"
        instance = self.task.instance
        docker = uses_docker(self.config.grader)
        if not docker and not instance.gradable:  # the harness reads its own full rows; local grading needs ours
            return Score(False, 0.0, "not graded: the instance has no tests (partial SWE-bench fields; see load_full)")
        if docker:
            patches = {instance.instance_id: self.patch()}
            report = grade_docker(patches, dataset_name=self.config.dataset_name)[instance.instance_id]
        else:
            report = grade_local(instance, self.patch(), self.task.source or self.root, **self.task.grading)
        failed = [t for kind in report.tests_status.values() for t in kind.get("failure", [])]
        reason = (
            "resolved"
            if report.resolved
            else ("patch did not apply" if not report.patch_applied else f"failing: {', '.join(failed[:5])}")
        )
        return Score(report.resolved, float(report.resolved), reason)

    # ---- tools ---------------------------------------------------------------------------------
    def _path(self, path: str) -> Path:
        p = (self.root / path).resolve()
        if p != self.root and self.root not in p.parents:
            raise ValueError(f"{path!r} is outside the repository")
        return p

    def _view(self, path: str, start: int = 1, end: int | None = None) -> str:
        p = self._path(path)
        if p.is_dir():
            entries = sorted(e.name + ("/" if e.is_dir() else "") for e in p.iterdir() if e.name != ".git")
            return "\n".join(entries) or "(empty directory)"
        lines = p.read_text(errors="replace").splitlines()
        end = min(len(lines), end or start + _VIEW_LINES - 1, start + _VIEW_LINES - 1)
        body = "\n".join(f"{i:6d}  {lines[i - 1]}" for i in range(max(1, start), end + 1))
        return f"{path} (lines {start}-{end} of {len(lines)})\n{body}"

    def _edit(self, path: str, old: str, new: str) -> str:
        p = self._path(path)
        if not old:
            if p.exists():
                raise ValueError(f"{path} exists: give the text to replace")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(new)
            return f"created {path}"
        text = p.read_text()
        count = text.count(old)
        if count != 1:
            raise ValueError(f"`old` occurs {count} times in {path}; it must occur exactly once")
        p.write_text(text.replace(old, new, 1))
        return f"edited {path}"

    def _search(self, pattern: str, path: str = ".") -> str:
        regex, base, hits = re.compile(pattern), self._path(path), []
        files = (
            [base] if base.is_file() else sorted(f for f in base.rglob("*") if f.is_file() and ".git" not in f.parts)
        )
        for f in files:
            try:
                for n, line in enumerate(f.read_text().splitlines(), 1):
                    if regex.search(line):
                        hits.append(f"{f.relative_to(self.root)}:{n}: {line.strip()}")
                        if len(hits) >= _MAX_MATCHES:
                            return "\n".join(hits + [f"(stopped at {_MAX_MATCHES} matches)"])
            except (UnicodeDecodeError, OSError):
                continue
        return "\n".join(hits) or "no matches"

    def _bash(self, command: str) -> str:
        env = (
            dict(self.bash_env)
            if self.bash_env is not None
            else {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root), "LANG": "C.UTF-8"}
        )
        r = run_command(["bash", "-c", command], str(self.root), self.bash_limits, env=env)
        status = "timed out" if r.timed_out else f"exit {r.returncode}"
        return f"[{status}]\n{r.stdout}{r.stderr}".rstrip()
