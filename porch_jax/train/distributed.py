"""Multi-process setup: jax.distributed from flags or the usual environment variables.

Must run before anything touches a JAX backend. On CPU each process gets `cpu_devices` devices
and collectives go over gloo; an initialization timeout turns a missing peer into an error
instead of a hang.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

import jax

# First variable found wins: ours, then JAX's own names.
_ENV = {
    "coordinator_address": ("PORCH_COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS"),
    "num_processes": ("PORCH_NUM_PROCESSES", "JAX_NUM_PROCESSES"),
    "process_id": ("PORCH_PROCESS_ID", "JAX_PROCESS_ID"),
}


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    timeout_s: int = 300
    cpu_devices: int | None = None

    @property
    def multi_process(self) -> bool:
        return (self.num_processes or 1) > 1


def resolve(cfg: DistributedConfig, env: Mapping[str, str] = os.environ) -> DistributedConfig:
    """Fills unset fields from the environment; checks they are complete and consistent."""
    values = {}
    for field, names in _ENV.items():
        value = getattr(cfg, field)
        if value is None:
            value = next((env[n] for n in names if env.get(n)), None)
        values[field] = value
    n = int(values["num_processes"]) if values["num_processes"] is not None else None
    pid = int(values["process_id"]) if values["process_id"] is not None else None
    out = dataclasses.replace(cfg, coordinator_address=values["coordinator_address"], num_processes=n, process_id=pid)
    if out.multi_process:
        missing = [f for f in ("coordinator_address", "process_id") if getattr(out, f) is None]
        if missing:
            raise ValueError(
                f"multi-process run ({n} processes) needs {', '.join(missing)} (flag or {_ENV[missing[0]][1]})"
            )
        if not 0 <= pid < n:
            raise ValueError(f"process_id {pid} is outside [0, {n})")
    return out


def initialize(cfg: DistributedConfig) -> DistributedConfig:
    """Sets the CPU device count and, for several processes, joins the jax.distributed group."""
    cfg = resolve(cfg)
    if cfg.cpu_devices:
        jax.config.update("jax_num_cpu_devices", int(cfg.cpu_devices))
    if cfg.multi_process:
        jax.distributed.initialize(
            coordinator_address=cfg.coordinator_address,
            num_processes=cfg.num_processes,
            process_id=cfg.process_id,
            initialization_timeout=int(cfg.timeout_s),
        )
    return cfg


def is_main() -> bool:
    return jax.process_index() == 0
