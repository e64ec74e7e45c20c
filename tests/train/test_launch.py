"""launch/train.py and launch/export.py end to end: config file + overrides (an unknown key or a bad value
is a flags error naming it), OPOD with on-policy sampling, GRPO replaying recorded groups, export, any checkpoint
step exported again."""

from __future__ import annotations

import json
import subprocess

import pytest
import tiny_data

from porch_jax.trajectories import TrajectoryStore


def _run(command, timeout=120):
    return subprocess.run(
        command,
        cwd=tiny_data.REPO,
        env=tiny_data.launch_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("--config.train.method.name=ppo", "config.train.method.name"),
        ("--config.train.nonexistent_key=3", "config.train.nonexistent_key"),
        ("--config.batch.micro_batch=0", "config.batch.micro_batch"),
    ],
)
def test_train_launcher_names_an_unknown_key_or_a_bad_value(tmp_path, override, named):
    config = tiny_data.write_config(tiny_data.config(tmp_path / "run"), tmp_path / "c.py")
    out = _run(tiny_data.launch_command(config, override))
    assert out.returncode != 0 and named in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize(("flag", "named"), [("--step=abc", "--step"), ("--nonexistent_flag=3", "nonexistent_flag")])
def test_export_launcher_names_an_unknown_flag_or_a_bad_value(tmp_path, flag, named):
    out = _run([tiny_data.sys.executable, "-m", "launch.export", f"--run_dir={tmp_path}", f"--out={tmp_path}/x", flag])
    assert out.returncode != 0 and named in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]


def test_opod_run_with_overrides_samples_on_policy_and_exports(tmp_path):
    model_dir, store = tiny_data.write_run_inputs(tmp_path / "inputs")
    table = tiny_data.hints(TrajectoryStore(store).read())
    hints = tiny_data.write_jsonl(
        [{"episode_id": e, "index": i, "attributable": True, "hint": h} for (e, i), h in table.items()],
        tmp_path / "hints.jsonl",
    )
    c = tiny_data.config(tmp_path / "run", steps=2, method="opod")
    c.model.init_from, c.data.trajectories, c.data.hints = str(model_dir), str(store), str(hints)
    c.opd.batch, c.opd.sampling.max_new_tokens = 4, 8
    c.train.log.update(every=1, tensorboard=True)
    export = tmp_path / "run" / "export"
    config = tiny_data.write_config(c, tmp_path / "opod.py")

    overrides = ("--config.train.optimizer.learning_rate=1e-5", "--config.train.method.opd_weight=0.5")
    out = _run(tiny_data.launch_command(config, *overrides), timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("step ")]
    # CombinedViews(RWR rows, OPD rows): both parts every step, each OPD action sampled by the current student.
    assert len(lines) == 2 and all(" rwr " in line and " opd " in line and "logprob_gap" in line for line in lines)
    saved = json.loads((tmp_path / "run" / "checkpoints" / "2" / "config" / "metadata").read_text())
    assert saved["train"]["optimizer"]["learning_rate"] == 1e-5 and saved["train"]["method"]["opd_weight"] == 0.5
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))

    transformers = pytest.importorskip("transformers", reason="transformers is a runtime dependency of porch_jax")
    pytest.importorskip("torch", reason="torch is in the test extra (torch==2.13.0); scripts/test.sh installs it")
    model = transformers.AutoModelForCausalLM.from_pretrained(export)
    assert model.config.hidden_size == tiny_data.TINY_HF["hidden_size"]

    # launch/export.py: the newest checkpoint step as an HF folder, equal to the run's own final export.
    again = tmp_path / "again"
    out = _run([tiny_data.sys.executable, "-m", "launch.export", f"--run_dir={tmp_path / 'run'}", f"--out={again}"])
    assert out.returncode == 0, out.stderr[-3000:]
    want, got = tiny_data.read_safetensors(export), tiny_data.read_safetensors(again)
    assert want.keys() == got.keys() and all((want[k] == got[k]).all() for k in want)
    assert json.loads((again / "policy.json").read_text()) == {"view": "full", "step": 2}
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(again)
    assert reloaded.config.num_hidden_layers == tiny_data.TINY_HF["num_hidden_layers"]


def test_grpo_run_replays_recorded_groups_whole_groups_a_micro_batch(tmp_path):
    """GRPO on records: data.groups' recorded samples, with their log-probabilities and rewards, replayed by
    RecordedGroups; 2 groups of 2 a step over 2 accumulation steps of 2 rows."""
    model_dir, _ = tiny_data.write_run_inputs(tmp_path / "inputs")
    groups = tiny_data.write_jsonl(tiny_data.groups(6, size=2), tmp_path / "groups.jsonl")
    c = tiny_data.config(tmp_path / "run", steps=2, method="grpo")
    c.model.init_from, c.data.groups = str(model_dir), str(groups)
    c.batch.update(micro_batch=2, accum_steps=2)
    c.train.log.every = 1
    out = _run(tiny_data.launch_command(tiny_data.write_config(c, tmp_path / "grpo.py")), timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("step ")]
    assert len(lines) == 2 and all(" pg " in line and "logprob_gap" in line for line in lines), out.stdout[-2000:]
    rows = json.loads((tmp_path / "run" / "rows.json").read_text())
    assert rows == {"grpo": {"rule": "error", "limit": 128, "kept": 6, "cut": 0, "dropped": 0}}
    assert (tmp_path / "run" / "export" / "model.safetensors").exists()


def test_a_grpo_batch_of_part_of_a_group_is_refused(tmp_path):
    """A step's rows (micro_batch x accum_steps) hold whole groups: advantages are relative to a group's samples."""
    from porch_jax.typed_config import ConfigError

    c = tiny_data.config(tmp_path / "run", method="grpo")
    c.batch.update(micro_batch=3, accum_steps=1)
    rows = tiny_data.method_rows(c)
    assert {len(g.samples) for g in rows.groups} == {2}
    with pytest.raises(ConfigError, match="3 rows a step do not hold whole GRPO groups of 2 samples"):
        tiny_data.trainer(c, tiny_data.model(), rows)


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("--config.opod.nonexistent_key=3", "config.opod.nonexistent_key"),
        ("--config.policy.view=json", "config.policy.view"),
        ("--config.rwr.steps=0", "config.rwr.steps"),
    ],
)
def test_pipeline_launcher_names_an_unknown_key_or_a_bad_value(tmp_path, override, named):
    command = [tiny_data.sys.executable, "-m", "launch.pipeline", "--config=experiments/quickstart.py"]
    out = _run([*command, f"--config.run_dir={tmp_path}", override])
    assert out.returncode != 0 and named in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "expert.jsonl").exists()  # stopped before any stage ran


def test_a_rerun_into_a_workdir_of_another_config_is_refused(tmp_path):
    """WORKDIR/config.json records the run's config: a rerun that changes only the checkpoint and log cadence or
    the mesh resumes; the launcher refuses another config before any work, naming the key with both values."""
    from dataclasses import replace

    from porch_jax.rows import records

    c = tiny_data.config(tmp_path / "run")
    cfg = tiny_data.typed(c)
    records.claim_workdir(cfg)
    train = replace(
        cfg.train, mesh=(2, 1, 1), log=replace(cfg.train.log, every=1), checkpoint=replace(cfg.train.checkpoint, keep=1)
    )
    records.claim_workdir(replace(cfg, train=train))
    config = tiny_data.write_config(c, tmp_path / "c.py")
    out = _run(tiny_data.launch_command(config, "--config.train.optimizer.learning_rate=0.5"))
    assert out.returncode != 0, out.stdout[-2000:]
    refusal = "holds a run of another config (train.optimizer.learning_rate: 0.003 -> 0.5)"
    assert refusal in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "run" / "checkpoints").exists()
