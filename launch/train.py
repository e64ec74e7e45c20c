"""Train an orchestrator policy: sft | rwr | opod | grpo, on one device, a mesh, or several hosts.

    python -m launch.train --config=experiments/sft_tiny.py
    python -m launch.train --config=experiments/sft_tiny.py --config.train.optimizer.learning_rate=1e-5 \\
        --config.train.method.name=rwr --cpu_devices=8 --config.train.mesh="(2,2,2)"
    # two processes (each: its own --process_id; or JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
    # JAX_PROCESS_ID in the environment)
    python -m launch.train --config=... --coordinator_address=10.0.0.1:1234 --num_processes=2 --process_id=0

A rerun with the same workdir resumes from its newest readable checkpoint; WORKDIR/config.json records the
config, and a rerun with another one is refused, naming the keys that differ. The config's schema is
porch_jax/rows/records.py `RecordsConfig`; an unknown key or a bad value is a flags error naming it.
The final weights are exported to WORKDIR/export (launch/export.py exports any other step).
"""

from __future__ import annotations

import json
from pathlib import Path

from absl import app, flags, logging

from porch_jax.rows import records
from porch_jax.train.config import ModelInit
from porch_jax.typed_config import define_config_flag

_CONFIG = define_config_flag("config", records.RecordsConfig, "Experiment config file (get_config()).", required=True)
flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-process runs).")
flags.DEFINE_integer("num_processes", None, "Number of processes (default: environment, else 1).")
flags.DEFINE_integer("process_id", None, "This process's index (default: environment).")
flags.DEFINE_integer("init_timeout_s", 300, "Seconds to wait for all processes to join.")
flags.DEFINE_integer("cpu_devices", None, "Fake CPU device count per process (local tests).")
FLAGS = flags.FLAGS


def build_model(cfg: ModelInit, vocab_size: int, mesh=None):
    """The initial model: a Hugging Face folder (model.init_from; with `mesh`, each process reads only the slices
    its devices hold) or a fresh init from model.hf."""
    import jax.numpy as jnp

    from porch_jax.models import ModelConfig, from_pretrained, init_model

    dtype = jnp.dtype(cfg.compute_dtype)
    if cfg.init_from:
        return from_pretrained(cfg.init_from, dtype=dtype, param_dtype=jnp.float32, mesh=mesh, remat=cfg.remat)
    hf = {"vocab_size": cfg.vocab_size or vocab_size} | dict(cfg.hf)
    return init_model(ModelConfig.from_hf(hf), seed=cfg.seed, dtype=dtype, param_dtype=jnp.float32, remat=cfg.remat)


def _jsonl(path: str) -> list[dict]:
    with open(path) as f:
        rows = []
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{i}: not valid JSON: {e}") from None
        return rows


def build_rows(config: records.RecordsConfig, tokenizer) -> records.MethodRows:
    """The configured method's rows from the configured record files."""
    from porch_jax.rows.decisions import hint_table, token_sources
    from porch_jax.trajectories import TrajectoryStore

    if config.train.method.name == "grpo":
        return records.method_rows(config, tokenizer, groups=_jsonl(config.data.groups))
    episodes = TrajectoryStore(config.data.trajectories).read()
    sources = token_sources(episodes)
    if sources["none"]:
        logging.warning(
            "%d of %d decisions carry no sampled token ids (a text-only provider or a scripted policy): their targets "
            "are re-tokenized from the action text",
            sources["none"],
            sum(sources.values()),
        )
    hints = hint_table(_jsonl(config.data.hints)) if config.data.hints else {}
    if config.train.method.name == "opod" and not hints:
        logging.warning("OPOD without hints: it trains as RWR (no decision to distill)")
    return records.method_rows(config, tokenizer, episodes=episodes, hints=hints)


def main(argv: list[str]) -> None:
    del argv
    config = _CONFIG.value
    records.claim_workdir(config)  # before any work: a workdir of another config is refused, naming the keys

    from porch_jax import runtime
    from porch_jax.train import distributed

    runtime.tune_malloc()  # before the first computation (porch_jax/runtime.py says why)

    distributed.initialize(
        distributed.DistributedConfig(
            coordinator_address=FLAGS.coordinator_address,
            num_processes=FLAGS.num_processes,
            process_id=FLAGS.process_id,
            timeout_s=FLAGS.init_timeout_s,
            cpu_devices=FLAGS.cpu_devices,
        )
    )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.data.tokenizer or config.model.init_from)
    from porch_jax.train.mesh import make_mesh

    rows = build_rows(config, tokenizer)  # before the model: a bad record fails fast
    logging.info(
        "%s: %d decision rows, %d OPD rows, %d GRPO groups; workdir %s",
        config.train.method.name,
        len(rows.decisions),
        len(rows.opd),
        len(rows.groups),
        Path(config.workdir).absolute(),
    )
    model = build_model(config.model, len(tokenizer), make_mesh(config.train.mesh))
    from porch_jax.envs.views import write_policy_file  # records are read in the "full" view

    records.records_trainer(
        config, model, rows, tokenizer=tokenizer, on_export=lambda folder, step: write_policy_file(folder, "full", step)
    ).run()


if __name__ == "__main__":
    app.run(main)
