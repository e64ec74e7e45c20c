"""SWE-bench grading through the ``swebench`` package: on the official images when a docker engine is
reachable, else locally on a repository checkout (``uses_docker`` decides).

Local: a fresh checkout at the base commit, the model patch applied as swebench's harness does, then
an eval script in swebench's shape (test files reset, test patch applied, test command between the
start/end markers, its exit code recorded) run in the sandbox; ``make_test_spec``, the named log
parser and ``get_eval_report`` turn its log into the resolved verdict, exactly as for a docker run.
The checkout's Python must be able to run the tests (``env`` gives its PATH).

Docker: ``grade_docker`` writes the predictions JSONL (``write_predictions``) and runs swebench's
official harness command line (``harness_argv``: ``python -m swebench.harness.run_evaluation``) in a
subprocess, then reads the per-instance reports it writes. A subprocess, not ``run_instances`` in this
process: the harness raises the process's open-file limit and writes its logs relative to its working
directory, and the command line is the interface swebench documents. The harness (5.0.2) builds each
test spec from the dataset row's ``image``, ``eval_script``, ``log_parser`` and ``eval_type``, so the
dataset it is given must carry them (the hub dataset in that format, or a .json/.jsonl of such rows).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swebench.harness.constants import (
    APPLY_PATCH_FAIL,
    APPLY_PATCH_PASS,
    END_TEST_OUTPUT,
    LOG_INSTANCE,
    LOG_REPORT,
    LOG_TEST_OUTPUT,
    RUN_EVALUATION_LOG_DIR,
    START_TEST_OUTPUT,
)
from swebench.harness.grading import get_eval_report
from swebench.harness.utils import make_test_spec

from porch_jax.envs.sandbox import Limits, run_command
from porch_jax.envs.swe.instances import GRADERS, HUB_NAME, Grader, SWEInstance
from porch_jax.envs.swe.repo import apply_patch, checkout

DEFAULT_TEST_CMD = "python -m pytest -rA -p no:cacheprovider {tests}"
GRADING_LIMITS = Limits(
    wall_s=1800.0, cpu_s=1800, memory_mb=8192, max_processes=256, max_file_mb=512, max_open_files=1024
)
MODEL_NAME = "porch"  # the predictions' model_name_or_path, which names the harness's log folder
HARNESS_MODULE = "swebench.harness.run_evaluation"


@dataclass(frozen=True)
class GradeReport:
    instance_id: str
    resolved: bool
    patch_applied: bool
    tests_status: dict[str, Any] = field(default_factory=dict)
    log: str = ""


def patched_files(test_patch: str) -> list[str]:
    """Files the test patch touches (reset before and after the run, as swebench's scripts do)."""
    return sorted(set(re.findall(r"^diff --git a/(\S+) b/", test_patch, re.MULTILINE)))


def eval_script(instance: SWEInstance, test_cmd: str = DEFAULT_TEST_CMD) -> str:
    """The eval script for one instance; ``{tests}`` in ``test_cmd`` becomes the test files."""
    files = " ".join(shlex.quote(f) for f in patched_files(instance.test_patch))
    reset = f"git checkout {instance.base_commit} -- {files}" if files else ":"
    return "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            reset,
            "git apply --verbose - <<'EOF_PORCH_TEST_PATCH'",
            instance.test_patch.rstrip("\n"),
            "EOF_PORCH_TEST_PATCH",
            f"echo '{START_TEST_OUTPUT}'",
            test_cmd.format(tests=files),
            f"echo '{END_TEST_OUTPUT}'",
            reset,
            "",
        ]
    )


def grade_local(
    instance: SWEInstance,
    model_patch: str,
    source: str | Path,
    *,
    test_cmd: str = DEFAULT_TEST_CMD,
    log_parser: str = "parse_log_pytest",
    env: Mapping[str, str] | None = None,
    limits: Limits = GRADING_LIMITS,
) -> GradeReport:
    """Grade ``model_patch`` for ``instance`` on a fresh checkout of ``source`` (a repository path or URL)."""
    if not instance.gradable:
        raise ValueError(
            f"{instance.instance_id}: no test_patch/FAIL_TO_PASS to grade with (a partial instance: "
            "instances.load_full merges in the hub's fields)"
        )
    spec = make_test_spec(
        {
            "instance_id": instance.instance_id,
            "image": "",
            "repo": instance.repo,
            "version": instance.version,
            "FAIL_TO_PASS": list(instance.fail_to_pass),
            "PASS_TO_PASS": list(instance.pass_to_pass),
            "log_parser": log_parser,
            "eval_type": "pass_and_fail",
            "eval_script": eval_script(instance, test_cmd),
        }
    )
    with tempfile.TemporaryDirectory(prefix="porch_swe_grade_") as tmp:
        repo = checkout(source, instance.base_commit, Path(tmp, "repo"))
        applied, apply_log = apply_patch(repo, model_patch)
        log = f"{apply_log}\n{APPLY_PATCH_PASS if applied else APPLY_PATCH_FAIL}\n"
        if applied:
            Path(repo, ".porch_eval.sh").write_text(spec.eval_script)
            run = run_command(["bash", ".porch_eval.sh"], str(repo), limits, env=env)
            log += run.stdout + run.stderr + ("\n>>>>> Tests Timed Out\n" if run.timed_out else "")
        log_path = Path(tmp, "test_output.txt")
        log_path.write_text(log)
        prediction = {"instance_id": instance.instance_id, "model_name_or_path": "porch", "model_patch": model_patch}
        report = get_eval_report(spec, prediction, str(log_path), include_tests_status=True)[instance.instance_id]
    return GradeReport(
        instance.instance_id,
        bool(report["resolved"]),
        bool(report["patch_successfully_applied"]),
        report.get("tests_status", {}),
        log,
    )


def uses_docker(grader: Grader) -> bool:
    """Whether ``grader`` grades on the official images: "docker" always, "auto" when an engine answers."""
    if grader not in GRADERS:
        raise ValueError(f"grader must be one of {GRADERS}, got {grader!r}")
    return grader == "docker" or (grader == "auto" and docker_available())


def docker_available(timeout_s: float = 10.0) -> bool:
    """Whether a docker engine answers: ``docker info`` succeeds where the CLI is installed, else the engine's
    unix socket (``$DOCKER_HOST`` or /var/run/docker.sock, the one the harness's docker client uses) answers
    a ping. A socket file alone is not enough: a stopped engine leaves it behind."""
    cli = shutil.which("docker")
    if cli is None:
        return _socket_answers(_docker_socket(), timeout_s)
    try:
        return subprocess.run([cli, "info"], capture_output=True, timeout=timeout_s).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _docker_socket() -> str | None:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    return host.removeprefix("unix://") if host.startswith("unix://") else None


def _socket_answers(path: str | None, timeout_s: float) -> bool:
    if path is None:  # a tcp:// or ssh:// engine: only the CLI knows how to reach it
        return False
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(timeout_s)
            s.connect(path)
            s.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
            return s.recv(64).split(b" ")[1:2] == [b"200"]
    except OSError:
        return False


def write_predictions(path: str | Path, patches: Mapping[str, str]) -> Path:
    """The harness's predictions file: one JSON row {instance_id, model_name_or_path, model_patch} a line."""
    path = Path(path)
    with open(path, "w", encoding="utf-8") as f:
        for instance_id, patch in patches.items():
            row = {"instance_id": instance_id, "model_name_or_path": MODEL_NAME, "model_patch": patch}
            f.write(json.dumps(row) + "\n")
    return path


def harness_argv(
    predictions_path: str | Path,
    instance_ids: Sequence[str],
    run_id: str,
    *,
    dataset_name: str = HUB_NAME,
    split: str = "test",
    max_workers: int = 4,
    timeout_s: int = 1800,
    report_dir: str | Path = ".",
) -> list[str]:
    """The official harness's command line for these instances (its flags as swebench 5.0.2 defines them)."""
    return [
        sys.executable,
        "-m",
        HARNESS_MODULE,
        "--dataset_name",
        dataset_name,
        "--split",
        split,
        "--predictions_path",
        str(predictions_path),
        "--max_workers",
        str(max_workers),
        "--timeout",
        str(timeout_s),
        "--run_id",
        run_id,
        "--report_dir",
        str(report_dir),
        "--instance_ids",
        *instance_ids,
    ]


def grade_docker(
    patches: Mapping[str, str],
    *,
    run_id: str | None = None,
    run_dir: str | Path | None = None,
    dataset_name: str = HUB_NAME,
    split: str = "test",
    max_workers: int = 4,
    timeout_s: int = 1800,
) -> dict[str, GradeReport]:
    """Official grading of {instance_id: patch} on the SWE-bench images (needs a docker engine).

    The harness runs in ``run_dir`` (its predictions, logs and summary report stay there; default: a temporary
    folder, deleted afterwards) under a fresh ``run_id`` unless one is given: it skips instances that already
    have a report under that id, so reusing one would return an earlier patch's verdict. An instance it ran
    without a report (the patch did not apply, an image was missing) is unresolved, its log in the report.
    Raises RuntimeError when the harness itself fails (no dataset, no engine)."""
    run_id = run_id or f"porch-{secrets.token_hex(6)}"
    with tempfile.TemporaryDirectory(prefix="porch_swe_docker_") as tmp:
        where = Path(run_dir or tmp).resolve()
        where.mkdir(parents=True, exist_ok=True)
        predictions = write_predictions(where / f"{run_id}.predictions.jsonl", patches)
        argv = harness_argv(
            predictions,
            list(patches),
            run_id,
            dataset_name=dataset_name,
            split=split,
            max_workers=max_workers,
            timeout_s=timeout_s,
            report_dir=where,
        )
        done = subprocess.run(argv, cwd=where, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"the SWE-bench harness failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
        return {i: _harness_report(where / RUN_EVALUATION_LOG_DIR / run_id / MODEL_NAME / i, i) for i in patches}


def _harness_report(log_dir: Path, instance_id: str) -> GradeReport:
    """One instance's verdict from the folder the harness wrote for it."""
    logs = [log_dir / name for name in (LOG_INSTANCE, LOG_TEST_OUTPUT)]
    log = "\n".join(p.read_text(errors="replace") for p in logs if p.exists()) or "no log (it skips empty patches)"
    if not (log_dir / LOG_REPORT).exists():
        return GradeReport(instance_id, False, APPLY_PATCH_FAIL not in log, {}, log)
    report = json.loads((log_dir / LOG_REPORT).read_text())[instance_id]
    return GradeReport(
        instance_id,
        bool(report["resolved"]),
        bool(report["patch_successfully_applied"]),
        report.get("tests_status", {}),
        log,
    )
