"""SWE-bench grading through the ``swebench`` package: locally (no docker) or on the official images.

Local: a fresh checkout at the base commit, the model patch applied as swebench's harness does, then
an eval script in swebench's shape (test files reset, test patch applied, test command between the
start/end markers, its exit code recorded) run in the sandbox; ``make_test_spec``, the named log
parser and ``get_eval_report`` turn its log into the resolved verdict, exactly as for a docker run.
The checkout's Python must be able to run the tests (``env`` gives its PATH). Docker:
``grade_docker`` hands full 5.0.2-format rows to ``swebench.harness.run_evaluation.run_instances``.
"""

from __future__ import annotations

import json
import re
import shlex
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swebench.harness.constants import APPLY_PATCH_FAIL, APPLY_PATCH_PASS, END_TEST_OUTPUT, START_TEST_OUTPUT
from swebench.harness.grading import get_eval_report
from swebench.harness.utils import make_test_spec

from porch_jax.envs.sandbox import Limits, run_command
from porch_jax.envs.swe.instances import SWEInstance
from porch_jax.envs.swe.repo import apply_patch, checkout

DEFAULT_TEST_CMD = "python -m pytest -rA -p no:cacheprovider {tests}"
GRADING_LIMITS = Limits(
    wall_s=1800.0, cpu_s=1800, memory_mb=8192, max_processes=256, max_file_mb=512, max_open_files=1024
)


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
        raise ValueError(f"{instance.instance_id}: no test_patch/FAIL_TO_PASS to grade with (partial instance)")
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


def grade_docker(
    instances: Sequence[SWEInstance],
    patches: Mapping[str, str],
    run_id: str,
    *,
    max_workers: int = 4,
    timeout_s: int = 1800,
) -> dict[str, bool]:
    """Official grading on the SWE-bench images (needs a docker engine and full 5.0.2 rows, i.e.
    ``load_hub``); returns {instance_id: resolved} from the reports the harness writes."""
    from swebench.harness.constants import LOG_REPORT, RUN_EVALUATION_LOG_DIR
    from swebench.harness.run_evaluation import run_instances

    rows = [i.to_swebench() for i in instances]
    missing = [r["instance_id"] for r in rows if not {"image", "eval_script", "log_parser"} <= set(r)]
    if missing:
        raise ValueError(f"instances without image/eval_script/log_parser (use load_hub): {missing[:5]}")
    predictions = {i: {"instance_id": i, "model_name_or_path": "porch", "model_patch": p} for i, p in patches.items()}
    run_instances(predictions, rows, max_workers, run_id, timeout_s)
    resolved = {}
    for i in patches:
        report = Path(RUN_EVALUATION_LOG_DIR, run_id, "porch", i, LOG_REPORT)
        resolved[i] = report.exists() and bool(json.loads(report.read_text())[i]["resolved"])
    return resolved
