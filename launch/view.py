"""Render trajectory stores as a folder of static HTML pages (one per episode, plus an index).

    python -m launch.view --store=runs/x/proactive.jsonl --out=runs/x/view [--episode=ID ...]
        [--store=runs/x/react.jsonl ...]   (several stores, e.g. one per system, share one index)
        [--store=runs/x]                   (a run dir: every trajectory store under it)
        [--price=orchestrator:0.1:0.4 --price=subagent:0.05:0.2]   (per 1k prompt/completion tokens)
        [--title="workplace compare" --results_href=../results.html]

Every line of a store is shown, retryable attempts included (the index filters them apart), so a view shows what
a run did, not only what training reads. The pages are self-contained (inline CSS and script, no network): open
index.html in any browser, from file:// too.
"""

from __future__ import annotations

import json
from pathlib import Path

from absl import app, flags

from porch_jax.eval.viewer import write_site
from porch_jax.trajectories import EpisodeRecord, TrajectoryStore

_STORE = flags.DEFINE_multi_string(
    "store", None, "Trajectory store (JSONL), or a run dir to search for stores; repeat for several.", required=True
)
_OUT = flags.DEFINE_string("out", None, "Output folder for the pages.", required=True)
_EPISODES = flags.DEFINE_multi_string("episode", [], "Only these episode ids (default: all).")
_PRICES = flags.DEFINE_multi_string("price", [], "role:prompt_per_1k:completion_per_1k, to show cost.")
_TITLE = flags.DEFINE_string("title", None, "Heading of the index (default: episodes).")
_RESULTS_HREF = flags.DEFINE_string("results_href", None, "Link from the index to the run's results page.")


def _prices(specs: list[str]) -> dict[str, tuple[float, float]]:
    out = {}
    for spec in specs:
        try:
            role, prompt, completion = spec.split(":")
            out[role] = (float(prompt), float(completion))
        except ValueError:
            raise app.UsageError(f"--price must be role:prompt_per_1k:completion_per_1k, got {spec!r}") from None
    return out


def _valid_prices(specs: list[str]) -> bool:
    for spec in specs:
        parts = spec.split(":")
        try:
            ok = len(parts) == 3 and all(float(p) >= 0 for p in parts[1:])
        except ValueError:
            ok = False
        if not ok:
            raise flags.ValidationError(f"--price must be role:prompt_per_1k:completion_per_1k, got {spec!r}")
    return True


flags.register_validator("price", _valid_prices)


def _is_trajectory_store(path: Path) -> bool:
    """Whether a JSONL file's first line is an episode record: a run dir also holds other JSONL (attribution rows,
    metrics, hints), which are not rendered."""
    with path.open("rb") as f:
        first = f.readline()
    try:
        row = json.loads(first)
    except ValueError:
        return False
    return isinstance(row, dict) and {"episode_id", "outcome", "schema_version"} <= row.keys()


def stores(paths: list[str]) -> list[Path]:
    """The stores named: a file as given, a directory as every trajectory store under it (sorted)."""
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            found = [f for f in sorted(p.rglob("*.jsonl")) if _is_trajectory_store(f)]
            if not found:
                raise app.UsageError(f"no trajectory store (*.jsonl of episode records) under {p}")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise app.UsageError(f"--store {p}: no such file or directory")
    return out


def main(argv: list[str]) -> None:
    del argv
    paths = stores(_STORE.value)
    records: list[EpisodeRecord] = [r for p in paths for r in TrajectoryStore(p)]
    if _EPISODES.value:
        missing = set(_EPISODES.value) - {r.episode_id for r in records}
        if missing:
            raise app.UsageError(f"episodes not in {', '.join(map(str, paths))}: {sorted(missing)}")
        records = [r for r in records if r.episode_id in set(_EPISODES.value)]
    pages = write_site(
        records, _OUT.value, _prices(_PRICES.value) or None, title=_TITLE.value, results_href=_RESULTS_HREF.value
    )
    print(f"wrote {len(pages)} episode pages and index.html to {_OUT.value} (from {', '.join(map(str, paths))})")


if __name__ == "__main__":
    app.run(main)
