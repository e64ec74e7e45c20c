"""The sandbox confines untrusted code: limits hold, and ordinary programs still run normally."""

from __future__ import annotations

import os
import socket
import time

from porch_jax.envs.sandbox import Limits, run_python

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
