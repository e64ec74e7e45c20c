"""Keys and values of recently served token sequences, so a prompt that extends one starts from its cache.

An orchestrator's decision t + 1 is rendered from decision t's prompt, the action it sampled and the feedback that
followed: its token ids begin with those of the last request (plus the sampled tokens, wherever the chat template
renders the action as it was sampled). Prefilling that shared prefix again is most of an evaluation episode's work.
`PrefixCache` holds, per served sequence (a prompt and the tokens sampled after it), every layer's keys and values
[layers, kv_heads, tokens, head_dim]; `longest` finds the entry sharing the longest prefix with a new prompt. The
keys and values of a prefix depend only on its tokens (and the weights), so any common prefix is reusable, not only
a whole entry. Entries are evicted least recently used first, to keep the cache within `max_bytes`.

The cached arrays belong to the weights that computed them: `Sampler` clears the cache when the model's weights
change (a trainer updating them in place).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class Entry:
    tokens: np.ndarray  # int32 [n]
    k: jax.Array  # [layers, kv_heads, n, head_dim]
    v: jax.Array

    @property
    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class PrefixCache:
    """A least-recently-used map from token sequences to their keys and values, at most `max_bytes` of arrays."""

    def __init__(self, max_bytes: int):
        if max_bytes <= 0:
            raise ValueError(f"a prefix cache needs max_bytes > 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[bytes, Entry] = collections.OrderedDict()
        self.bytes = 0
        self.lookups = self.hits = self.reused_tokens = self.prompt_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, prompt: Sequence[int]) -> tuple[Entry | None, int]:
        """(the entry sharing the longest prefix with `prompt`, that length); (None, 0) when none shares any. The
        entry becomes the most recently used."""
        tokens = np.asarray(prompt, np.int32)
        best, length = None, 0
        for key, entry in self._entries.items():
            n = common_prefix(entry.tokens, tokens)
            if n > length:
                best, length = key, n
        self.lookups += 1
        self.prompt_tokens += len(tokens)
        if best is None:
            return None, 0
        self._entries.move_to_end(best)
        return self._entries[best], length

    def count(self, reused: int) -> None:
        """Records that a request reused `reused` tokens of a lookup (the sampler may reuse fewer than matched)."""
        self.hits += reused > 0
        self.reused_tokens += reused

    def put(self, tokens: Sequence[int], k: jax.Array, v: jax.Array) -> None:
        """Stores a sequence's keys and values (an entry larger than the whole cache is not stored)."""
        entry = Entry(np.asarray(tokens, np.int32), k, v)
        if entry.nbytes > self.max_bytes or not len(entry.tokens):
            return
        key = entry.tokens.tobytes()
        if key in self._entries:
            self.bytes -= self._entries.pop(key).nbytes
        self._entries[key] = entry
        self.bytes += entry.nbytes
        while self.bytes > self.max_bytes:
            self.bytes -= self._entries.popitem(last=False)[1].nbytes

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0

    def stats(self) -> dict[str, float]:
        return {
            "entries": len(self._entries),
            "bytes": self.bytes,
            "lookups": self.lookups,
            "hits": self.hits,
            "reused_tokens": self.reused_tokens,
            "prompt_tokens": self.prompt_tokens,
            "reused_fraction": self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
        }
