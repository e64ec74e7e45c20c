"""MACA's real-agent table from the command line (porch_jax/maca/table.py): the paper's six benchmarks x MACA, its
Table 3 ablations and the baselines, every agent one model, through one exact response cache.

    python -m launch.maca_table --config=experiments/maca_real_agents.py      # SmolLM2 served by vLLM for the run
    python -m launch.maca_table --config=experiments/maca_real_agents.py \\
        --config.agents.kind=endpoint --config.agents.model_id=Qwen2.5-7B-Instruct \\
        --config.maca.backend.endpoint.model=Qwen/Qwen2.5-7B-Instruct \\
        "--config.maca.backend.endpoint.urls=('http://host:8000',)"

An "hf" agent folder is served by vLLM for the run (its key made here and never written); the cache
(RUN_DIR/responses.jsonl) is keyed by the folder's name and weight digest, so it is never replayed for other
weights. The same command after a crash resumes: RUN_DIR/config.json refuses another config (but for
`maca.baselines`), each benchmark resumes its prior and training checkpoints, and every answer already received is
replayed from the cache. With baselines added to the config, a finished benchmark runs just those and adds their rows
(its log line names the systems that reached the model, with their calls, and the seconds they took).
Writes RUN_DIR/table.json, table.md, table.png and each benchmark's own results in RUN_DIR/<benchmark>/.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
from contextlib import ExitStack
from pathlib import Path

from absl import app

from porch_jax.backends.cache import CachedBackend
from porch_jax.maca.table import TableConfig, claim_table_dir, run_table
from porch_jax.typed_config import define_config_flag

_CONFIG = define_config_flag("config", TableConfig, "Experiment file (experiments/maca_real_agents.py).", required=True)
SERVED_KEY_ENV = "PORCH_MACA_AGENTS_KEY"  # the key of the server this launcher starts (read from the environment)


def agents_endpoint(cfg: TableConfig, stack: ExitStack) -> tuple[TableConfig, str]:
    """(the config with the agents' endpoint filled in, the model id the cache keys carry)."""
    if cfg.agents.kind == "endpoint":
        return cfg, cfg.agents.model_id
    from porch_jax.serving import VLLMServer, check_folder, folder_identity

    if cfg.agents.path:
        folder = Path(cfg.agents.path)
    else:
        from porch_jax.models.smollm2 import smollm2_folder

        folder = Path(smollm2_folder())
    folder = check_folder(folder)
    key = secrets.token_hex(16)
    os.environ[SERVED_KEY_ENV] = key
    server = stack.enter_context(VLLMServer(folder, Path(cfg.run_dir, "server"), api_key=key, config=cfg.agents.serve))
    print(f"[maca_table] serving {folder} at {server.base_url} (ready in {server.startup_s:.0f} s)", flush=True)
    endpoint = dataclasses.replace(
        cfg.maca.backend.endpoint,
        model=server.model,
        urls=(server.base_url,),
        provider="vllm",
        api_key_env=SERVED_KEY_ENV,
    )
    maca = dataclasses.replace(cfg.maca, backend=dataclasses.replace(cfg.maca.backend, endpoint=endpoint))
    cfg = dataclasses.replace(cfg, maca=maca)
    return cfg, folder_identity(folder)


def main(argv: list[str]) -> None:
    del argv
    cfg = _CONFIG.value
    claim_table_dir(cfg)  # before the server starts: another table's run directory is refused at once
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    with ExitStack() as stack:
        cfg, model_id = agents_endpoint(cfg, stack)
        backend = CachedBackend(
            cfg.maca.backend.endpoint.backend(), Path(cfg.run_dir, cfg.cache_file), model_id=model_id
        )
        stack.callback(backend.close)
        out = run_table(cfg, backend, cache_stats=backend.stats.to_dict)
    print(Path(cfg.run_dir, "table.md").read_text())
    print({"run_dir": cfg.run_dir, "benchmarks": list(out["benchmarks"]), "cache": out["cache"]})
    if "added_baselines" in out:
        print({"added_baselines": out["added_baselines"]})


if __name__ == "__main__":
    app.run(main)
