"""SWE-bench: instances, a repository tool set for sub-agents, patch extraction and grading.

Grading goes through the ``swebench`` package (5.0.2): with a docker engine, its official harness
command line on the official images (``grading.grade_docker``); without one, locally on a repository
checkout (``grading.grade_local``, ``make_test_spec``, its log parsers and ``get_eval_report``,
commands confined by ``porch_jax.envs.sandbox``). ``SWEConfig.grader`` chooses ("auto": docker when
``docker_available``). The shared instance list is partial (``missing_fields``); ``load_full`` merges
in the hub's fields.
"""

from porch_jax.envs.swe.env import SWEConfig, SWEEnvironment, SWETask
from porch_jax.envs.swe.grading import (
    GradeReport,
    docker_available,
    eval_script,
    grade_docker,
    grade_local,
    harness_argv,
    uses_docker,
    write_predictions,
)
from porch_jax.envs.swe.instances import (
    HUB_FIELDS,
    SWEInstance,
    hub_available,
    load_full,
    load_hub,
    load_verified,
    missing_fields,
)
from porch_jax.envs.swe.repo import apply_patch, checkout, extract_patch

__all__ = [
    "SWEConfig",
    "SWEEnvironment",
    "SWETask",
    "GradeReport",
    "docker_available",
    "eval_script",
    "grade_docker",
    "grade_local",
    "harness_argv",
    "uses_docker",
    "write_predictions",
    "HUB_FIELDS",
    "SWEInstance",
    "hub_available",
    "load_full",
    "load_hub",
    "load_verified",
    "missing_fields",
    "apply_patch",
    "checkout",
    "extract_patch",
]
