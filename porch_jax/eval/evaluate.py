"""Checkpoint-based evaluation: an exported policy folder runs held-out seeded tasks through the
engine (our sampler as the orchestrator, scripted sub-agents), into a resumable trajectory store.

Only the folder is read (weights, tokenizer, policy view), so evaluation gives the same records in
a fresh process as in the pipeline's own:

    python -m porch_jax.eval.evaluate --policy=RUN/opod/export --config=experiments/quickstart.py \\
        --out=RUN/eval/opod.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import runpy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from porch_jax.backends import Sampling
from porch_jax.eval import suite as suite_lib
from porch_jax.eval.policy import Policy, load_policy
from porch_jax.eval.suite import EvalConfig, SuiteConfig
from porch_jax.rollout import RunSummary, run_episodes
from porch_jax.trajectories import EpisodeRecord, TrajectoryStore
from porch_jax.typed_config import from_dict


async def run_policy(
    policy: Policy,
    tasks: Sequence[Any],
    store: TrajectoryStore,
    suite: SuiteConfig,
    *,
    name: str,
    temperature: float,
    max_tokens: int,
    concurrency: int,
    seed: int = 0,
    progress: bool = True,
    system: str = "proactive",
) -> RunSummary:
    """Roll the policy out on ``tasks`` (those not yet in ``store``) under ``system``'s engine (the framework it was
    trained for); episode ids are ``name/task_id``."""
    engine = suite_lib.engine(
        policy.backend(seed),
        suite,
        name=name,
        sampling=Sampling(temperature=temperature, max_tokens=max_tokens),
        system=system,
    )

    async def episode(task: Any) -> EpisodeRecord:
        return await engine.run(task, episode_id=f"{name}/{task.task_id}")

    return await run_episodes(tasks, episode, store, concurrency, progress, key=lambda t: f"{name}/{t.task_id}")


def evaluate(
    policy: Policy,
    tasks: Sequence[Any],
    out: str | Path,
    suite: SuiteConfig,
    eval_cfg: EvalConfig,
    name: str,
    system: str = "proactive",
) -> list[EpisodeRecord]:
    """Greedy (or ``eval_cfg.temperature``) rollouts of ``policy`` on ``tasks`` under ``system``, stored in ``out``."""
    with TrajectoryStore(out) as store:
        asyncio.run(
            run_policy(
                policy,
                tasks,
                store,
                suite,
                name=name,
                temperature=eval_cfg.temperature,
                max_tokens=eval_cfg.max_tokens,
                concurrency=eval_cfg.concurrency,
                seed=eval_cfg.seed,
                system=system,
            )
        )
    return TrajectoryStore(out).read()


def load_config(path: str | Path) -> Any:
    """``get_config()`` of an experiment file (a ConfigDict: this module's ``main`` types the sections it reads)."""
    return runpy.run_path(str(path))["get_config"]()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", required=True, help="exported policy folder (config.json, weights, tokenizer)")
    parser.add_argument("--config", required=True, help="experiment file with get_config() (suite and eval sections)")
    parser.add_argument("--out", required=True, help="trajectory store to write (resumed if it exists)")
    parser.add_argument("--name", default="eval", help="episode id prefix")
    parser.add_argument(
        "--system", default="proactive", help="the framework the policy was trained for (its engine: rollout/config.py)"
    )
    args = parser.parse_args(argv)
    cfg = load_config(args.config)
    suite = from_dict(SuiteConfig, cfg.suite, path="config.suite")
    eval_cfg = from_dict(EvalConfig, cfg.eval, path="config.eval")
    policy = load_policy(args.policy, max_len=int(cfg.policy.max_len), prompt_buckets=tuple(cfg.policy.buckets))
    tasks = suite_lib.task_set(eval_cfg.tasks, suite)
    records = evaluate(policy, tasks, args.out, suite, eval_cfg, args.name, system=args.system)
    print(f"{sum(r.outcome.success for r in records)}/{len(records)} succeeded; records in {args.out}")


if __name__ == "__main__":
    main()
