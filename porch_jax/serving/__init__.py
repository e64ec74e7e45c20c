"""vLLM serving: start a server for a model folder, push new weights into it, check it serves them.

``weights`` (JAX and our models) is imported lazily, so ``server`` works without them.
"""

from typing import Any

from porch_jax.serving.architectures import (
    EXPORTED_ARCHITECTURES,
    ArchitectureError,
    check_vllm_architecture,
    registered_architectures,
)
from porch_jax.serving.folder import (
    FolderError,
    check_folder,
    check_same_model,
    check_same_tokenizer,
    folder_identity,
)
from porch_jax.serving.server import ServerConfig, ServerError, VLLMServer, cpu_python, free_port, vllm_cpu_missing

_WEIGHTS = ("WeightSync", "WeightSyncError", "check_weights_folder", "export_for_serving", "model_prompt_logprobs")
__all__ = [
    "folder_identity",
    "FolderError",
    "EXPORTED_ARCHITECTURES",
    "ArchitectureError",
    "ServerConfig",
    "ServerError",
    "VLLMServer",
    "WeightSync",
    "WeightSyncError",
    "check_folder",
    "check_same_model",
    "check_same_tokenizer",
    "check_vllm_architecture",
    "check_weights_folder",
    "cpu_python",
    "export_for_serving",
    "free_port",
    "model_prompt_logprobs",
    "registered_architectures",
    "vllm_cpu_missing",
]


def __getattr__(name: str) -> Any:
    if name in _WEIGHTS:
        from porch_jax.serving import weights

        return getattr(weights, name)
    raise AttributeError(name)
