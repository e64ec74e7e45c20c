"""SWE-bench: instances, a repository tool set for sub-agents, patch extraction and grading.

Grading goes through the ``swebench`` package (5.0.2: ``make_test_spec``, its log parsers and
``get_eval_report``): locally without docker on a repository checkout (``grading.grade_local``,
commands confined by ``porch_jax.envs.sandbox``), or with docker on the official images
(``grading.grade_docker``, needs a docker engine and the full dataset rows).
"""

from porch_jax.envs.swe.env import SWEEnvironment, SWETask
from porch_jax.envs.swe.grading import GradeReport, eval_script, grade_docker, grade_local
from porch_jax.envs.swe.instances import SWEInstance, load_hub, load_verified
from porch_jax.envs.swe.repo import apply_patch, checkout, extract_patch

__all__ = [
    "SWEEnvironment",
    "SWETask",
    "GradeReport",
    "eval_script",
    "grade_docker",
    "grade_local",
    "SWEInstance",
    "load_hub",
    "load_verified",
    "apply_patch",
    "checkout",
    "extract_patch",
]
