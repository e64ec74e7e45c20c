"""Web search behind a provider interface: an offline corpus provider for tests and CI, Serper for live runs.

``CorpusSearch`` ranks a fixed set of pages with BM25 over title + text, so search behaviour
(ranking, snippets, no result) is deterministic offline. ``SerperSearch`` asks google.serper.dev, its API
key read from ``$SERPER_API_KEY``; the key goes only into the request header, and errors name the variable,
never its value. Any object with ``search(query, k)`` fits ``SearchProvider``; ``search_provider`` builds
one by name, as a runner's configuration names it.
"""

from __future__ import annotations

import json
import math
import os
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from porch_jax.envs.gaia.text import Page, html_to_text, tokens

SERPER_ENDPOINT = "https://google.serper.dev/search"
SERPER_KEY_ENV = "SERPER_API_KEY"


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
    """Google results through serper.dev (live: needs network and an API key).

    It uses the standard library's HTTP client, so it needs no optional package, and it ignores proxy
    settings from the environment, as the package's other hosted calls do (``trust_env=False``).
    ``endpoint`` points it elsewhere: a local server in the tests.
    """

    def __init__(self, api_key_env: str = SERPER_KEY_ENV, timeout_s: float = 20.0, endpoint: str = SERPER_ENDPOINT):
        api_key = os.environ.get(api_key_env, "")
        if not api_key:
            raise RuntimeError(f"Serper search needs an API key in ${api_key_env}, which is unset or empty")
        self._api_key, self.timeout_s, self.endpoint = api_key, timeout_s, endpoint
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def search(self, query: str, k: int = 5) -> list[SearchHit]:
        request = urllib.request.Request(
            self.endpoint,
            data=json.dumps({"q": query, "num": k}).encode(),
            headers={"X-API-KEY": self._api_key, "Content-Type": "application/json"},
            method="POST",
        )
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                body = json.load(response)
        except urllib.error.HTTPError as e:
            detail = e.read(300).decode("utf-8", "replace").replace(self._api_key, "***")
            raise RuntimeError(f"Serper search failed: HTTP {e.code} {e.reason}: {detail}") from None
        return [
            SearchHit(o.get("title", ""), o.get("link", ""), o.get("snippet", "")) for o in body.get("organic", [])[:k]
        ]


def search_provider(name: str, pages: Sequence[Page] = ()) -> SearchProvider:
    """The provider a configuration names: "offline" (BM25 over ``pages``) or "serper" (``$SERPER_API_KEY``)."""
    if name == "offline":
        if not pages:
            raise ValueError("the offline search provider searches a corpus: pass its pages")
        return CorpusSearch(pages)
    if name == "serper":
        return SerperSearch()
    raise ValueError(f"unknown search provider {name!r}; one of 'offline', 'serper'")
