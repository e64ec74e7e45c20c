"""Page extraction: fetch a URL, turn HTML into readable text, keep what answers the query.

AOrchestra's extractor is a reader followed by LLM extraction for a query. Here the reader is
``text.html_to_text`` (the one search also reads pages with); the query step ranks paragraphs by term
overlap and, when a ``summarize(query, text)`` callable is given (an LLM call), hands it the best passages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from porch_jax.envs.gaia.text import Page, html_to_text, tokens


class PageFetcher(Protocol):
    def fetch(self, url: str) -> str: ...


class CorpusFetcher:
    """Serves pages of a local corpus; an unknown URL is a 404, as on the web."""

    def __init__(self, pages: Sequence[Page]):
        self._pages = {p.url: p.html for p in pages}

    def fetch(self, url: str) -> str:
        if url not in self._pages:
            raise LookupError(f"404 Not Found: {url}")
        return self._pages[url]


class HTTPFetcher:
    """Live pages over HTTP(S) (needs network)."""

    def __init__(self, timeout_s: float = 20.0, max_bytes: int = 2_000_000):
        self.timeout_s, self.max_bytes = timeout_s, max_bytes

    def fetch(self, url: str) -> str:
        import httpx2 as httpx

        r = httpx.get(url, timeout=self.timeout_s, follow_redirects=True, headers={"User-Agent": "porch-jax"})
        r.raise_for_status()
        return r.text[: self.max_bytes]


def passages_for(text: str, query: str, max_chars: int = 1500) -> str:
    """The paragraphs that share the most terms with ``query``, in page order, within ``max_chars``
    (the page's opening when none shares any)."""
    paragraphs = [p for p in text.split("\n") if p.strip()]
    q = set(tokens(query))
    overlap = [len(q & set(tokens(p))) for p in paragraphs]
    ranked = sorted((i for i in range(len(paragraphs)) if overlap[i]), key=lambda i: (-overlap[i], i)) or range(
        len(paragraphs)
    )
    keep, size = [], 0
    for i in ranked:
        if size + len(paragraphs[i]) > max_chars and keep:
            break
        keep.append(i)
        size += len(paragraphs[i])
    return "\n".join(paragraphs[i] for i in sorted(keep))


def extract(
    fetcher: PageFetcher,
    url: str,
    query: str = "",
    max_chars: int = 1500,
    summarize: Callable[[str, str], str] | None = None,
) -> str:
    """Readable content of ``url``, narrowed to ``query`` when one is given."""
    text = html_to_text(fetcher.fetch(url))
    if not query:
        return text[:max_chars]
    best = passages_for(text, query, max_chars)
    return summarize(query, best) if summarize is not None else best
