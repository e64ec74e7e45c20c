"""Checks of a Hugging Face folder before vLLM serves it or reloads weights from it, and of a policy folder against
the folder a server serves.

vLLM refuses a bad folder minutes into its start (or, on a weight reload, leaves the server half-loaded), and its
reason sits in a long log. ``check_folder`` finds the same faults first and names the file and field:
config.json parses into an object, ``model_type`` is one of the models we export and ``architectures`` names its
class, the safetensors tensors (and their index) match the shapes the config implies, the tokenizer files are
there. ``check_same_model`` and ``check_same_tokenizer`` compare a policy folder with the served one: weights
pushed into a server run in the served config, and prompts are tokenized and rendered with the served tokenizer
and chat template, so a policy trained with another of either would be served as something it is not.

JAX (for the shape check) and transformers (for the tokenizer) are imported by the functions that need them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

TOKENIZER_CONFIG = "tokenizer_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")  # one of them: the vocabulary itself
# ModelConfig fields that do not change what the served model computes
_UNSERVED_FIELDS = ("initializer_range",)


class FolderError(ValueError):
    """A model folder vLLM would refuse, or a policy folder that does not match the served one; the message names
    the folder, the file and the field."""


def read_config(path: str | Path) -> dict[str, Any]:
    """The folder's config.json as a dict; raises FolderError naming the folder or the file."""
    path = Path(path)
    if not path.is_dir():
        raise FolderError(f"{path} is not a model folder (no such directory)")
    file = path / "config.json"
    if not file.is_file():
        raise FolderError(f"{path} is not a model folder (no config.json)")
    try:
        config = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FolderError(f"{file} is not valid JSON ({e})") from e
    if not isinstance(config, dict):
        raise FolderError(f"{file} holds a JSON {type(config).__name__}, not an object of config fields")
    return config


def check_folder(path: str | Path, *, tokenizer: bool = True) -> Path:
    """`path` resolved, after checking that vLLM can load it (module docstring); `tokenizer` False: a weights-only
    folder (a reload keeps the server's tokenizer). Raises FolderError naming the file and field at fault."""
    from porch_jax.models.config import ARCHITECTURES, ConfigError
    from porch_jax.models.io import CheckpointError, check_pretrained

    path = Path(path).resolve()
    config, file = read_config(path), path / "config.json"
    model_type = config.get("model_type")
    if model_type not in ARCHITECTURES:
        raise FolderError(
            f"{file}: field 'model_type' is {model_type!r}; the models we export are {', '.join(ARCHITECTURES)}"
        )
    archs, expected = config.get("architectures"), ARCHITECTURES[model_type]
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise FolderError(
            f"{file}: field 'architectures' is {archs!r}; vLLM needs a list naming the model class ({expected!r})"
        )
    if expected not in archs:
        raise FolderError(f"{file}: field 'architectures' is {archs}, but a {model_type!r} model is {expected!r}")
    try:
        check_pretrained(path)
    except (ConfigError, CheckpointError) as e:
        raise FolderError(f"{path}: {e}") from e
    if tokenizer:
        if not (path / TOKENIZER_CONFIG).is_file():
            raise FolderError(f"{path} has no {TOKENIZER_CONFIG} (vLLM loads the tokenizer from the model folder)")
        if not any((path / name).is_file() for name in TOKENIZER_FILES):
            raise FolderError(f"{path} has no tokenizer vocabulary (one of {', '.join(TOKENIZER_FILES)})")
    return path


def check_same_model(policy: str | Path, served: str | Path) -> None:
    """Raises FolderError unless the policy folder's config.json describes the served folder's model (a reload
    puts the weights into the served config, so any difference would serve another model), naming the fields."""
    from porch_jax.models.config import ConfigError, ModelConfig

    configs = []
    for path in (policy, served):
        try:
            configs.append(dataclasses.asdict(ModelConfig.from_hf(read_config(path))))
        except ConfigError as e:
            raise FolderError(f"{Path(path) / 'config.json'}: {e}") from e
    ours, theirs = configs
    differ = [
        f"{k}: {ours[k]!r} here, {theirs[k]!r} served"
        for k in ours
        if k not in _UNSERVED_FIELDS and ours[k] != theirs[k]
    ]
    if differ:
        raise FolderError(f"{policy} is not the model {served} serves ({'; '.join(differ)})")


def folder_identity(path: str | Path) -> str:
    """The served model's identity for keys that must change with the weights (a response cache): the folder's
    name and a sha256 over every file a server reads from it (weights, configs, tokenizer, chat template)."""
    path = Path(path)
    files = sorted(
        p for p in path.iterdir() if p.is_file() and p.suffix in (".safetensors", ".json", ".jinja", ".model", ".txt")
    )
    if not any(p.suffix == ".safetensors" for p in files):
        raise FolderError(f"{path}: no .safetensors weights to identify the model by")
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode() + b"\0")
        with open(p, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return f"{path.name}@sha256:{h.hexdigest()[:16]}"


def _digest(text: str | None) -> str | None:
    return None if text is None else "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def tokenizer_fingerprint(path: str | Path) -> dict[str, Any]:
    """What a prompt's token ids depend on, from the folder's tokenizer as vLLM loads it: the vocabulary's size and
    digest, each special token with its id, and the chat template's digest (None: the folder has none)."""
    from transformers import AutoTokenizer

    path = Path(path)
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # transformers' errors for a broken or missing tokenizer vary by class
        raise FolderError(f"{path}: the tokenizer does not load ({type(e).__name__}: {e})") from e
    vocab = tok.get_vocab()
    out: dict[str, Any] = {
        "vocab_size": len(tok),
        "vocabulary": _digest(json.dumps(sorted(vocab.items()))),
        "chat_template": _digest(tok.chat_template if isinstance(tok.chat_template, str) else None),
    }
    for name, value in sorted(tok.special_tokens_map.items()):
        values = value if isinstance(value, list) else [value]
        out[name] = [f"{v} (id {vocab.get(str(v))})" for v in values]
    return out


def check_same_tokenizer(policy: str | Path, served: str | Path, *, served_fingerprint: dict | None = None) -> None:
    """Raises FolderError unless the policy folder's tokenizer and chat template are the served folder's, naming
    what differs. `served_fingerprint`: the served folder's `tokenizer_fingerprint`, where the caller keeps it."""
    ours = tokenizer_fingerprint(policy)
    theirs = served_fingerprint if served_fingerprint is not None else tokenizer_fingerprint(served)
    differ = [
        f"{key}: {ours.get(key)!r} here, {theirs.get(key)!r} served"
        for key in sorted(set(ours) | set(theirs))
        if ours.get(key) != theirs.get(key)
    ]
    if differ:
        raise FolderError(
            f"{policy} has another tokenizer or chat template than {served} serves ({'; '.join(differ)}): the server "
            "would tokenize and render its prompts differently"
        )
