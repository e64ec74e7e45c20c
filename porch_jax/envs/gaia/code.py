"""The code-execution tool (AOrchestra: python or bash, 10 s timeout) on the sandbox.

Both languages run under ``sandbox.run_python`` (fresh directory, empty environment, rlimits, no
network, private uid and filesystem view as root): bash is started from a two-line Python wrapper so
it inherits every layer of the same confinement.
"""

from __future__ import annotations

from porch_jax.envs.sandbox import Limits, run_python

CODE_LIMITS = Limits(wall_s=10.0, cpu_s=10, memory_mb=1024, max_processes=32, max_file_mb=16)
LANGUAGES = ("python", "bash")
_MAX_CHARS = 6000


def execute(language: str, code: str, limits: Limits = CODE_LIMITS) -> str:
    """Run ``code``; the observation is the exit status and the (capped) output."""
    if language not in LANGUAGES:
        return f"error: language must be one of {LANGUAGES}"
    if language == "bash":
        source = "import subprocess, sys\nsys.exit(subprocess.run(['/bin/bash', 'script.sh']).returncode)\n"
        result = run_python(source, limits, files={"script.sh": code})
    else:
        result = run_python(code, limits)
    status = f"timed out after {limits.wall_s:g}s" if result.timed_out else f"exit {result.returncode}"
    out = (result.stdout + (f"\n[stderr]\n{result.stderr}" if result.stderr.strip() else "")).strip()
    if len(out) > _MAX_CHARS:
        out = out[:_MAX_CHARS] + f"\n… ({len(out) - _MAX_CHARS} more chars)"
    return f"[{status}]\n{out}" if out else f"[{status}]"
