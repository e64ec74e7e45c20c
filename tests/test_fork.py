"""A run directory forked from another's stages before attribution (porch_jax/opod/fork.py): what it takes, how
(weights linked, records copied), what it leaves behind, and the sources it refuses. The miniature pipeline runs a
fork end to end in tests/test_pipeline.py."""

from __future__ import annotations

import dataclasses
import os

import pytest

from experiments.quickstart import get_config
from porch_jax.opod.config import ExperimentConfig
from porch_jax.opod.experiment import NEW_KEY_DEFAULTS
from porch_jax.opod.fork import fork
from porch_jax.typed_config import ConfigError, RunDirError, claim_run_dir, from_dict


def _config(run_dir, **changes) -> ExperimentConfig:
    config = get_config()
    config.run_dir = str(run_dir)
    return dataclasses.replace(from_dict(ExperimentConfig, config), **changes)


def _source(tmp_path) -> tuple[ExperimentConfig, dict[str, bytes]]:
    """A finished source run: its config record and a file of every kind, before and after attribution."""
    cfg = _config(tmp_path / "source")
    claim_run_dir(cfg.run_dir, cfg)
    files = {
        "expert.jsonl": b'{"episode": 1}\n',
        "init/model.safetensors": b"initial weights",
        "sft/export/policy.json": b'{"view": "dsl"}',
        "sft/export/model.safetensors": b"sft weights",
        "sft/checkpoints/8/state": b"sft state",
        "sft/metrics.jsonl": b'{"step": 1}\n',
        "sft_lr0.001/metrics.jsonl": b'{"step": 1}\n',
        "sft_selection.json": b'{"learning_rate": 0.003}',
        "sft_loss.png": b"png",
        "rollouts.jsonl": b'{"episode": 2}\n',
        "eval/sft.jsonl": b'{"episode": 3}\n',
        "eval/expert.jsonl": b'{"episode": 4}\n',
        "jax_cache/program": b"compiled",
        # after the SFT policy's rollouts: the fork computes these again
        "attribution.jsonl": b'{"flag": true}\n',
        "opod/export/policy.json": b"{}",
        "eval/opod.jsonl": b'{"episode": 5}\n',
        "results.md": b"| sft |",
        "stages.jsonl": b'{"stage": "train sft"}\n',
    }
    for name, data in files.items():
        path = tmp_path / "source" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return cfg, files


def test_a_fork_takes_the_stages_before_attribution_links_weights_and_copies_records(tmp_path):
    source, files = _source(tmp_path)
    attribution = dataclasses.replace(source.attribution, retries=source.attribution.retries + 1)
    cfg = _config(tmp_path / "fork", fork_from=source.run_dir, attribution=attribution, methods=("sft", "opod"))
    taken = fork(cfg, defaults=NEW_KEY_DEFAULTS)
    assert taken and all(p.is_relative_to(source.run_dir) for p in taken)
    src, dst = tmp_path / "source", tmp_path / "fork"
    after = {"attribution.jsonl", "opod/export/policy.json", "eval/opod.jsonl", "results.md", "stages.jsonl"}
    for name, data in files.items():
        assert (dst / name).exists() == (name not in after), name
        if name in after:
            continue
        assert (dst / name).read_bytes() == data
        linked = os.stat(dst / name).st_ino == os.stat(src / name).st_ino
        assert linked == (not name.endswith((".jsonl", ".json"))), name  # records are the fork's own copies
    (dst / "rollouts.jsonl").write_text("appended by the fork\n")
    assert (src / "rollouts.jsonl").read_bytes() == files["rollouts.jsonl"]  # no write of the fork reaches the source

    claim_run_dir(cfg.run_dir, cfg)  # the fork's pipeline records its config
    (src / "expert.jsonl").write_text("changed after the fork\n")
    assert fork(cfg, defaults=NEW_KEY_DEFAULTS) == []  # a rerun resumes the fork; it is not forked again
    assert (dst / "expert.jsonl").read_bytes() == files["expert.jsonl"]


def test_a_fork_of_another_sft_or_an_unfinished_run_is_refused_naming_why(tmp_path):
    source, _ = _source(tmp_path)
    other_sft = dataclasses.replace(source.sft, steps=source.sft.steps + 1)
    with pytest.raises(RunDirError, match=r"config.fork_from .*another config \(sft\.steps: "):
        fork(_config(tmp_path / "a", fork_from=source.run_dir, sft=other_sft), defaults=NEW_KEY_DEFAULTS)
    with pytest.raises(RunDirError, match=r"another config \(seed: "):
        fork(_config(tmp_path / "b", fork_from=source.run_dir, seed=source.seed + 1), defaults=NEW_KEY_DEFAULTS)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # nothing taken

    (tmp_path / "source" / "sft" / "export" / "policy.json").unlink()
    with pytest.raises(RunDirError, match=r"SFT has not finished \(no sft/export/policy.json\)"):
        fork(_config(tmp_path / "c", fork_from=source.run_dir), defaults=NEW_KEY_DEFAULTS)
    with pytest.raises(RunDirError, match="holds no run of this experiment"):
        fork(_config(tmp_path / "d", fork_from=str(tmp_path / "nowhere")), defaults=NEW_KEY_DEFAULTS)
    with pytest.raises(RunDirError, match="is the run directory itself"):
        fork(_config(tmp_path / "e", fork_from=str(tmp_path / "e")), defaults=NEW_KEY_DEFAULTS)


def test_a_fork_takes_one_seed_set():
    config = get_config()
    config.fork_from, config.seed_sets = "runs/source", (0, 1)
    with pytest.raises(ConfigError, match="config.fork_from: forks one run directory"):
        from_dict(ExperimentConfig, config)
