"""The OPOD experiment killed with -9 once per resume path (inside each stage that resumes its own way) and resumed
each time, in the tiny-model world (a 0.45M-parameter Qwen3 from scratch, the scripted expert and judge, the embedded
sampler; the stages and their resume are the real model's, and only here does the whole chain fit a CI budget). Each
kill lands at a crash point (porch_jax/faults.py): a store's write torn in half, or a trainer step after its
checkpoint; the final run directory must equal an uninterrupted run's: to the byte where the computation is
deterministic, otherwise the same records, counted (DETERMINISTIC says which is which, and why), with no stage's output
duplicated. The vLLM serving stage's kill is in tests/serving/test_serving_crash.py (a server start takes a minute;
the chain would pay it at every resume)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CONFIG = textwrap.dedent("""
    from experiments import quickstart

    def get_config():
        c = quickstart.get_config()
        c.run_dir = {run_dir!r}
        c.methods = ("sft", "opod")
        c.frameworks = ()  # POrchestra's chain; the other frameworks' stages resume through the same functions
        c.suite.mixture.templates = {{"mail_text": 1.0, "history": 1.0}}
        c.suite.max_decisions = 8
        c.expert_rollouts.num_tasks = 24
        c.rollouts.num_tasks = 6
        c.eval.tasks.num_tasks = 4
        c.eval.tasks.mixture = None
        c.eval.concurrency = 4
        c.selection.enabled = False
        c.policy.max_new_tokens = 24
        c.policy.buckets = (256,)
        # Enough SFT that the policy delegates, so the judge flags decisions and OPOD has on-policy rows to sample
        # (at 60 steps: 4 of 6 rollouts succeed, 8 of 33 decisions flagged).
        c.sft.update(steps=60, batch=8)
        c.checkpoint.every, c.log.every = 15, 5
        c.opod.update(steps=3, batch=2, lr_grid=None)
        c.opod.opd.batch, c.opod.opd.sampling.max_new_tokens = 2, 24
        return c
""")

# Byte-equal to the uninterrupted run: the scripted stages, and SFT (its resume is exact) with its greedy
# evaluation. The SFT policy's rollouts are sampled at temperature 1 by the embedded sampler, whose float rounding
# depends on the batch a request shares (7e-7 in a logprob between a batch of 1 and of 4); a resumed run batches
# other requests together, so an action can flip and everything downstream of the rollouts (attribution, OPOD, its
# evaluation) is compared as the same records, counted.
DETERMINISTIC = (
    "expert.jsonl",
    "expert_attribution.jsonl",
    "expert_attribution.jsonl.summary.json",
    "sft/export/model.safetensors",
    "sft/export/lm_head.safetensors",
    "eval/sft.jsonl",
)

# (crash point, the stage it lands in), in the loop's order (porch_jax/opod/experiment.py): one kill per resume path.
# Both attribution stages resume through one function (experiment.attribute, an AttributionStore), so the SFT
# decisions' attribution, whose hints OPOD trains on, is killed for both; the expert decisions' attribution runs
# without a kill and stays byte-equal (DETERMINISTIC).
CHAIN = (
    ("expert.jsonl@1", "expert rollouts"),
    ("sft.step@25", "train sft"),  # checkpoint at 15: steps 16-25 are replayed
    ("rollouts.jsonl@2", "rollouts of the SFT policy"),
    ("attribution.jsonl@1", "attribution of SFT decisions"),
    ("opod.step@1", "train opod"),  # before its first checkpoint: on-policy sampling restarts from step 1
    ("opod.jsonl@1", "evaluate opod"),
)


def _pipeline(config: Path, crash_at: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "PORCH_JAX_CRASH_AT": crash_at}
    return subprocess.run(
        [sys.executable, "-m", "launch.pipeline", f"--config={config}"],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )


def _write_config(folder: Path) -> Path:
    config = folder / "crash_chain_config.py"
    config.write_text(CONFIG.format(run_dir=str(folder / "run")))
    return config


def _share_compilations(reference: Path, run: Path) -> None:
    """Starts `run` with the reference run's compilation cache (RUN_DIR/jax_cache, which a fork takes too): every
    process of the chain then loads the programs the reference compiled instead of compiling them again. XLA's
    programs are the same either way; what the chain tests is how each stage resumes."""
    shutil.copytree(reference / "jax_cache", run / "jax_cache")


@pytest.fixture(scope="session")
def uninterrupted_run(tmp_path_factory) -> Path:
    """The chain's config run once without a crash: the reference."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    done = _pipeline(_write_config(folder))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return folder / "run"


def _stores(run: Path) -> list[Path]:
    """The run's record stores; the logs (metrics.jsonl, stages.jsonl: every process appends its own lines) not."""
    return sorted(
        p
        for p in run.rglob("*.jsonl")
        if "jax_cache" not in p.parts and p.name not in ("metrics.jsonl", "stages.jsonl")
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_killed_once_per_resume_path_and_resumed_the_run_equals_the_uninterrupted_one(tmp_path, uninterrupted_run):
    config = _write_config(tmp_path)
    run = tmp_path / "run"
    _share_compilations(uninterrupted_run, run)
    resumed = []  # what each run after a kill printed
    for crash_at, stage in CHAIN:
        killed = _pipeline(config, crash_at)
        resumed.append(killed.stdout)
        assert killed.returncode == -9, f"{crash_at}: exit {killed.returncode}\n{killed.stdout[-2000:]}{killed.stderr}"
        last_stage = [line for line in killed.stdout.splitlines() if line.startswith("=== ")][-1]
        assert stage in last_stage and last_stage.endswith(": running"), (crash_at, last_stage)

    done = _pipeline(config)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    resumed.append(done.stdout)
    assert "[sft] resumed from step 15" in resumed[[c for c, _ in CHAIN].index("sft.step@25") + 1]
    assert "train sft: done, skipped" in done.stdout and "step 1/" not in done.stdout
    torn = sorted(p.name for p in run.rglob("*.torn"))  # each torn write was set aside by the run after it
    assert torn == sorted(f"{c.split('@')[0]}.torn" for c, _ in CHAIN if ".jsonl@" in c), torn

    for path in _stores(run):  # no record written twice
        keys = [(r.get("episode_id"), r.get("index")) for r in map(json.loads, path.read_bytes().splitlines())]
        assert len(keys) == len(set(keys)), f"{path}: a record written twice"
    assert [p.relative_to(run) for p in _stores(run)] == [
        p.relative_to(uninterrupted_run) for p in _stores(uninterrupted_run)
    ]

    def same(name: str) -> bool:
        ours, theirs = run / name, uninterrupted_run / name
        if ours.suffix == ".jsonl":  # a resume may append the same records in another order
            return sorted(ours.read_bytes().splitlines()) == sorted(theirs.read_bytes().splitlines())
        return ours.read_bytes() == theirs.read_bytes()

    for name in DETERMINISTIC:
        assert same(name), f"{name} differs from the uninterrupted run's"

    def counted(folder: Path) -> dict[str, object]:
        rollouts = [json.loads(line) for line in (folder / "rollouts.jsonl").open()]
        attributed = {(r["episode_id"], r["index"]) for r in map(json.loads, (folder / "attribution.jsonl").open())}
        results = json.loads((folder / "results.json").read_text())
        return {
            "rollouts": sorted(r["episode_id"] for r in rollouts),
            "every decision attributed once": attributed
            == {(r["episode_id"], d["index"]) for r in rollouts for d in r["decisions"]},
            "evaluated": {p.name: len(p.read_bytes().splitlines()) for p in (folder / "eval").glob("*.jsonl")},
            "methods": [(m["system"], m["n"]) for m in results["methods"]],
            "opod steps": [json.loads(line)["step"] for line in (folder / "opod" / "metrics.jsonl").open()],
        }

    assert counted(run) == counted(uninterrupted_run)
    assert counted(run)["every decision attributed once"] and counted(run)["opod steps"] == [1, 2, 3]
    steps = [json.loads(line)["step"] for line in (run / "sft" / "metrics.jsonl").open()]
    assert steps == list(range(1, 61))  # the steps replayed after the kill replaced their lines
