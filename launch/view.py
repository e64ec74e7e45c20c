"""Render a trajectory store as a folder of static HTML pages (one per episode, plus an index).

    python -m launch.view --store=runs/x/proactive.jsonl --out=runs/x/view [--episode=ID ...]
        [--price=orchestrator:0.1:0.4 --price=subagent:0.05:0.2]   (per 1k prompt/completion tokens)

The pages are self-contained (no script, no network): open index.html in any browser.
"""

from __future__ import annotations

from absl import app, flags

from porch_jax.eval.viewer import write_site
from porch_jax.trajectories import TrajectoryStore

_STORE = flags.DEFINE_string("store", None, "Trajectory store (JSONL) to render.", required=True)
_OUT = flags.DEFINE_string("out", None, "Output folder for the pages.", required=True)
_EPISODES = flags.DEFINE_multi_string("episode", [], "Only these episode ids (default: all).")
_PRICES = flags.DEFINE_multi_string("price", [], "role:prompt_per_1k:completion_per_1k, to show cost.")


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


def main(argv: list[str]) -> None:
    del argv
    records = TrajectoryStore(_STORE.value).read()
    if _EPISODES.value:
        missing = set(_EPISODES.value) - {r.episode_id for r in records}
        if missing:
            raise app.UsageError(f"episodes not in {_STORE.value}: {sorted(missing)}")
        records = [r for r in records if r.episode_id in set(_EPISODES.value)]
    pages = write_site(records, _OUT.value, _prices(_PRICES.value) or None)
    print(f"wrote {len(pages)} episode pages and index.html to {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
