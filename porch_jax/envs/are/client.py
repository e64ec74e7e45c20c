"""Main-environment side of the GAIA2 adapter: run ``porch_jax.envs.are.runner`` in the ARE venv.

The venv is ``$PORCH_ARE_VENV`` or ``.venv-are`` in the repository root (``scripts/install_are.sh``).
The child imports this checkout's ``porch_jax`` (``PYTHONPATH``), so the venv's own editable install
may point anywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from porch_jax.backends.spec import EndpointSpec

REPO_ROOT = Path(__file__).resolve().parents[3]
INSTALL_HINT = "bash scripts/install_are.sh"


def are_python() -> Path | None:
    """The ARE venv's interpreter, or None when it is not installed."""
    venv = Path(os.environ.get("PORCH_ARE_VENV", REPO_ROOT / ".venv-are"))
    python = venv / "bin" / "python"
    return python if python.exists() else None


def run_gaia2(
    output_dir: str | Path,
    *,
    dataset: str | Path | None = None,
    checks: str | Path | None = None,
    scenarios: Sequence[str] = (),
    oracle: bool = False,
    system: str = "proactive",
    policy: str = "scripted_oracle",
    store: str | Path | None = None,
    orchestrator: EndpointSpec | None = None,
    executor: EndpointSpec | None = None,
    engine: Mapping[str, Any] | None = None,
    runs: int = 1,
    concurrency: int = 1,
    hub_rows: str | Path | None = None,
    timeout_s: float = 1800,
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    """Run scenarios in the ARE venv; returns the runner's summary (``success_rate``, per-scenario verdicts).

    ``runs``: each scenario N times; ``concurrency``: pairs at once; a rerun into the same ``output_dir`` plays only
    the (scenario, run) pairs without a finished verdict. ``orchestrator``/``executor``: the endpoints of policy "llm" (their API keys travel in the
    variables they name, which the child inherits; never on its command line). ``engine``: EngineConfig fields
    (a whole ``dataclasses.asdict`` or a partial mapping) over GAIA2's defaults: sampling per role, evidence kept,
    context rule, few-shot, decision cap and budgets.

    Raises ``FileNotFoundError`` when the venv is missing and ``RuntimeError`` (with the child's
    output) when the run fails.
    """
    cmd, env = gaia2_command(
        output_dir,
        dataset=dataset,
        checks=checks,
        scenarios=scenarios,
        oracle=oracle,
        system=system,
        policy=policy,
        store=store,
        orchestrator=orchestrator,
        executor=executor,
        engine=engine,
        runs=runs,
        concurrency=concurrency,
        hub_rows=hub_rows,
        extra=extra,
    )
    summary = Path(output_dir, "summary.json")
    summary.unlink(missing_ok=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=REPO_ROOT)
    if proc.returncode != 0 or not summary.exists():
        raise RuntimeError(f"GAIA2 run failed (rc {proc.returncode}): {(proc.stderr or proc.stdout)[-4000:]}")
    return json.loads(summary.read_text())


def gaia2_command(
    output_dir: str | Path,
    *,
    dataset: str | Path | None = None,
    checks: str | Path | None = None,
    scenarios: Sequence[str] = (),
    oracle: bool = False,
    system: str = "proactive",
    policy: str = "scripted_oracle",
    store: str | Path | None = None,
    orchestrator: EndpointSpec | None = None,
    executor: EndpointSpec | None = None,
    engine: Mapping[str, Any] | None = None,
    runs: int = 1,
    concurrency: int = 1,
    hub_rows: str | Path | None = None,
    extra: Sequence[str] = (),
) -> tuple[list[str], dict[str, str]]:
    """The ARE-venv command line and environment of ``run_gaia2`` (for a caller that runs it itself)."""
    python = are_python()
    if python is None:
        raise FileNotFoundError(f"no ARE virtual environment; install it with `{INSTALL_HINT}`")
    cmd = [
        str(python),
        "-m",
        "porch_jax.envs.are.runner",
        "--output_dir",
        str(output_dir),
        "--system",
        system,
        "--policy",
        policy,
        "--runs",
        str(runs),
        "--concurrency",
        str(concurrency),
        *extra,
    ]
    for role, endpoint in (("orchestrator", orchestrator), ("executor", executor)):
        if endpoint is not None:
            cmd += endpoint.flags(role)
    for flag, value in (("--dataset", dataset), ("--checks", checks), ("--store", store), ("--hub_rows", hub_rows)):
        if value is not None:
            cmd += [flag, str(value)]
    if engine:
        cmd += ["--engine", json.dumps(engine)]
    if scenarios:
        cmd += ["--scenarios", *scenarios]
    if oracle:
        cmd.append("--oracle")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    return cmd, env
