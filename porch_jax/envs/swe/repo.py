"""Git plumbing for a task's repository checkout: fresh checkouts, patch extraction and application.

These run git as our own process (trusted, on a checkout we created); only agent- and test-written
commands go through the sandbox.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

# The order swebench's harness tries (run_evaluation.GIT_APPLY_CMDS), each on a pristine tree.
APPLY_CMDS = (
    ["git", "apply", "--verbose"],
    ["git", "apply", "--verbose", "--3way"],
    ["patch", "--batch", "--forward", "--fuzz=5", "-p1", "-i"],
)


def _git(repo: str | Path, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True, text=True, check=check)


def checkout(source: str | Path, commit: str, dest: str | Path) -> Path:
    """A fresh clone of ``source`` (a path or URL) at ``commit`` in ``dest``, with no remote to push to."""
    subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(source), str(dest)],
        check=True,
        capture_output=True,
        text=True,
    )
    _git(dest, "checkout", "--quiet", "--detach", commit)
    _git(dest, "remote", "remove", "origin", check=False)
    return Path(dest)


def extract_patch(repo: str | Path, base: str = "HEAD") -> str:
    """Every change against ``base`` as a git diff, new files included (intent-to-add in the index)."""
    _git(repo, "add", "--all", "--intent-to-add")
    return _git(repo, "-c", "core.fileMode=false", "diff", "--no-color", "--binary", base).stdout


def apply_patch(repo: str | Path, patch: str) -> tuple[bool, str]:
    """Apply ``patch`` with the first method that works; the tree is reset between attempts."""
    if not patch.strip():
        return True, "empty patch: nothing to apply"
    with tempfile.NamedTemporaryFile("w", suffix=".diff", delete=False) as f:
        f.write(patch if patch.endswith("\n") else patch + "\n")
    log = []
    for cmd in APPLY_CMDS:
        done = subprocess.run([*cmd, f.name], cwd=repo, capture_output=True, text=True)
        log.append(f"$ {' '.join(cmd)}\n{done.stdout}{done.stderr}")
        if done.returncode == 0:
            Path(f.name).unlink()
            return True, "\n".join(log)
        _git(repo, "checkout", "--", ".", check=False)
        _git(repo, "clean", "-fdq", check=False)
    Path(f.name).unlink()
    return False, "\n".join(log)
