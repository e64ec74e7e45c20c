"""The sandbox confines untrusted code: limits hold, and ordinary programs still run normally."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from porch_jax.envs.sandbox import TMPFS_POINTS, Limits, _paths_under, run_python

FAST = Limits(wall_s=3.0, cpu_s=2, memory_mb=256)


def test_runs_code_in_a_fresh_dir_with_an_empty_environment():
    os.environ["PORCH_SANDBOX_SECRET"] = "leak"
    try:
        result = run_python(
            "import os, sys\nprint(os.getcwd())\nprint(sorted(os.environ))\nprint(sys.stdin.read())",
            FAST,
            stdin="from stdin",
            files={"data.txt": "x"},
        )
    finally:
        del os.environ["PORCH_SANDBOX_SECRET"]
    assert result.ok, result.stderr
    cwd, env, stdin = result.stdout.splitlines()
    assert "PORCH_SANDBOX_SECRET" not in env and env in ("[]", "['LC_CTYPE']")  # CPython may set LC_CTYPE itself
    assert stdin == "from stdin"
    assert os.path.basename(cwd).startswith("porch_sandbox_") and not os.path.exists(cwd)


def test_failing_code_reports_its_exit_status_and_stderr():
    result = run_python("raise SystemExit(3)", FAST)
    assert result.returncode == 3 and not result.ok
    result = run_python("assert 1 == 2, 'boom'", FAST)
    assert not result.ok and "boom" in result.stderr


def test_infinite_loop_is_stopped():
    start = time.monotonic()
    result = run_python("while True:\n    pass\n", Limits(wall_s=2.0, cpu_s=1, memory_mb=256))
    assert not result.ok
    assert result.timed_out or result.returncode < 0  # wall-clock kill or SIGXCPU/SIGKILL from RLIMIT_CPU
    assert time.monotonic() - start < 10


def test_sleeping_code_hits_the_wall_clock_limit():
    result = run_python("import time\ntime.sleep(60)\n", Limits(wall_s=1.0, cpu_s=5, memory_mb=256))
    assert result.timed_out and result.returncode is None and result.wall_s < 10


def test_memory_hog_fails_fast():
    result = run_python(
        "x = bytearray(2 * 1024 ** 3)\nprint('allocated')\n", Limits(wall_s=10.0, cpu_s=5, memory_mb=256)
    )
    assert not result.ok and not result.timed_out
    assert "allocated" not in result.stdout and "MemoryError" in result.stderr


def test_growing_memory_hog_fails():
    result = run_python(
        "chunks = []\nwhile True:\n    chunks.append(b'x' * 10_000_000)\n", Limits(wall_s=10.0, cpu_s=5, memory_mb=256)
    )
    assert not result.ok and not result.timed_out and "MemoryError" in result.stderr


def test_output_flood_is_capped():
    result = run_python(
        "while True:\n    print('x' * 1000)\n", Limits(wall_s=5.0, cpu_s=3, memory_mb=256, max_file_mb=1)
    )
    assert not result.ok and len(result.stdout) <= 1 << 20


def test_fork_bomb_is_bounded():
    result = run_python(
        "import os\nn = 0\nfor _ in range(200):\n    try:\n        if os.fork() == 0:\n            import time; time.sleep(30)\n"
        "        n += 1\n    except OSError:\n        break\nprint(n)\n",
        Limits(wall_s=3.0, cpu_s=2, memory_mb=256, max_processes=8),
    )
    if result.process_limit_enforced:
        assert result.stdout.strip() and int(result.stdout.split()[0]) < 200


def test_network_is_unreachable_when_isolated():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        result = run_python(
            f"import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('127.0.0.1', {port}))\nprint('connected')\n",
            FAST,
        )
    finally:
        server.close()
    if result.network_isolated:
        assert "connected" not in result.stdout and not result.ok
    else:
        assert "connected" in result.stdout  # documented fallback: no namespace, host network


def _under_a_tmpfs_point(path: Path) -> bool:
    return any(str(path.resolve()).startswith(point + os.sep) for point in TMPFS_POINTS)


def test_an_interpreter_under_tmp_still_runs_inside_and_is_read_only_there(tmp_path):
    """A virtualenv in /tmp (as a new user makes one) must survive the sandbox's fresh tmpfs on /tmp: the parent
    runs from that venv, sandboxes that venv's python, and the venv is there read-only while the working
    directory, nested inside it, stays writable (the deeper bind goes on top)."""
    if not _under_a_tmpfs_point(tmp_path):
        pytest.skip(f"tmp_path {tmp_path} is not under a tmpfs point {TMPFS_POINTS}")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    work = venv / "work"
    work.mkdir()
    inner = (
        "import errno, sys\nprint(sys.prefix)\nopen('inside.txt', 'w').write('x')\n"
        "try:\n    open(sys.prefix + '/probe', 'w')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\n"
    )
    outer = (
        "import dataclasses, json, sys\nfrom porch_jax.envs.sandbox import Limits, run_command\n"
        f"r = run_command([sys.executable, '-c', {inner!r}], {str(work)!r}, Limits(wall_s=20.0, cpu_s=10))\n"
        "print(json.dumps(dataclasses.asdict(r)))\n"
    )
    done = subprocess.run([str(venv / "bin/python"), "-c", outer], capture_output=True, text=True, check=True)
    result = json.loads(done.stdout)
    if not result["filesystem_isolated"]:
        assert os.geteuid() != 0, "running as root, yet the sandbox made no private filesystem view"
        pytest.skip("no private filesystem view here (needs root), so no tmpfs hides the venv")
    assert result["returncode"] == 0, result
    assert result["stdout"].split() == [str(venv), "EROFS"]  # it ran from the venv, which it could not write
    assert str(venv) in result["bound_paths"]
    assert (work / "inside.txt").read_text() == "x" and not (venv / "probe").exists()


def test_only_paths_a_tmpfs_would_hide_are_bound_and_nested_ones_once(tmp_path):
    """A path below a tmpfs point is bound (a symlink there at its own path), one outside is not, and one inside
    another bound path is left to its parent's bind."""
    tmp, outside = tmp_path.resolve() / "tmp", tmp_path.resolve() / "outside"
    (tmp / "venv/lib").mkdir(parents=True)
    outside.mkdir()
    (tmp / "link").symlink_to(outside)
    paths = (f"{tmp}/venv", f"{tmp}/venv/lib", str(outside), f"{tmp}/link", str(tmp))
    assert _paths_under((str(tmp),), paths) == (f"{tmp}/link", f"{tmp}/venv")
