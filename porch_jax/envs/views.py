"""How a policy reads a stored context: its *view*.

"full" is the rendered context itself. "compact" (the CPU miniature) drops what a tiny model
cannot use and pays for on every token: the fixed system prompt (the same for every task of a
suite) and the quoted evidence lines of feedback (the status and request lines stay). "dsl" reads
and writes the workplace suite's compact action-and-state language (envs.workplace.codec): the
policy's actions are short pointers decoded into full tool calls before the engine parses them,
so records keep full actions while the policy is trained on, and samples, the compact form. The
same view is applied wherever the policy reads a context: training, on-policy sampling, the
teacher's s + H, rollouts and evaluation; records keep the exact context. An exported policy
folder names its view in POLICY_FILE.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from porch_jax.envs.workplace import codec

VIEWS = ("full", "compact", "dsl")
POLICY_FILE = "policy.json"  # in an exported policy folder: {"view": ..., "step": ...}


def policy_view(context: Sequence[Mapping[str, Any]], view: str = "full") -> list[dict[str, Any]]:
    """The messages the policy reads for a stored context (see the module docstring)."""
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}, got {view!r}")
    if view == "dsl":
        return codec.encode_context(context)
    messages = [dict(m) for m in context]
    if view == "full":
        return messages
    if messages and messages[0].get("role") == "system":
        messages = messages[1:]
    for m in messages:
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            lines = m["content"].split("\n")
            m["content"] = "\n".join(x for x in lines if x != "evidence:" and not x.startswith("> "))
    return messages


def folder_view(folder: str | Path) -> str:
    """The view an exported policy folder was trained with ("full" without a POLICY_FILE)."""
    path = Path(folder) / POLICY_FILE
    return json.loads(path.read_text())["view"] if path.is_file() else "full"


def write_policy_file(folder: str | Path, view: str, step: int | None = None) -> None:
    """Marks an exported policy folder with its view (and the training step it holds); written after the weights,
    so a folder with a POLICY_FILE is complete (the trainer's `on_export` hook of a policy run)."""
    (Path(folder) / POLICY_FILE).write_text(json.dumps({"view": view} | ({} if step is None else {"step": step})))


def selection_candidates(export: str | Path) -> dict[int, Path]:
    """A run's checkpoint-selection candidates by step: its ``exports/step_N`` folders (``export_every``) and,
    when there are any, the final ``export`` folder under the step its POLICY_FILE records."""
    export = Path(export)
    folder = export.parent / "exports"
    found = {int(p.name.split("_", 1)[1]): p for p in folder.glob("step_*") if (p / POLICY_FILE).is_file()}
    final = json.loads((export / POLICY_FILE).read_text()).get("step") if (export / POLICY_FILE).is_file() else None
    if found and final is not None:
        found[int(final)] = export
    return dict(sorted(found.items()))
