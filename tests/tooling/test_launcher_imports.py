"""No launcher imports JAX while absl parses its flags.

A typo in a flag, `--help` and a config error should answer in about a second, not after JAX, transformers
and the trainer load (~10 s), and a config schema that needs JAX to be read ties every reader of it to JAX.
Each case starts a fresh interpreter, imports the launcher module, loads the experiment file a user passes it
and parses the command line as absl does before `main`; then `jax` must not be in `sys.modules`. A meta-path
hook records the stack of the first `import jax`, so a failure names the chain of our modules that pulled it in.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
LAUNCHERS = {p.stem for p in (REPO / "launch").glob("*.py") if p.stem != "__init__"}

SERVE_CONFIG = """
from ml_collections import ConfigDict

from porch_jax.serving import ServerConfig


def get_config():
    return ConfigDict({"serve": ServerConfig.config_dict()})
"""

# (launcher, experiment file or None, extra flags); every launcher appears, and every experiment file.
CASES: tuple[tuple[str, str | None, tuple[str, ...]], ...] = (
    ("attribute", "experiments/attribute_smollm2.py", ()),
    ("baseline", "experiments/smollm2_baseline.py", ()),
    ("eval", "experiments/eval_benchmarks.py", ()),
    ("eval", "experiments/eval_hosted.py", ()),
    ("export", None, ("--run_dir=/nonexistent", "--out=/nonexistent/x")),
    ("maca", "experiments/maca_synthetic.py", ()),
    ("maca", "experiments/maca_gsm_hard.py", ()),
    ("maca_table", "experiments/maca_real_agents.py", ()),
    ("maca_table", "experiments/maca_hosted_agents.py", ()),
    ("pipeline", "experiments/quickstart.py", ()),
    ("pipeline", "experiments/opod_smollm2.py", ()),
    ("pipeline", "experiments/opod_qwen3_5_9b.py", ()),
    ("rollout", "experiments/workplace_compare.py", ()),
    ("rollout", "experiments/workplace_baselines.py", ()),
    ("rollout", "experiments/workplace_baselines_hosted.py", ()),
    ("sample", None, ()),
    ("serve", "SERVE", ("--model_dir=/nonexistent", "--api_key=k")),
    ("train", "experiments/sft_tiny.py", ()),
    ("train", "experiments/opod_tiny.py", ()),
    ("view", None, ("--store=/nonexistent", "--out=/nonexistent/x")),
)

PROBE = textwrap.dedent(
    """
    import importlib, sys, traceback

    class Witness:
        stack = None
        def find_spec(self, name, path=None, target=None):
            if name == "jax" and Witness.stack is None:
                Witness.stack = [
                    f"{f.filename}:{f.lineno}" for f in traceback.extract_stack()
                    if "importlib" not in f.filename and "<frozen" not in f.filename
                ]
            return None

    sys.meta_path.insert(0, Witness())
    from absl import flags
    importlib.import_module("launch." + sys.argv[1])
    flags.FLAGS(["launch." + sys.argv[1], *sys.argv[2:]])
    if "jax" in sys.modules:
        print("jax imported while parsing flags, from:", *Witness.stack, sep="\\n  ")
        sys.exit(3)
    """
)


def _id(case: tuple[str, str | None, tuple[str, ...]]) -> str:
    launcher, experiment, _ = case
    return launcher if experiment in (None, "SERVE") else f"{launcher}-{pathlib.Path(experiment).stem}"


def test_every_launcher_and_experiment_file_has_a_case():
    assert {c[0] for c in CASES} == LAUNCHERS
    files = {f"experiments/{p.name}" for p in (REPO / "experiments").glob("*.py") if p.stem != "__init__"}
    assert {c[1] for c in CASES if c[1] not in (None, "SERVE")} == files


@pytest.mark.parametrize("case", [pytest.param(c, id=_id(c)) for c in CASES])
def test_flag_parsing_imports_no_jax(case, tmp_path):
    launcher, experiment, extra = case
    argv = list(extra)
    if experiment == "SERVE":
        (tmp_path / "serve_config.py").write_text(SERVE_CONFIG)
        argv.append(f"--config={tmp_path / 'serve_config.py'}")
    elif experiment is not None:
        argv.append(f"--config={experiment}")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, launcher, *argv], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"launch.{launcher} {' '.join(argv)}:\n{proc.stdout}{proc.stderr[-3000:]}"
