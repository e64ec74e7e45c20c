"""Evaluate a policy on a benchmark: an Orbax step of any run, a Hugging Face folder, or a provider endpoint.

    python -m launch.eval --config=experiments/eval_benchmarks.py:gaia \\
        --config.policy.kind=hf --config.policy.path=$(python -m porch_jax.models.smollm2)
    python -m launch.eval --config=experiments/eval_benchmarks.py:gaia2 \\
        --config.policy.kind=orbax --config.policy.path=runs/opod_smollm2/opod --config.runs=3
    python -m launch.eval --config=experiments/eval_benchmarks.py:taskcraft \\
        --config.orchestrator.model=gpt-4.1 --config.orchestrator.provider=openai

An ``hf`` or ``orbax`` policy is served by vLLM for the run (an Orbax step is exported to ``OUT/policy`` first,
once), and the orchestrator endpoint points at that server (its key is made here and never written); sub-agents run
on ``executor`` (empty: the same endpoint). The run directory records its config: a rerun resumes (only the
unfinished (task, run) pairs play), a rerun with another config is refused naming the keys that differ. Results:
``OUT/results.json``, ``results.md``, ``success.png``; episodes in ``OUT/episodes.jsonl`` (``launch/view.py``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
from contextlib import ExitStack
from pathlib import Path

from absl import app

from porch_jax.backends.spec import EndpointSpec
from porch_jax.eval.benchmark_eval import BenchmarkEvalConfig, run_benchmark
from porch_jax.typed_config import claim_run_dir, define_config_flag

_CONFIG = define_config_flag(
    "config", BenchmarkEvalConfig, "Experiment file (experiments/eval_benchmarks.py:BENCHMARK).", required=True
)
SERVED_KEY_ENV = "PORCH_EVAL_SERVED_KEY"  # the key of the server this launcher starts, for the child processes


def policy_folder(cfg: BenchmarkEvalConfig) -> Path:
    """The folder to serve: the hf folder, or the Orbax step exported once into OUT/policy."""
    source = cfg.policy
    if source.kind == "hf":
        if source.path:
            return Path(source.path)
        from porch_jax.models.smollm2 import smollm2_folder

        return Path(smollm2_folder())
    from launch.export import export_step, run_tokenizer

    trainer = Path(source.path)
    is_run = (trainer / "checkpoints").is_dir()
    checkpoints = trainer / "checkpoints" if is_run else trainer
    out = Path(cfg.out_dir, "policy" if not source.step else f"policy_step{source.step}")
    if not (out / "config.json").exists():
        tokenizer = run_tokenizer(trainer if is_run else None, source.tokenizer or None)
        export_step(checkpoints, out, step=source.step or None, tokenizer=tokenizer)
    return out


def served_endpoint(cfg: BenchmarkEvalConfig, stack: ExitStack) -> EndpointSpec:
    """The orchestrator endpoint of the run: as configured, or a vLLM server started on the policy's folder."""
    if not cfg.policy.served:
        return cfg.orchestrator
    from porch_jax.serving import VLLMServer, check_folder

    folder = check_folder(policy_folder(cfg))
    key = secrets.token_hex(16)
    os.environ[SERVED_KEY_ENV] = key  # the ARE child reads it from its environment, never from a flag or a file
    server = stack.enter_context(VLLMServer(folder, Path(cfg.out_dir, "server"), api_key=key, config=cfg.policy.serve))
    print(f"[eval] serving {folder} at {server.base_url} (ready in {server.startup_s:.0f} s)", flush=True)
    return dataclasses.replace(
        cfg.orchestrator,
        model=server.model,
        urls=(server.base_url,),
        provider="vllm",
        api_key_env=SERVED_KEY_ENV,
        tools_in_prompt=cfg.policy.tools_in_prompt,
    )


def main(argv: list[str]) -> None:
    del argv
    cfg = _CONFIG.value
    claim_run_dir(cfg.out_dir, cfg, file="eval_config.json")
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    with ExitStack() as stack:
        results = run_benchmark(cfg, served_endpoint(cfg, stack))
    print(Path(cfg.out_dir, "results.md").read_text())
    print(json.dumps({"out_dir": cfg.out_dir, "rows": len(results["rows"])}))


if __name__ == "__main__":
    app.run(main)
