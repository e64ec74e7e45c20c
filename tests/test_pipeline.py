"""The quickstart pipeline end to end, in miniature (a few tasks, a few steps, a tiny model): every
stage runs and leaves its files, the report is written, and a rerun resumes (skips every stage and
rebuilds the same table)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

CONFIG = textwrap.dedent("""
    from experiments import quickstart

    def get_config():
        c = quickstart.get_config()
        c.run_dir = {run_dir!r}
        c.frameworks = ()  # POrchestra alone; the other frameworks' stages: tests/test_frameworks.py
        c.suite.mixture.templates = {{"mail_text": 1.0, "history": 1.0}}
        c.suite.max_decisions = 4
        c.expert_rollouts.num_tasks = 12
        c.rollouts.num_tasks = 4
        c.eval.tasks.num_tasks = 4
        c.eval.tasks.mixture = None
        c.eval.concurrency = 4
        c.selection.tasks.num_tasks = 3
        c.policy.max_new_tokens = 24
        c.policy.buckets = (256,)
        c.model.hf.update(hidden_size=32, intermediate_size=64, num_hidden_layers=2, head_dim=8)
        c.sft.update(steps=3, batch=2)
        c.checkpoint.every, c.log.every = 2, 1
        for name in ("rwr", "opod", "opd_empty"):
            c[name].update(steps=2, batch=2, export_every=1)
        for name in ("opod", "opd_empty"):
            c[name].opd.batch, c[name].opd.sampling.max_new_tokens = 2, 24
        c.dagrpo.update(steps=2, export_every=1)
        c.dagrpo.group.update(contexts_per_step=2, group_size=2)
        c.dagrpo.group.sampling.max_new_tokens = 24
        for name in ("rwr", "opod", "opd_empty", "dagrpo"):
            c[name].lr_grid = None
        return c
""")


def _pipeline(config):
    return subprocess.run(
        [sys.executable, "-m", "launch.pipeline", f"--config={config}"],
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


@pytest.mark.slow
def test_tiny_pipeline_runs_end_to_end_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    config = tmp_path / "tiny_quickstart.py"
    text = CONFIG.format(run_dir=str(run_dir))
    extra = (
        "    c.dagrpo.lr_grid = (3e-3, 1e-3)\n"
        # SFT in epochs over 9 of the 12 expert episodes, its rate chosen on the other 3's validation loss after
        # the first of two epochs (the chosen rate alone continues); the SFT+hints variant (at SFT's chosen rate)
        # and OPD with wrong hints as rows of their own
        "    c.sft.update(epochs=2.0, validation_share=0.25, lr_grid=(3e-3, 1e-3), select_after_epochs=1.0)\n"
        "    c.sft_hints = dict(c.sft.to_dict(), lr_grid=None, validation_share=0.0, hint_rows=0.5)\n"
        "    c.methods = ('sft', 'sft_hints', 'rwr', 'opod', 'opd_empty', 'opd_wrong_hint', 'dagrpo')\n"
        # DA-GRPO's 4 samples a step in 2 micro-batches
        "    c.dagrpo.accum_steps = 2\n"
        "    return c\n"
    )
    config.write_text(text.replace("    return c\n", extra))
    first = _pipeline(config)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    for name in (
        "expert.jsonl",
        "expert_attribution.jsonl",
        "rollouts.jsonl",
        "attribution.jsonl",
        "results.md",
        "results.json",
        "curves.png",
        "success.png",
        "sft/export/policy.json",
        "eval/sft.jsonl",
    ):
        assert (run_dir / name).exists(), name
    results = json.loads((run_dir / "results.json").read_text())
    methods = [m["system"] for m in results["methods"]]
    assert methods[0] == "sft" and "dagrpo" in methods and all(m["n"] == 4 for m in results["methods"])
    for name, micro in (("sft", 1), ("dagrpo", 2), ("dagrpo_lr0.003", 2)):  # DA-GRPO's step in micro-batches
        logged = [json.loads(line) for line in (run_dir / name / "metrics.jsonl").read_text().splitlines()]
        assert {m["micro_batches"] for m in logged if "micro_batches" in m} == {micro}, name
    assert "=== " in first.stdout and re.search(r"step (\d+)/\1 \(100%\)", first.stdout)  # visible progress
    # The reference rows: the scripted expert deciding from its window (the ceiling) on the same held-out tasks
    (expert,) = results["references"]
    assert expert["system"] == "expert" and expert["n"] == 4 and (run_dir / "eval" / "expert.jsonl").is_file()
    report = (run_dir / "results.md").read_text()
    assert "| expert | 4 |" in report
    # Stage times summed from RUN/stages.jsonl; hint following for both SFT teachers
    assert re.search(r"\| train sft \| \d+\.\d \|", report) and (run_dir / "stages.jsonl").is_file()
    for name in ("", "_sft_hints"):  # the quickstart has one reading (its GRM is the scripted judge)
        follow = json.loads((run_dir / f"hint_following{name}.json").read_text())
        assert follow["n"] == 0 or {"student", "teacher", "teacher_empty_hint"} <= set(follow), (name, follow)
    assert "| primary | sft_hints |" in report and "s + wrong hint" in report
    selection = json.loads((run_dir / "selection.json").read_text())  # checkpoints chosen on validation tasks
    assert set(selection) == set(methods) and selection["sft"]["step"] is None
    dagrpo = selection["dagrpo"]  # always trained (expert contexts), at two rates, exported after steps 1 and 2
    assert {lr: set(steps) for lr, steps in dagrpo["val_success"].items()} == {"0.003": {"1", "2"}, "0.001": {"1", "2"}}
    assert dagrpo["step"] in (1, 2) and dagrpo["learning_rate"] in (3e-3, 1e-3)
    best = max(s for steps in dagrpo["val_success"].values() for s in steps.values())
    assert dagrpo["val_success"][f"{dagrpo['learning_rate']:g}"][str(dagrpo["step"])] == best
    assert dagrpo["run"] == ("dagrpo" if dagrpo["learning_rate"] == 1e-3 else "dagrpo_lr0.003")
    assert json.loads((run_dir / "dagrpo_lr0.003" / "export" / "policy.json").read_text())["step"] == 2
    assert (run_dir / "eval" / f"{dagrpo['run']}_step{dagrpo['step']}.jsonl").is_file()
    assert {"dagrpo_step1.jsonl", "dagrpo_lr0.003_step2.jsonl"} <= {p.name for p in (run_dir / "val").iterdir()}
    assert "selected on validation" in (run_dir / "results.md").read_text()
    chosen = json.loads((run_dir / "sft_selection.json").read_text())  # the lowest validation loss after epoch 1
    rate = f"{chosen['learning_rate']:g}"
    assert rate == min(chosen["val_loss"].items(), key=lambda kv: kv[1])[0] in ("0.003", "0.001")
    assert chosen["compared"].startswith("validation loss at step ")
    probe = int(chosen["compared"].split()[4])
    folders = {"0.003": run_dir / "sft", "0.001": run_dir / "sft_lr0.001"}  # sft's configured rate is 3e-3
    other = next(lr for lr in folders if lr != rate)
    curves = {
        lr: [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()] for lr, d in folders.items()
    }
    assert curves[rate][0]["step"] == 0 and "val_loss" in curves[rate][0]  # scored from the start
    assert curves[rate][-1]["step"] > probe and (folders[rate] / "export" / "policy.json").is_file()  # continued
    assert curves[other][-1]["step"] == probe and not (folders[other] / "export").exists()  # stopped at the probe
    assert f"[{folders[rate].name}] resumed from step {probe}" in first.stdout
    hints = "sft_hints" if rate == "0.003" else "sft_hints_lr0.001"  # SFT+hints at SFT's chosen rate
    assert (run_dir / "sft_loss.png").is_file() and (run_dir / hints / "export" / "policy.json").is_file()
    assert {"sft_hints", "opd_wrong_hint"} <= {m["system"] for m in results["methods"]} | set(
        line.split("|")[1].strip()
        for line in (run_dir / "results.md").read_text().splitlines()
        if "not trained" in line
    )

    table, selected = (run_dir / "results.md").read_text(), (run_dir / "sft_selection.json").read_text()
    second = _pipeline(config)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "train sft: done, skipped" in second.stdout and "step 1/" not in second.stdout
    before_times = table.split("Stage times")[0]  # the rerun's own seconds join the stage times, nothing else
    assert (run_dir / "results.md").read_text().split("Stage times")[0] == before_times and before_times != table
    assert (run_dir / "sft_selection.json").read_text() == selected  # the rates compared at the probe's step again

    # A fork reads the same SFT policy's rollouts again (another attribution setting) without redoing what precedes
    fork_dir, fork_config = tmp_path / "fork", tmp_path / "fork_quickstart.py"
    fork_config.write_text(
        config.read_text().replace(
            "    return c\n",
            f"    c.run_dir, c.fork_from = {str(fork_dir)!r}, {str(run_dir)!r}\n"
            "    c.attribution = {'retries': 2}\n"  # the source's attribution had the default 1
            "    c.methods = ('sft', 'opod')\n"
            "    return c\n",
        )
    )
    forked = _pipeline(fork_config)
    assert forked.returncode == 0, forked.stdout[-3000:] + forked.stderr[-3000:]
    assert f"forked from {run_dir}: " in forked.stdout and "train sft: done, skipped" in forked.stdout
    assert "step 1/" not in forked.stdout and "attribution of SFT decisions (scripted judge): running" in forked.stdout
    weights = "sft/export/model.safetensors"
    assert os.stat(fork_dir / weights).st_ino == os.stat(run_dir / weights).st_ino  # linked, not copied
    fork_results = json.loads((fork_dir / "results.json").read_text())
    sft_row = next(m for m in results["methods"] if m["system"] == "sft")
    assert next(m for m in fork_results["methods"] if m["system"] == "sft") == sft_row  # the same records, read


@pytest.mark.slow
def test_tiny_pipeline_over_seed_sets_reports_the_sets(tmp_path):
    run_dir = tmp_path / "run"
    config = tmp_path / "tiny_seed_sets.py"
    text = CONFIG.format(run_dir=str(run_dir))
    assert text.count("    return c\n") == 1
    # The set's wiring on SFT and the methods it leaves untrained here (no successful rollout to reweight); every
    # method's stages: the end-to-end test above; the aggregate's statistics: tests/eval/test_seed_sets.py
    methods = "    c.methods = ('sft', 'rwr', 'opod')\n"
    config.write_text(text.replace("    return c\n", f"    c.seed_sets = (0, 1)\n{methods}    return c\n"))
    done = _pipeline(config)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "##### seed set 1 (2 of 2)" in done.stdout
    per_set = {k: json.loads((run_dir / f"seed_set_{k}" / "results.json").read_text()) for k in (0, 1)}
    configs = {k: json.loads((run_dir / f"seed_set_{k}" / "config.json").read_text()) for k in (0, 1)}
    assert configs[1]["sft"]["seed"] == configs[0]["sft"]["seed"] + 10
    assert configs[1]["rollouts"]["seed_start"] == configs[0]["rollouts"]["seed_start"] + 1000
    rollout_seeds = {
        k: {json.loads(line)["seed"] for line in (run_dir / f"seed_set_{k}" / "rollouts.jsonl").open()} for k in (0, 1)
    }
    assert rollout_seeds[0].isdisjoint(rollout_seeds[1])  # each set rolls out on its own tasks
    agg = json.loads((run_dir / "seed_sets.json").read_text())
    assert agg["seed_sets"] == [0, 1]
    for m in agg["methods"]:
        assert m["success"] == [
            next(r["success"] for r in per_set[k]["methods"] if r["system"] == m["system"]) for k in (0, 1)
        ]
    assert [(c["better"], c["worse"]) for c in agg["comparisons"]] == [
        (c["better"], c["worse"]) for c in per_set[0]["comparisons"]
    ]
    assert "| sft |" in (run_dir / "seed_sets.md").read_text() and (run_dir / "seed_sets.png").is_file()


def test_learning_rate_grid_needs_the_configured_rate_and_selection():
    from dataclasses import replace

    from experiments.quickstart import get_config
    from porch_jax.opod.config import ExperimentConfig
    from porch_jax.opod.experiment import learning_rates, run_name
    from porch_jax.typed_config import ConfigError, from_dict

    config = get_config()
    cfg = from_dict(ExperimentConfig, config)
    assert learning_rates(cfg, "rwr") == (1e-4, 3e-4, 1e-3) and learning_rates(cfg, "sft") == (3e-3,)
    assert run_name(cfg, "rwr", 3e-4) == "rwr" and run_name(cfg, "rwr", 1e-3) == "rwr_lr0.001"
    assert learning_rates(replace(cfg, rwr=replace(cfg.rwr, lr_grid=None)), "rwr") == (3e-4,)
    config.rwr.lr_grid = (1e-4, 1e-3)  # checked when the launcher builds the typed config
    with pytest.raises(ConfigError, match=r"config.rwr.lr_grid: \(0.0001, 0.001\) must include its learning_rate"):
        from_dict(ExperimentConfig, config)
    config.rwr.lr_grid, config.selection.enabled = None, False
    with pytest.raises(ConfigError, match="config.opod.lr_grid: more than one rate needs checkpoint selection"):
        from_dict(ExperimentConfig, config)
    config.opod.lr_grid = config.opd_empty.lr_grid = config.dagrpo.lr_grid = None
    assert not from_dict(ExperimentConfig, config).selection.enabled
    config.opd_empty.accum_steps = 16  # the step's 8 rows do not split into 16 micro-batches
    with pytest.raises(ConfigError, match=r"config.opd_empty.batch: 8 rows a step do not split into accum_steps=16"):
        from_dict(ExperimentConfig, config)
    config.opd_empty.accum_steps = 3  # 8 rows, 16 OPD rows
    with pytest.raises(ConfigError, match=r"config.opd_empty.batch: 8 rows a step do not split into accum_steps=3"):
        from_dict(ExperimentConfig, config)
    config.opd_empty.accum_steps = 1
    config.opod.opd = None
    with pytest.raises(ConfigError, match="config.opod.opd: missing"):
        from_dict(ExperimentConfig, config)


def test_a_rerun_into_a_run_directory_of_another_config_is_refused(tmp_path, monkeypatch):
    """RUN_DIR/config.json records the typed config: a rerun with another one is refused before any stage, naming
    the keys; one that differs only in the evaluation's concurrency or in its methods goes on. Over seed sets more sets may join
    (each set's folder records its own config)."""
    from dataclasses import replace

    from experiments.quickstart import get_config
    from porch_jax.opod import experiment
    from porch_jax.opod.config import ExperimentConfig, with_seed_set
    from porch_jax.typed_config import RunDirError, claim_run_dir, from_dict

    config = get_config()
    config.run_dir = str(tmp_path / "run")
    cfg = from_dict(ExperimentConfig, config)
    claim_run_dir(cfg.run_dir, cfg)
    stages = []

    class Started(Exception):
        pass

    def start(run, cfg):
        stages.append(cfg.run_dir)
        raise Started

    monkeypatch.setattr(experiment.Run, "__init__", start)
    with pytest.raises(Started):  # past the claim: the first stage starts
        experiment.run_pipeline(replace(cfg, eval=replace(cfg.eval, concurrency=cfg.eval.concurrency + 1)))
    with pytest.raises(Started):  # a run grows (or narrows) by methods
        experiment.run_pipeline(replace(cfg, methods=cfg.methods[:1]))
    with pytest.raises(Started):  # micro-batches change memory, not what is trained
        experiment.run_pipeline(replace(cfg, opod=replace(cfg.opod, accum_steps=2)))
    assert stages == [cfg.run_dir] * 3
    other = replace(cfg, sft=replace(cfg.sft, steps=cfg.sft.steps + 1), seed=cfg.seed + 1)
    with pytest.raises(RunDirError, match=rf"another config \(seed: {cfg.seed} -> {cfg.seed + 1}; sft\.steps: "):
        experiment.run_pipeline(other)
    assert stages == [cfg.run_dir] * 3

    sets = replace(cfg, run_dir=str(tmp_path / "sets"), seed_sets=(0, 1))
    claim_run_dir(sets.run_dir, sets)
    ran = []
    monkeypatch.setattr(experiment, "run_pipeline", lambda c: ran.append(c.run_dir))
    monkeypatch.setattr(experiment, "report_seed_sets", lambda base, seed_sets: None)
    monkeypatch.setattr(experiment.runtime, "tune_malloc", lambda: None)  # process settings of a real run
    monkeypatch.setattr(experiment.jax.config, "update", lambda name, value: None)
    experiment.run(replace(sets, seed_sets=(0, 1, 2)))
    assert ran == [with_seed_set(sets, k).run_dir for k in (0, 1, 2)]
    with pytest.raises(RunDirError, match=r"another config \(rwr\.steps: \d+ -> 1\)"):
        experiment.run(replace(sets, rwr=replace(sets.rwr, steps=1)))
