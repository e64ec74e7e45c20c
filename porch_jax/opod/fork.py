"""A run directory started from another's stages before attribution (ExperimentConfig.fork_from).

SFT is most of an OPOD run's cost on a small machine (82 of ~200 minutes for SmolLM2 on 2 cores), and everything
up to the SFT policy's rollouts is the same whichever GRM reads them. A fork takes those stages' files from the
source run directory, so its pipeline finds them done and starts at attribution: the weights, checkpoints and
compiled programs, which nothing writes again, as hard links where the file system allows (copies otherwise); the
records (JSON lines a store appends to, JSON a stage rewrites) as copies, so no write of the fork reaches the
source. The source's config must equal the fork's but for the keys that come after SFT's rollouts
(FORK_MAY_CHANGE) and the resumable ones (fork_from among them); a source whose SFT has not finished is refused. The fork's stage log starts empty: the linked stages' times are in the source's results.md.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from porch_jax.envs.views import POLICY_FILE
from porch_jax.opod.config import ExperimentConfig
from porch_jax.typed_config import RunDirError, refuse_other_run, resumable_keys, to_dict

# What a fork may change: what reads the SFT policy's rollouts (attribution), the methods trained after it, their
# checkpoint selection, and the other frameworks (trained in folders of their own, never linked).
FORK_MAY_CHANGE = frozenset({"methods", "attribution", "rwr", "opod", "opd_empty", "dagrpo", "selection", "frameworks"})
# The files of the stages before attribution: the expert's rollouts and the scripted judge's reading of them (the
# SFT+hints rows), the initial model, SFT and its variants (every rate), the SFT policy's rollouts, the reference
# rows' evaluations and the compilation cache.
TAKEN = (
    "expert.jsonl",
    "expert_attribution.jsonl",
    "expert_attribution.jsonl.summary.json",
    "init",
    "sft_selection.json",
    "rollouts.jsonl",
    "zero_shot",
    "jax_cache",
    "eval/expert.jsonl",
    "eval/zero_shot.jsonl",
)
TAKEN_GLOBS = ("sft", "sft_lr*", "sft_hints", "sft_hints_lr*", "sft*_loss.png", "eval/sft*.jsonl")


def forked_paths(source: Path) -> Iterator[Path]:
    """The files and folders of `source` a fork takes (module docstring), those that exist."""
    names = [source / n for n in TAKEN]
    names += [p for pattern in TAKEN_GLOBS for p in sorted(source.glob(pattern))]
    seen = set()
    for path in names:
        if path.exists() and path not in seen:
            seen.add(path)
            yield path


def fork(cfg: ExperimentConfig, defaults: Any = None) -> list[Path]:
    """Takes cfg.fork_from's stages before attribution into cfg.run_dir (module docstring), once: a run directory that already records
    a config is not forked again (a rerun resumes it), and a link that exists is kept (a fork cut short completes).
    `defaults`: the config keys older records may lack (claim_run_dir's). Returns the source paths taken."""
    source, target = Path(cfg.fork_from), Path(cfg.run_dir)
    if (target / "config.json").exists():
        return []
    if source.resolve() == target.resolve():
        raise RunDirError(f"config.fork_from: {source} is the run directory itself")
    record = source / "config.json"
    if not record.is_file():
        raise RunDirError(f"config.fork_from: {source} holds no run of this experiment (no config.json)")
    if not (source / "sft" / "export" / POLICY_FILE).is_file():
        raise RunDirError(f"config.fork_from: {source}'s SFT has not finished (no sft/export/{POLICY_FILE})")
    try:
        recorded = json.loads(record.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunDirError(f"config.fork_from: {record} is not the JSON a run records ({e})") from e
    refuse_other_run(
        f"config.fork_from ({source})",
        "config.json",
        recorded,
        to_dict(cfg),
        may_change=FORK_MAY_CHANGE | resumable_keys(ExperimentConfig),
        defaults=defaults,
    )
    linked = []
    for path in forked_paths(source):
        _link_tree(path, target / path.relative_to(source))
        linked.append(path)
    return linked


def _link_tree(source: Path, target: Path) -> None:
    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
    for f in files:
        to = target if f == source else target / f.relative_to(source)
        if to.exists():
            continue
        to.parent.mkdir(parents=True, exist_ok=True)
        if f.suffix in COPIED:
            shutil.copy2(f, to)
            continue
        try:
            os.link(f, to)
        except OSError:  # another file system, or one without hard links
            shutil.copy2(f, to)


COPIED = (".jsonl", ".json")  # records a later stage may append to or rewrite: the fork's own copies
