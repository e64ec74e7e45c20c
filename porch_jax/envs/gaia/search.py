"""Web search behind a provider interface; an offline corpus provider for tests and CI.

``CorpusSearch`` ranks a fixed set of pages with BM25 over title + text, so search behaviour
(ranking, snippets, no result) is deterministic offline. ``SerperSearch`` is a live provider
(google.serper.dev, the API key from ``$SERPER_API_KEY``); any object with ``search`` fits.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from porch_jax.envs.gaia.text import Page, html_to_text, tokens


@dataclass(frozen=True)
class SearchHit:
    title: str
    url: str
    snippet: str


class SearchProvider(Protocol):
    def search(self, query: str, k: int = 5) -> list[SearchHit]: ...


class CorpusSearch:
    """BM25 (k1=1.5, b=0.75) over a local corpus of pages."""

    def __init__(self, pages: Sequence[Page], k1: float = 1.5, b: float = 0.75):
        self.pages, self.k1, self.b = list(pages), k1, b
        self._texts = [html_to_text(p.html) for p in self.pages]
        self._docs = [Counter(tokens(f"{p.title} {t}")) for p, t in zip(self.pages, self._texts, strict=True)]
        self._avg = sum(sum(d.values()) for d in self._docs) / max(1, len(self._docs))
        df = Counter(term for d in self._docs for term in d)
        n = len(self._docs)
        self._idf = {t: math.log(1 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}

    def _score(self, doc: Counter, query: list[str]) -> float:
        length = sum(doc.values())
        return sum(
            self._idf.get(t, 0.0)
            * doc[t]
            * (self.k1 + 1)
            / (doc[t] + self.k1 * (1 - self.b + self.b * length / self._avg))
            for t in query
            if t in doc
        )

    def search(self, query: str, k: int = 5) -> list[SearchHit]:
        q = tokens(query)
        ranked = sorted(((self._score(d, q), i) for i, d in enumerate(self._docs)), key=lambda x: (-x[0], x[1]))
        return [
            SearchHit(self.pages[i].title, self.pages[i].url, self._snippet(self._texts[i], q))
            for score, i in ranked[:k]
            if score > 0
        ]

    @staticmethod
    def _snippet(text: str, query: list[str], width: int = 160) -> str:
        low, at = text.lower(), -1
        for term in query:
            at = low.find(term)
            if at >= 0:
                break
        start = max(0, at - width // 4) if at >= 0 else 0
        return text[start : start + width].strip()


class SerperSearch:
    """Google results through serper.dev (live; needs network and an API key)."""

    def __init__(self, api_key: str | None = None, timeout_s: float = 20.0):
        self.api_key, self.timeout_s = api_key or os.environ.get("SERPER_API_KEY", ""), timeout_s

    def search(self, query: str, k: int = 5) -> list[SearchHit]:
        import httpx2 as httpx

        r = httpx.post(
            "https://google.serper.dev/search",
            json={"q": query, "num": k},
            timeout=self.timeout_s,
            headers={"X-API-KEY": self.api_key},
        )
        r.raise_for_status()
        return [
            SearchHit(o.get("title", ""), o.get("link", ""), o.get("snippet", ""))
            for o in r.json().get("organic", [])[:k]
        ]
